"""Training: pair cache, augmentation, FCGF and inlier/S2H losses, resume, time budget, DDP."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from s2h_ros.cli import main as cli_main
from s2h_ros.datasets.types import PointCloudPair
from s2h_ros.geometry import weighted_procrustes
from s2h_ros.matching import s2h_loss
from s2h_ros.models import build_fcgf, load_dgr, load_fcgf, read_checkpoint
from s2h_ros.models.inlier import InlierNetwork
from s2h_ros.training.augment import AugmentConfig, augment_pair
from s2h_ros.training.data import (
    CacheError, CachedPair, PairCache, synthetic_training_pairs, voxelize_pair, write_pairs,
)
from s2h_ros.training.fcgf_trainer import FCGFTask, positive_pairs
from s2h_ros.training.inlier_trainer import InlierTask, initial_inlier_network
from s2h_ros.training.loop import sample_index, weights_path

ROOT = Path(__file__).resolve().parents[1]
VOXEL = 0.3


@pytest.fixture(scope="module")
def raw_pairs() -> list[PointCloudPair]:
    """Two 16-beam synthetic pairs 3-6 m apart (training seed 1000), cropped to 12 m: ~1.5k voxels a side."""
    from s2h_ros.datasets.synthetic import synthetic_pairs

    crop = lambda x: x[np.linalg.norm(x[:, :2], axis=1) < 12.0]  # noqa: E731
    return [PointCloudPair(crop(p.source), crop(p.target), p.T_gt, p.name, p.meta)
            for p in synthetic_pairs(2, 1000, min_distance=3.0, max_distance=6.0, sensor="vlp16")]


@pytest.fixture(scope="module")
def cache_dir(raw_pairs, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pair_cache")
    write_pairs(out / "train", raw_pairs, VOXEL, {"seed": 1000})
    write_pairs(out / "val", raw_pairs[:1], VOXEL)
    return out


@pytest.fixture(scope="module")
def pair(cache_dir) -> CachedPair:
    return PairCache(cache_dir / "train")[0]


def _overlap_ratio(p: CachedPair) -> float:
    return len(positive_pairs(p.source, p.target, p.T_gt, 1.5 * VOXEL)) / len(p.source)


# ------------------------------------------------------------------------------ cache


def test_cache_stores_voxelised_points_within_half_a_step_and_exact_ground_truth(raw_pairs, cache_dir):
    cache = PairCache(cache_dir / "train")
    src, tgt = voxelize_pair(raw_pairs[0], VOXEL)
    scale = VOXEL / 16
    assert len(cache) == 2 and cache.voxel == VOXEL
    assert cache[0].source.shape == src.shape and cache[0].target.shape == tgt.shape
    assert np.abs(cache[0].source - src).max() <= scale / 2 + 1e-6
    np.testing.assert_array_equal(cache[0].T_gt, raw_pairs[0].T_gt)
    # the stored clouds still overlap under T_gt (the ground truth survives quantisation)
    assert _overlap_ratio(cache[0]) > 0.3


def test_cache_reports_missing_and_corrupt_files(cache_dir, tmp_path):
    with pytest.raises(CacheError, match="missing index.json"):
        PairCache(tmp_path)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "index.json").write_text((cache_dir / "train" / "index.json").read_text())
    (broken / "pair_00000.npz").write_bytes(b"not a zip file")
    with pytest.raises(CacheError, match="cannot read cached pair"):
        PairCache(broken)


def test_training_pairs_refuse_held_out_evaluation_seeds():
    with pytest.raises(ValueError, match="held-out"):
        next(synthetic_training_pairs(5, 998, per_world=1))


def test_each_training_world_draws_its_own_sensor_family_mount_and_target_sensor():
    """The general model's cache: sensor, scene family, mount height and a second target sensor are
    drawn per world from its seed (so a cache regenerates exactly), and the pairs are rendered so."""
    from s2h_ros.training.data import draw_world

    sensors, families = ("vlp16", "os1_32", "hdl64"), ("town", "highway")
    draws = [draw_world(s, sensors, families, (0.4, 2.2), mixed=0.5) for s in range(1000, 1060)]
    assert draws == [draw_world(s, sensors, families, (0.4, 2.2), mixed=0.5) for s in range(1000, 1060)]
    assert {d.sensor for d in draws} == set(sensors) and {d.family for d in draws} == set(families)
    assert all(0.4 <= d.mount_height <= 2.2 for d in draws)
    mixed = [d for d in draws if d.target_sensor]
    assert 10 <= len(mixed) <= 40 and all(d.target_sensor != d.sensor for d in mixed)
    assert all(d.target_sensor is None for d in (draw_world(s, sensors, families) for s in range(1000, 1030)))

    world = next(s for s, d in zip(range(1000, 1060), draws) if d.target_sensor)
    pair = next(synthetic_training_pairs(1, world, per_world=1, sensor=sensors, family=families,
                                         mount_heights=(0.4, 2.2), mixed=0.5))
    want = draw_world(world, sensors, families, (0.4, 2.2), mixed=0.5)
    assert (pair.meta["sensor"], pair.meta["target_sensor"], pair.meta["family"]) == (
        want.sensor, want.target_sensor, want.family)


# ------------------------------------------------------------------------------ augmentation


def test_augmentation_keeps_the_ground_truth_exact(rng):
    src = rng.uniform(-20, 20, size=(500, 3)).astype(np.float32)
    T = np.eye(4)
    T[:3, :3] = np.array([[0.0, -1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    T[:3, 3] = [3.0, -1.0, 0.5]
    tgt = (src @ T[:3, :3].T + T[:3, 3]).astype(np.float32)
    cfg = AugmentConfig(noise_sigma=0.0, keep_min=1.0, crop_min_range=1e3, crop_max_range=1e3 + 1)
    out = augment_pair(CachedPair(src, tgt, T, "square"), rng, cfg)
    assert not np.allclose(out.source, src, atol=1.0)  # it did rotate
    moved = out.source @ out.T_gt[:3, :3].T + out.T_gt[:3, 3]
    np.testing.assert_allclose(moved, out.target, atol=1e-3)


def test_any_orientation_turns_both_clouds_away_from_gravity_but_keeps_their_relative_rotation(rng):
    """Depth-camera fragments have no known gravity: the common rotation moves each cloud's up axis
    anywhere, while the relative rotation stays the one the sensor made (here 90 deg about z)."""
    src = rng.uniform(-5, 5, size=(300, 3)).astype(np.float32)
    T = np.eye(4)
    T[:3, :3] = np.array([[0.0, -1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    tgt = (src @ T[:3, :3].T).astype(np.float32)
    cfg = AugmentConfig(max_yaw_deg=0.0, max_tilt_deg=0.0, any_orientation=True, noise_sigma=0.0, keep_min=1.0,
                        crop_min_range=1e3, crop_max_range=1e3 + 1)
    ups, angles = [], []
    for _ in range(20):
        out = augment_pair(CachedPair(src, tgt, T, "turn"), rng, cfg)
        R_side, *_ = np.linalg.lstsq(src.astype(np.float64), out.source.astype(np.float64), rcond=None)
        ups.append(R_side.T[:, 2])  # where the source's up axis went
        angles.append(np.degrees(np.arccos(np.clip((np.trace(out.T_gt[:3, :3]) - 1) / 2, -1, 1))))
        np.testing.assert_allclose(out.source @ out.T_gt[:3, :3].T + out.T_gt[:3, 3], out.target, atol=1e-3)
    np.testing.assert_allclose(angles, 90.0, atol=1e-3)
    assert min(u[2] for u in ups) < 0.0 < max(u[2] for u in ups)  # up ends below and above the horizon


def test_min_overlap_keeps_only_pairs_that_see_the_same_surfaces():
    """A depth camera that turned away sees nothing of the other view: ``min_overlap`` replaces
    such pairs with others from the same and later worlds."""
    from s2h_ros.datasets.types import overlap_ratio

    kwargs = dict(per_world=6, sensor="depth_camera", family="rooms", min_distance=0.3, max_distance=2.5)
    every = list(synthetic_training_pairs(6, 1004, **kwargs))
    kept = list(synthetic_training_pairs(6, 1004, min_overlap=0.3, **kwargs))
    assert min(overlap_ratio(p) for p in every) < 0.3  # the premise: some raw pairs hardly overlap
    assert len(kept) == 6 and all(overlap_ratio(p) >= 0.3 for p in kept)


def test_sampler_shards_every_epoch_across_ranks_without_overlap():
    n, world = 7, 2
    for epoch in range(2):
        per_rank = 4  # ceil(7 / 2)
        seen = [sample_index(epoch * per_rank + s, n, 3, r, world) for r in range(world) for s in range(per_rank)]
        assert set(seen) == set(range(n))  # all pairs, one padded repeat
    assert [sample_index(s, n, 3) for s in range(7)] != [sample_index(s, n, 4) for s in range(7)]


# ------------------------------------------------------------------------------ losses


def _fit(task, pair, steps: int, lr: float) -> tuple[float, float]:
    """Loss of a fixed sample before and after ``steps`` Adam steps on ``pair``."""
    opt = torch.optim.Adam(task.param_groups(lr))
    probe = lambda: float(task.loss(pair, np.random.default_rng(99))[0].detach())  # noqa: E731
    before = probe()
    for s in range(steps):
        loss, _ = task.loss(pair, np.random.default_rng(s))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return before, probe()


def test_fcgf_hardest_contrastive_training_lowers_the_loss(pair):
    torch.manual_seed(0)
    task = FCGFTask(build_fcgf("compact"), VOXEL, torch.device("cpu"), augment=None)
    before, after = _fit(task, pair, 8, 3e-3)
    assert after < 0.85 * before


def test_inlier_network_bce_training_lowers_the_loss(pair):
    torch.manual_seed(0)
    task = InlierTask(build_fcgf("compact").eval(), InlierNetwork("compact"), VOXEL, torch.device("cpu"),
                      loss="bce", matcher="nn", augment=None)
    before, after = _fit(task, pair, 6, 1e-2)
    assert after < before


@pytest.mark.parametrize("network", ["compact", "context"])
@pytest.mark.parametrize("kind", ["l3", "s2h", "sstep"])
def test_s2h_losses_reach_the_networks_they_train(pair, kind, network):
    """DGR's 6-D network and the shipped kind (the context network, which also reads P) alike."""
    torch.manual_seed(0)
    fcgf = build_fcgf("compact")
    task = InlierTask(fcgf, initial_inlier_network(network), VOXEL, torch.device("cpu"), loss=kind, augment=None)
    loss, logs = task.loss(pair, np.random.default_rng(0))
    loss.backward()
    assert torch.isfinite(loss) and logs["matches"] > 3
    inlier_grad = sum(float(p.grad.abs().sum()) for p in task.nets["inlier"].parameters() if p.grad is not None)
    assert inlier_grad > 0
    fcgf_grads = [p.grad for p in fcgf.parameters()]
    if kind == "l3":  # SHM_DGR: FCGF frozen
        assert all(g is None for g in fcgf_grads)
    else:  # complete loss: the descriptors learn through the S-step too
        assert sum(float(g.abs().sum()) for g in fcgf_grads if g is not None) > 0
        assert -1.0 <= logs["l1"] <= 0.0 and logs["l2"] < 0.0


@pytest.mark.parametrize("kind", ["s2h", "sstep"])
def test_trainer_loss_is_the_paper_loss_of_matching_on_dense_matrices(pair, kind):
    """The end-to-end loss of one real-geometry pair equals ``matching.s2h_loss`` of the dense
    ``M`` (the straight-through PPM, or ``P`` for sstep), the dense ground truth ``M_gt`` and the
    weighted-Procrustes motion, all rebuilt here from the trainer's own S2H result."""
    torch.manual_seed(0)
    task = InlierTask(build_fcgf("compact"), InlierNetwork("compact"), VOXEL, torch.device("cpu"), loss=kind,
                      augment=None, max_points=100_000)
    loss, logs = task.loss(pair, np.random.default_rng(0))
    # the same pair again (no augmentation, no subsampling): same features, same S2H result
    (xyz0, f0), (xyz1, f1) = task._features(pair)
    i, j, p, match = task._correspondences(f0, f1)
    n_x, n_y = len(xyz0), len(xyz1)
    P = torch.zeros(n_x, n_y, dtype=match.p.dtype)
    P[match.rows, match.cols] = match.p.detach()
    M = torch.zeros(n_x, n_y)
    M[i, j] = 1.0
    T = pair.T_gt
    moved = xyz0.numpy() @ T[:3, :3].T + T[:3, 3]
    d = np.linalg.norm(moved[:, None, :] - xyz1.numpy()[None, :, :], axis=2)  # brute force, no KD-tree
    nearest = d.argmin(1)
    has = d[np.arange(n_x), nearest] < task.inlier_distance
    M_gt = torch.zeros(n_x, n_y)
    M_gt[torch.as_tensor(np.flatnonzero(has)), torch.as_tensor(nearest[has])] = 1.0
    assert 0 < M.sum() < min(n_x, n_y) and M_gt.sum() > 0
    if kind == "sstep":
        i_soft, tgt, mass = task._virtual_correspondences(xyz1, match, n_x)
        src, w_match, M_pred = xyz0[i_soft], mass, P
    else:
        src, tgt, w_match, M_pred = xyz0[i], xyz1[j], torch.ones(len(i)), M
    w = torch.sigmoid(task._logits(src, tgt.detach(), w_match, xyz0, xyz1)) * w_match
    R, t = weighted_procrustes(src, tgt, w)
    T_t = torch.as_tensor(T, dtype=torch.float32)
    expected = s2h_loss(M_pred, M_gt, R, t, T_t[:3, :3], T_t[:3, 3])
    assert float(loss.detach()) == pytest.approx(float(expected.detach()), rel=1e-4, abs=1e-5)
    assert logs["l1"] < 0.0 and logs["l2"] < 0.0  # both terms present, the sum is not L3 alone
    # the sparse L1 counts ground-truth pairs off the support too: the dense M_gt has more than the edges hold
    on_support = float(M_gt[match.rows, match.cols].sum())
    assert on_support <= float(M_gt.sum())


def test_s_step_only_training_pairs_source_voxels_with_virtual_points():
    """sstep's correspondences: rows of P with mass >= 0.5 and their P-weighted mean target point."""
    from types import SimpleNamespace

    xyz1 = torch.tensor([[0.0, 0, 0], [2.0, 0, 0], [0.0, 4.0, 0]])
    match = SimpleNamespace(rows=torch.tensor([0, 0, 1, 2]), cols=torch.tensor([0, 1, 2, 0]),
                            p=torch.tensor([0.3, 0.6, 0.2, 0.9], requires_grad=True))
    i, virtual, mass = InlierTask._virtual_correspondences(xyz1, match, n_x=3)
    assert i.tolist() == [0, 2]  # row 1 holds only 0.2
    torch.testing.assert_close(virtual, torch.tensor([[4.0 / 3.0, 0, 0], [0.0, 0, 0]]))  # off the scan for row 0
    torch.testing.assert_close(mass, torch.tensor([0.9, 0.9]))
    virtual[0, 0].backward()
    assert match.p.grad[0] != 0 and match.p.grad[1] != 0  # L3 reaches P through the virtual points


# ------------------------------------------------------------------------------ loop via the CLI


def _train_fcgf(cache_dir, out, *extra) -> int:
    return cli_main(["train", "fcgf", "--data", str(cache_dir), "--out", str(out), "--threads", "1",
                     "--log-every", "1", "--val-every", "0", "--num-pos", "256", "--num-hn", "64", *extra])


def test_resumed_training_reaches_the_same_weights_as_an_uninterrupted_run(cache_dir, tmp_path):
    straight, split = tmp_path / "straight.pt", tmp_path / "split.pt"
    assert _train_fcgf(cache_dir, straight, "--steps", "3") == 0
    assert _train_fcgf(cache_dir, split, "--steps", "2") == 0
    assert _train_fcgf(cache_dir, split, "--steps", "3", "--resume") == 0
    a, b = read_checkpoint(straight), read_checkpoint(split)
    assert a["train_state"]["step"] == b["train_state"]["step"] == 3
    for key, value in a["state_dict"].items():
        torch.testing.assert_close(b["state_dict"][key], value, msg=key)
    val = [h for h in b["train_state"]["history"] if "recall" in h]
    assert val and 0.0 <= val[-1]["recall"] <= 1.0 and val[-1]["inlier_ratio"] >= 0.0


def test_time_budget_stops_early_with_a_loadable_checkpoint(cache_dir, tmp_path):
    out = tmp_path / "budget.pt"
    assert _train_fcgf(cache_dir, out, "--steps", "1000", "--max-minutes", "0.001") == 0
    data = read_checkpoint(out)
    assert 1 <= data["train_state"]["step"] < 1000
    load_fcgf(out)
    shipped = read_checkpoint(weights_path(out))
    assert "train_state" not in shipped and shipped["steps"] == data["train_state"]["step"]
    load_fcgf(weights_path(out))


def test_inlier_checkpoint_has_the_dgr_layout(cache_dir, tmp_path):
    fcgf = tmp_path / "fcgf.pt"
    assert _train_fcgf(cache_dir, fcgf, "--steps", "1") == 0
    out = tmp_path / "inlier.pt"
    assert cli_main(["train", "inlier", "--data", str(cache_dir), "--fcgf", str(fcgf), "--out", str(out),
                     "--loss", "bce", "--matcher", "nn", "--steps", "1", "--threads", "1", "--val-every", "0"]) == 0
    net, inlier = load_dgr(out)
    assert net.config.channels == build_fcgf("compact").config.channels
    assert inlier.config.dim == 6
    assert "recall" in read_checkpoint(out)["train_state"]["history"][-1]


def test_end_to_end_fine_tuning_of_the_shipped_weights_gives_a_file_the_pipeline_runs(cache_dir, tmp_path):
    """``--inlier-init`` + ``--loss s2h`` on the shipped weights: both networks move, the paper's three
    terms are logged, and the result loads as the pipeline's models (FCGF + the context network)."""
    from s2h_ros.models.checkpoint import DEFAULT_WEIGHTS, load_registration_models
    from s2h_ros.models.context_inlier import ContextInlierNetwork
    from s2h_ros.paths import WEIGHTS_DIR

    shipped = WEIGHTS_DIR / DEFAULT_WEIGHTS
    out = tmp_path / "e2e.pt"
    assert cli_main(["train", "inlier", "--data", str(cache_dir), "--fcgf", str(shipped), "--inlier-init",
                     str(shipped), "--out", str(out), "--loss", "s2h", "--steps", "2", "--lr", "1e-2",
                     "--fcgf-lr", "1e-2", "--threads", "1", "--val-every", "0", "--log-every", "1"]) == 0
    before, after = load_registration_models(shipped), load_registration_models(weights_path(out))
    assert isinstance(after.inlier, ContextInlierNetwork) and after.inlier.config == before.inlier.config
    moved = lambda a, b: any(not torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))  # noqa: E731
    assert moved(before.fcgf, after.fcgf) and moved(before.inlier, after.inlier)
    logged = read_checkpoint(out)["train_state"]["history"][0]
    assert {"l1", "l2", "l3"} <= set(logged) and logged["l1"] <= 0.0


def test_ddp_with_two_gloo_processes_writes_a_rank0_checkpoint(cache_dir, tmp_path):
    out = tmp_path / "ddp.pt"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29581",
           "-m", "s2h_ros.cli", "train", "fcgf", "--data", str(cache_dir), "--out", str(out), "--steps", "2",
           "--threads", "1", "--val-every", "0", "--val-pairs", "1", "--num-pos", "128", "--num-hn", "32"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "2 process(es)" in proc.stdout + proc.stderr
    data = read_checkpoint(out)
    assert data["train_state"]["world_size"] == 2 and data["train_state"]["step"] == 2
    load_fcgf(out)


def test_trainers_import_without_open3d_or_ros():
    code = ("import sys, s2h_ros.cli, s2h_ros.commands.train, s2h_ros.training.fcgf_trainer, "
            "s2h_ros.training.inlier_trainer; "
            "print(','.join(m for m in ('open3d', 'rclpy', 'rosbags') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ""


def test_cache_index_records_every_pair(cache_dir):
    index = json.loads((cache_dir / "train" / "index.json").read_text())
    assert [p["file"] for p in index["pairs"]] == ["pair_00000.npz", "pair_00001.npz"]
    assert index["meta"]["seed"] == 1000
