"""KITTI reader: both layouts, camera -> Velodyne poses, DGR pairs, ICP-refined cached ground truth,
the standard pair lists' direction and the bundled loop pair."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
from scipy.spatial import cKDTree
from scipy.spatial.transform import Rotation

from s2h_ros import paths
from s2h_ros.datasets.io import write_points
from s2h_ros.datasets.kitti import (
    PAIR_LISTS_DIR,
    SAMPLE_CALIB,
    SAMPLE_POSES,
    KittiPairs,
    KittiSequence,
    camera_to_velodyne,
    dgr_pairs,
    kitti_benchmark_pairs,
    kitti_loop_pair,
    pair_list_agreement,
    read_pair_list,
    read_poses,
    relative_transform,
    velodyne_to_camera,
    write_poses,
)

N_FRAMES = 26
STEP = 0.9  # metres per frame


def _world(rng) -> np.ndarray:
    """A static street: ground, two facades and boxes, sampled every ~0.25 m."""
    g = np.mgrid[-10:35:0.25, -8:8:0.25].reshape(2, -1).T
    ground = np.c_[g, -1.7 + 0.02 * g[:, 0:1]]
    w = np.mgrid[-10:35:0.25, -1.7:4:0.25].reshape(2, -1).T
    left, right = np.c_[w[:, 0], np.full(len(w), 8.0), w[:, 1]], np.c_[w[:, 0], np.full(len(w), -8.0), w[:, 1]]
    boxes = [rng.uniform([-5, -7, -1.7], [30, 7, -1.7]) + rng.uniform(0, 1.5, (300, 3)) for _ in range(12)]
    return np.vstack([ground, left, right, *boxes]).astype(np.float64)


def _velodyne_poses() -> np.ndarray:
    """Velodyne poses in scan 0's frame: forward with a slow yaw and a little pitch."""
    poses = np.tile(np.eye(4), (N_FRAMES, 1, 1))
    for i in range(N_FRAMES):
        poses[i, :3, :3] = Rotation.from_euler("zyx", [0.01 * i, 0.002 * i, 0.0]).as_matrix()
        poses[i, :3, 3] = [STEP * i, 0.02 * i * i / N_FRAMES, 0.01 * i]
    return poses


def _write_sequence(folder, world, velo_poses, Tr, rng, pose_file):
    (folder / "velodyne").mkdir(parents=True)
    for i, pose in enumerate(velo_poses):
        local = (world - pose[:3, 3]) @ pose[:3, :3]
        local = local[np.linalg.norm(local, axis=1) < 25.0]
        write_points(folder / "velodyne" / f"{i:06d}.bin", local, intensity=rng.uniform(0, 1, len(local)))
    write_poses(pose_file, Tr @ velo_poses @ np.linalg.inv(Tr))  # camera-0 poses P = Tr V Tr^-1
    shutil.copy(SAMPLE_CALIB, folder / "calib.txt")
    np.savetxt(folder / "times.txt", np.arange(len(velo_poses)) * 0.1 + 5.0)


@pytest.fixture(scope="module")
def street(tmp_path_factory):
    rng = np.random.default_rng(0)
    root = tmp_path_factory.mktemp("kitti")
    world, velo = _world(rng), _velodyne_poses()
    Tr = velodyne_to_camera(SAMPLE_CALIB)
    (root / "poses").mkdir()
    _write_sequence(root / "sequences" / "07", world, velo, Tr, rng, root / "poses" / "07.txt")
    single = root / "single"
    single.mkdir()
    _write_sequence(single, world, velo, Tr, rng, single / "poses.txt")
    return root, single, world, velo


def test_both_layouts_read_the_same_scans_and_poses(street):
    root, single, _, velo = street
    tree, folder = KittiSequence(root, 7), KittiSequence(single)
    assert tree.name == "07" and len(tree) == len(folder) == N_FRAMES
    np.testing.assert_allclose(tree.poses, velo, atol=1e-9)
    np.testing.assert_allclose(folder.poses, velo, atol=1e-9)
    scan = tree[3]
    assert scan.index == 3 and scan.stamp == pytest.approx(5.3) and scan.frame_id == "velodyne"
    assert scan.points.dtype == np.float32 and scan.intensity.shape == (len(scan.points),)
    np.testing.assert_array_equal(scan.points, folder[3].points)


def test_velodyne_poses_put_every_scan_onto_the_static_world(street):
    root, _, world, _ = street
    tree = cKDTree(world)
    for scan in KittiSequence(root, 7):
        in_world = scan.points @ scan.pose[:3, :3].T + scan.pose[:3, 3]
        d, _ = tree.query(in_world)
        assert d.max() < 1e-4


def test_camera_to_velodyne_is_tr_inverse_p_tr_on_real_calib():
    Tr = velodyne_to_camera(SAMPLE_CALIB)
    P = read_poses(SAMPLE_POSES)[[0, 1554]]
    V = camera_to_velodyne(P, Tr)
    np.testing.assert_allclose(V[1], np.linalg.inv(Tr) @ P[1] @ Tr)
    np.testing.assert_allclose(V[0], np.eye(4), atol=1e-6)  # KITTI writes P_0 to 7 digits
    np.testing.assert_allclose(Tr[:3, 3], [-1.198459927713e-02, -5.403984729748e-02, -2.921968648686e-01])


def test_sequence_without_poses_yields_scans_with_unknown_pose(street, tmp_path):
    _, single, _, _ = street
    shutil.copytree(single / "velodyne", tmp_path / "velodyne")
    seq = KittiSequence(tmp_path)
    assert seq.poses is None and seq[0].pose is None and seq[2].stamp == pytest.approx(0.2)


def test_bad_layouts_raise_clear_errors(street, tmp_path):
    with pytest.raises(FileNotFoundError, match="velodyne"):
        KittiSequence(tmp_path, 3)
    with pytest.raises(FileNotFoundError, match=r"KittiSequence\(root, sequence\)"):
        KittiSequence(street[0])
    _, single, _, _ = street
    shutil.copytree(single / "velodyne", tmp_path / "velodyne")
    write_poses(tmp_path / "poses.txt", np.tile(np.eye(4), (5, 1, 1)))
    with pytest.raises(ValueError, match="5 poses"):
        KittiSequence(tmp_path)
    (tmp_path / "poses.txt").write_text("1 0 0\n")
    with pytest.raises(ValueError, match="12 numbers"):
        KittiSequence(tmp_path)


def test_dgr_pairs_take_the_last_frame_within_the_distance():
    positions = np.c_[np.arange(40) * STEP, np.zeros(40), np.zeros(40)]
    # From 0 the first frame beyond 10 m is 12 (10.8 m), so the pair is (0, 11); then from 12.
    assert dgr_pairs(positions) == [(0, 11), (12, 23), (24, 35)]
    assert dgr_pairs(positions, frame_ids=np.delete(np.arange(40), 11)) == [(1, 12), (13, 24), (25, 36)]


def test_dgr_pairs_reproduce_the_standard_list_of_sequence_00():
    """The bundled train.csv rows of sequence 00 are exactly DGR's rule on the real poses."""
    camera = read_poses(SAMPLE_POSES)
    listed = [(r.source_frame, r.target_frame) for r in read_pair_list(PAIR_LISTS_DIR / "train.csv") if r.sequence == 0]
    assert len(listed) == 354
    assert dgr_pairs(camera[:, :3, 3]) == listed


def test_pair_list_transform_maps_frame1_into_frame0_on_sequence_00():
    velo = camera_to_velodyne(read_poses(SAMPLE_POSES), velodyne_to_camera(SAMPLE_CALIB))
    records = [r for r in read_pair_list(PAIR_LISTS_DIR / "train.csv") if r.sequence == 0]
    gaps = pair_list_agreement(records, velo)
    assert gaps["as_read"]["te_median_m"] < 0.2 and gaps["as_read"]["re_median_deg"] < 0.5
    assert gaps["reversed"]["te_median_m"] > 10.0


def test_pairs_are_icp_refined_from_noisy_poses_and_cached(street, tmp_path):
    root, _, _, velo = street
    noisy = root.parent / "noisy"
    shutil.copytree(root, noisy)
    camera = read_poses(noisy / "poses" / "07.txt")
    camera[20:, :3, 3] += np.array([0.08, -0.06, 0.05])  # a 0.11 m GPS-like jump at frame 20
    write_poses(noisy / "poses" / "07.txt", camera)

    pairs = KittiPairs(noisy, (7,), cache_dir=tmp_path / "icp")
    assert pairs.pairs == [(7, 0, 11), (7, 12, 23)]
    pair = pairs[1]
    truth = relative_transform(velo[12], velo[23])
    pose_error = np.linalg.norm(pair.meta["T_pose"][:3, 3] - truth[:3, 3])
    icp_error = np.linalg.norm(pair.T_gt[:3, 3] - truth[:3, 3])
    assert pose_error > 0.05 and icp_error < 0.01
    assert pair.meta["frames"] == (12, 23) and pair.source.shape[1] == 3

    cache = tmp_path / "icp" / "07_000012_000023.npz"
    stored = dict(np.load(cache))
    stored["T_gt"] = np.diag([1.0, 1.0, 1.0, 1.0])  # a marker: a reused cache returns it
    np.savez(cache, **stored)
    np.testing.assert_array_equal(KittiPairs(noisy, (7,), cache_dir=tmp_path / "icp")[1].T_gt, np.eye(4))


def test_bundled_pair_lists_parse_with_their_split_sizes():
    sizes = {split: len(read_pair_list(PAIR_LISTS_DIR / f"{split}.csv")) for split in ("train", "val", "test")}
    assert sizes == {"train": 1358, "val": 180, "test": 555}
    first = read_pair_list(PAIR_LISTS_DIR / "test.csv")[0]
    assert (first.sequence, first.source_frame, first.target_frame) == (8, 0, 14)
    assert first.T[:3, 3] == pytest.approx([-9.18163957, -0.190400289, -0.235871543])


def test_benchmark_pairs_use_frame1_as_source_on_a_kitti_tree(street, tmp_path):
    root, _, world, velo = street
    T = relative_transform(velo[0], velo[11])  # frame 0 -> frame 11, stored as csv frame0=11, frame1=0
    row = ",".join(f"{v:.10f}" for v in T[:3].ravel())
    header = "seq,frame0,frame1," + ",".join(f"T{r}{c}" for r in range(3) for c in range(4))
    (tmp_path / "test.csv").write_text(f"{header}\n7,11,0,{row}\n")
    (pair,) = kitti_benchmark_pairs(root, "test", lists_dir=tmp_path)
    assert pair.meta["frames"] == (0, 11)
    d, _ = cKDTree(pair.target).query(pair.source @ pair.T_gt[:3, :3].T + pair.T_gt[:3, 3])
    assert np.mean(d < 1e-3) > 0.3  # the shared street lands exactly


def test_unknown_split_raises(street):
    with pytest.raises(ValueError, match="unknown split"):
        KittiPairs(street[0], "holdout")


def test_loop_pair_icp_refinement_lowers_the_nn_distance():
    pair = kitti_loop_pair()
    assert pair.source.shape == (29291, 3) and pair.target.shape == (30609, 3)
    assert pair.meta["frames"] == (1554, 4534)
    assert pair.meta["median_nn_before"] > 0.8 and pair.meta["median_nn_after"] < 0.15
    moved = np.linalg.norm(pair.T_gt[:3, 3] - pair.meta["T_pose"][:3, 3])
    assert 1.0 < moved < 2.0  # raw poses are metres off on this loop, not tens of metres


def test_loop_pair_matches_the_sequence_reader_on_a_kitti_tree(tmp_path):
    """The bundled scans placed as frames 1554/4534 of a KITTI tree give the same raw-pose transform."""
    velodyne = tmp_path / "sequences" / "00" / "velodyne"
    velodyne.mkdir(parents=True)
    for frame, src in zip((1554, 4534), paths.KITTI_LOOP_PAIR):
        shutil.copy(src, velodyne / f"{frame:06d}.bin")
    shutil.copy(SAMPLE_CALIB, velodyne.parent / "calib.txt")
    (tmp_path / "poses").mkdir()
    shutil.copy(SAMPLE_POSES, tmp_path / "poses" / "00.txt")
    seq = KittiSequence(tmp_path, 0)
    a, b = seq.frame(1554), seq.frame(4534)
    np.testing.assert_allclose(relative_transform(a.pose, b.pose), kitti_loop_pair(refine=False).T_gt, atol=1e-9)
    assert a.stamp == pytest.approx(155.4)
