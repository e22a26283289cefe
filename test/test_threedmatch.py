"""3DMatch reader: gt.log/gt.info/overlap parsing, scene pairs, the bundled demo pair's direction."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.spatial import cKDTree
from scipy.spatial.transform import Rotation

from s2h_ros.datasets.io import write_points
from s2h_ros.datasets.threedmatch import (
    ThreeDMatchScene,
    read_gt_info,
    read_gt_log,
    read_gt_overlap,
    threedmatch_demo_pair,
    threedmatch_pairs,
)

SHARED_BENCHMARKS = Path("/work/shared/data/3dmatch/benchmarks")


def _transform(rng) -> np.ndarray:
    T = np.eye(4)
    T[:3, :3] = Rotation.random(random_state=rng.integers(1 << 31)).as_matrix()
    T[:3, 3] = rng.uniform(-1.0, 1.0, 3)
    return T


def _write_gt_log(path: Path, entries: dict[tuple[int, int], np.ndarray], n: int) -> None:
    with open(path, "w") as f:
        for (i, j), T in entries.items():
            f.write(f"{i}\t {j}\t {n}\t\n")
            for row in T:
                f.write("\t".join(f"{v: .8e}" for v in row) + "\t\n")


@pytest.fixture
def scene(tmp_path, rng):
    """Three fragments of one room in their own frames, gt.log (j -> i), gt.info, overlaps."""
    room = rng.uniform(0.0, 3.0, size=(3000, 3)).astype(np.float32)
    poses = [np.eye(4)] + [_transform(rng) for _ in range(2)]  # fragment k -> room frame
    folder = tmp_path / "fragments" / "kitchen"
    folder.mkdir(parents=True)
    for k, pose in enumerate(poses):
        local = (room[k * 500 : k * 500 + 2000] - pose[:3, 3]) @ pose[:3, :3]  # pose^-1 applied
        if k == 1:
            torch.save(local.astype(np.float64), folder / "cloud_bin_1.pth")  # as FCGF/Predator store them
        else:
            write_points(folder / f"cloud_bin_{k}.ply", local)
    gt_dir = tmp_path / "benchmarks" / "3DMatch" / "kitchen"
    gt_dir.mkdir(parents=True)
    entries = {(i, j): np.linalg.inv(poses[i]) @ poses[j] for i, j in ((0, 1), (0, 2), (1, 2))}
    _write_gt_log(gt_dir / "gt.log", entries, n=3)
    with open(gt_dir / "gt.info", "w") as f:
        for (i, j) in entries:
            f.write(f"{i}\t {j}\t 3\t\n")
            for row in np.eye(6) * (10 * i + j + 1):
                f.write(" ".join(f"{v:.6e}" for v in row) + "\n")
    (gt_dir / "gt_overlap.log").write_text("0,1,0.7500\n0,2,0.5000\n1,2,0.7500\n")
    return folder, gt_dir, entries


def test_gt_log_parser_reads_indices_and_transforms(scene):
    _, gt_dir, entries = scene
    parsed = read_gt_log(gt_dir / "gt.log")
    assert [(e.i, e.j, e.n_fragments) for e in parsed] == [(0, 1, 3), (0, 2, 3), (1, 2, 3)]
    for e in parsed:
        np.testing.assert_allclose(e.T, entries[(e.i, e.j)], atol=1e-7)


def test_gt_info_and_overlap_parsers(scene):
    _, gt_dir, _ = scene
    info = read_gt_info(gt_dir / "gt.info")
    np.testing.assert_array_equal(info[(1, 2)], np.eye(6) * 13)
    assert read_gt_overlap(gt_dir / "gt_overlap.log") == {(0, 1): 0.75, (0, 2): 0.5, (1, 2): 0.75}


def test_scene_pairs_map_cloud_bin_j_onto_cloud_bin_i(scene):
    folder, gt_dir, _ = scene
    pairs = list(ThreeDMatchScene(folder, gt_dir))
    assert len(pairs) == 3
    for pair in pairs:
        moved = pair.source @ pair.T_gt[:3, :3].T + pair.T_gt[:3, 3]
        d, _ = cKDTree(pair.target).query(moved)
        assert np.mean(d < 1e-4) == pytest.approx(pair.meta["overlap"])  # the shared part lands exactly
        assert pair.source.dtype == np.float32 and pair.meta["information"] is not None
    assert pairs[2].meta["i"] == 1 and pairs[2].meta["j"] == 2 and pairs[2].meta["overlap"] == 0.75


def test_threedmatch_pairs_walks_the_benchmark_layout(scene):
    folder, gt_dir, _ = scene
    pairs = list(threedmatch_pairs(folder.parent, gt_dir.parent.parent))
    assert [p.name for p in pairs] == ["3DMatch/kitchen/1_0", "3DMatch/kitchen/2_0", "3DMatch/kitchen/2_1"]


@pytest.mark.parametrize("text,match", [
    ("0 1 3\n1 0 0 0\n0 1 0 0\n0 0 1 0\n", "whole entries"),
    ("0 1 3\n1 0 0 0\n0 1 0 0\n0 0 1 0\n0 0 x 1\n", "malformed"),
    ("0 1\n1 0 0 0\n0 1 0 0\n0 0 1 0\n0 0 0 1\n", "entry"),
    ("", "empty"),
])
def test_malformed_gt_log_raises(tmp_path, text, match):
    (tmp_path / "gt.log").write_text(text)
    with pytest.raises(ValueError, match=match):
        read_gt_log(tmp_path / "gt.log")


def test_missing_gt_log_and_fragment_raise(tmp_path, scene):
    with pytest.raises(FileNotFoundError, match="gt.log"):
        read_gt_log(tmp_path / "gt.log")
    folder, gt_dir, _ = scene
    (folder / "cloud_bin_2.ply").unlink()
    with pytest.raises(FileNotFoundError, match="cloud_bin_2"):
        ThreeDMatchScene(folder, gt_dir)[1]


def test_demo_pair_gt_maps_src_into_ref():
    pair = threedmatch_demo_pair()
    assert pair.source.shape == (15953, 3) and pair.target.shape == (18977, 3)
    tree = cKDTree(pair.target)

    def close_fraction(T):
        d, _ = tree.query(pair.source @ T[:3, :3].T + T[:3, 3])
        return np.mean(d < 0.05)

    identity, forward, backward = close_fraction(np.eye(4)), close_fraction(pair.T_gt), close_fraction(np.linalg.inv(pair.T_gt))
    assert forward > 0.4 and forward > 2 * identity and backward < identity


@pytest.mark.skipif(not SHARED_BENCHMARKS.exists(), reason="shared 3DMatch benchmark files not on this machine")
def test_real_gt_logs_compose_as_j_into_i():
    """T_ij . T_jk = T_ik on the real benchmark files: the transforms map j into i."""
    checked = 0
    for log in sorted((SHARED_BENCHMARKS / "3DMatch").glob("*/gt.log"))[:3]:
        gt = {(e.i, e.j): e.T for e in read_gt_log(log)}
        for (i, j), T_ij in gt.items():
            for k in range(j + 1, j + 5):
                if (j, k) in gt and (i, k) in gt:
                    np.testing.assert_allclose(T_ij @ gt[(j, k)], gt[(i, k)], atol=1e-4)
                    checked += 1
    assert checked > 100
