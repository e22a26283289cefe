"""Geometry: SE(3) helpers, weighted Procrustes (paper's K/W form), voxel downsampling, metrics."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from s2h_ros import geometry as g


@pytest.fixture
def demo_points():
    """1,000 real points of the bundled 3DMatch demo source fragment."""
    from s2h_ros import paths

    xyz = np.load(paths.THREEDMATCH_DEMO_DIR / "src.npy")
    return xyz[np.random.default_rng(1).choice(len(xyz), 1000, replace=False)]


def test_procrustes_recovers_a_random_transform_on_real_points(rng, demo_points):
    R, t = g.random_rotation(rng, 180.0), rng.normal(size=3)
    src = torch.tensor(demo_points)
    tgt = src @ torch.tensor(R).T + torch.tensor(t)
    R_est, t_est = g.weighted_procrustes(src, tgt, torch.ones(len(src), dtype=src.dtype))
    assert torch.allclose(R_est, torch.tensor(R), atol=1e-8)
    assert torch.allclose(t_est, torch.tensor(t), atol=1e-8)


def test_procrustes_ignores_zero_weighted_outliers(rng, demo_points):
    R, t = g.random_rotation(rng, 90.0), rng.normal(size=3)
    src = torch.tensor(demo_points)
    tgt = src @ torch.tensor(R).T + torch.tensor(t)
    w = torch.ones(len(src), dtype=src.dtype)
    tgt[:300] += torch.tensor(rng.normal(scale=5.0, size=(300, 3)))
    w[:300] = 0
    R_est, t_est = g.weighted_procrustes(src, tgt, w)
    assert g.rotation_error_deg(R_est, torch.tensor(R)) < 1e-5
    assert torch.allclose(t_est, torch.tensor(t), atol=1e-8)


def test_robust_procrustes_lets_the_agreeing_matches_decide_where_weighted_outliers_pull_procrustes_off(rng, demo_points):
    # A third of the matches carry weight but lie 0.4-1.2 m off, all slid the same way (a wall's
    # matches a voxel or two along it): least squares follows them, the Geman-McClure refit does not.
    R, t = g.random_rotation(rng, 180.0), rng.normal(size=3)
    src = torch.tensor(demo_points)
    tgt = src @ torch.tensor(R).T + torch.tensor(t) + 0.005 * torch.tensor(rng.normal(size=(len(src), 3)))
    slid = torch.tensor(rng.uniform(0.4, 1.2, size=(330, 1))) * torch.tensor([0.6, 0.8, 0.0])
    tgt[:330] += slid
    w = torch.tensor(rng.uniform(0.3, 1.0, size=len(src)))
    plain_R, plain_t = g.weighted_procrustes(src, tgt, w)
    robust_R, robust_t = g.robust_weighted_procrustes(src, tgt, w, scale=0.3, iterations=10)
    plain_te = float(torch.linalg.vector_norm(plain_t - torch.tensor(t)))
    robust_te = float(torch.linalg.vector_norm(robust_t - torch.tensor(t)))
    assert plain_te > 0.1
    assert robust_te < 0.02 and robust_te < plain_te / 10
    assert float(g.rotation_error_deg(robust_R, torch.tensor(R))) < float(g.rotation_error_deg(plain_R, torch.tensor(R)))


def test_robust_procrustes_without_iterations_or_outliers_is_weighted_procrustes(rng, demo_points):
    R, t = g.random_rotation(rng, 90.0), rng.normal(size=3)
    src = torch.tensor(demo_points)
    tgt = src @ torch.tensor(R).T + torch.tensor(t)
    tgt[:100] += 3.0
    w = torch.tensor(rng.uniform(0.1, 1.0, size=len(src)))
    for got, want in zip(g.robust_weighted_procrustes(src, tgt, w, scale=0.3, iterations=0), g.weighted_procrustes(src, tgt, w)):
        assert torch.equal(got, want)
    clean = src @ torch.tensor(R).T + torch.tensor(t)  # every match exact: the refit stops where it started
    R_est, t_est = g.robust_weighted_procrustes(src, clean, w, scale=0.3, iterations=10)
    assert torch.allclose(R_est, torch.tensor(R), atol=1e-8) and torch.allclose(t_est, torch.tensor(t), atol=1e-8)


def test_procrustes_equals_the_papers_K_W_product_for_ppm_weights(rng):
    """H = Y' K W K X^T with K = I - sqrt(w) sqrt(w)^T, built literally, for 0/1 weights."""
    x, y = rng.normal(size=(40, 3)), rng.normal(size=(40, 3))
    w = (rng.uniform(size=40) > 0.4).astype(np.float64)
    w_bar = w / w.sum()
    K = np.eye(40) - np.outer(np.sqrt(w_bar), np.sqrt(w_bar))
    H = y.T @ K @ np.diag(w_bar) @ K @ x
    U, _, Vt = np.linalg.svd(H)
    E = np.diag([1.0, 1.0, np.linalg.det(U) * np.linalg.det(Vt)])
    R_paper = U @ E @ Vt
    t_paper = (y - x @ R_paper.T).T @ w_bar
    R, t = g.weighted_procrustes(torch.tensor(x), torch.tensor(y), torch.tensor(w))
    np.testing.assert_allclose(R.numpy(), R_paper, atol=1e-10)
    np.testing.assert_allclose(t.numpy(), t_paper, atol=1e-10)


def test_procrustes_never_returns_a_reflection(rng):
    x = rng.normal(size=(50, 3))
    y = x * np.array([1.0, 1.0, -1.0])  # a mirror image: best orthogonal fit is a reflection
    R, _ = g.weighted_procrustes(torch.tensor(x), torch.tensor(y), torch.ones(50, dtype=torch.float64))
    assert torch.linalg.det(R).item() == pytest.approx(1.0, abs=1e-9)


def test_procrustes_is_batched_and_differentiable(rng):
    x = torch.tensor(rng.normal(size=(2, 30, 3)))
    R_gt = torch.tensor(np.stack([g.random_rotation(rng, 60.0) for _ in range(2)]))
    y = x @ R_gt.transpose(-1, -2)
    w = torch.rand(2, 30, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).requires_grad_()
    R, t = g.weighted_procrustes(x, y + 0.01 * torch.randn_like(y), w)
    assert R.shape == (2, 3, 3) and t.shape == (2, 3)
    assert (g.rotation_error_deg(R, R_gt) < 2.0).all()
    (R.sum() + t.sum()).backward()
    assert torch.isfinite(w.grad).all() and (w.grad.abs() > 0).any()


def test_procrustes_with_all_zero_weights_raises_a_clear_error(rng):
    x = torch.tensor(rng.normal(size=(10, 3)))
    with pytest.raises(ValueError, match="sum to zero"):
        g.weighted_procrustes(x, x, torch.zeros(10, dtype=x.dtype))


@pytest.mark.parametrize(
    "src, weights, match",
    [
        (torch.zeros(0, 3), torch.zeros(0), "empty"),
        (torch.full((4, 3), float("nan")), torch.ones(4), "NaN"),
        (torch.zeros(4, 2), torch.ones(4), "shape"),
        (torch.zeros(4, 3), torch.ones(5), "weights must have shape"),
        (torch.zeros(4, 3), -torch.ones(4), "non-negative"),
    ],
)
def test_procrustes_rejects_bad_input(src, weights, match):
    with pytest.raises(ValueError, match=match):
        g.weighted_procrustes(src, src.clone() if src.shape[-1] == 3 else src, weights)


def test_rotation_error_of_known_angles_and_clamping(rng):
    Rz = lambda a: np.array([[np.cos(a), -np.sin(a), 0], [np.sin(a), np.cos(a), 0], [0, 0, 1]])  # noqa: E731
    assert g.rotation_error_deg(Rz(np.radians(30)), np.eye(3)) == pytest.approx(30.0)
    assert g.rotation_error_deg(Rz(np.pi), np.eye(3)) == pytest.approx(180.0)
    # slightly non-orthogonal identity: trace > 3 must clamp to 0, not NaN
    assert g.rotation_error_deg(np.eye(3) * (1 + 1e-9), np.eye(3)) == 0.0
    out = g.rotation_error_deg(torch.tensor(Rz(0.5))[None], torch.eye(3, dtype=torch.float64)[None])
    assert isinstance(out, torch.Tensor) and out.item() == pytest.approx(np.degrees(0.5))


def test_se3_helpers_roundtrip_numpy_and_torch(rng):
    T = g.make_transform(g.random_rotation(rng, 180.0), rng.normal(size=3))
    x = rng.normal(size=(20, 3))
    np.testing.assert_allclose(g.apply_transform(g.invert_transform(T), g.apply_transform(T, x)), x, atol=1e-12)
    np.testing.assert_allclose(g.invert_transform(T) @ T, np.eye(4), atol=1e-12)
    Tt = torch.tensor(T)
    assert torch.allclose(g.apply_transform(Tt, torch.tensor(x)), torch.tensor(g.apply_transform(T, x)))
    re, te = g.transform_errors(T, T)
    assert re == pytest.approx(0.0, abs=1e-5) and te == pytest.approx(0.0)
    T2 = T.copy()
    T2[:3, 3] += [0.3, 0.4, 0.0]
    assert g.transform_errors(T2, T)[1] == pytest.approx(0.5)


def test_random_rotation_is_a_rotation_within_the_angle_bound(rng):
    for _ in range(20):
        R = g.random_rotation(rng, 45.0)
        np.testing.assert_allclose(R @ R.T, np.eye(3), atol=1e-12)
        assert np.linalg.det(R) == pytest.approx(1.0)
        assert g.rotation_error_deg(R, np.eye(3)) <= 45.0 + 1e-9


def test_registration_recall_counts_pairs_inside_both_thresholds():
    re = np.array([1.0, 4.0, 6.0, 2.0])
    te = np.array([0.1, 0.7, 0.1, 0.5])
    assert g.registration_recall(re, te, 5.0, 0.6) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        g.registration_recall([], [], 5.0, 0.6)


def test_euler_errors_of_a_known_yaw_and_translation_offset():
    from scipy.spatial.transform import Rotation

    R_gt = np.stack([np.eye(3), np.eye(3)])
    R_pred = np.stack([Rotation.from_euler("zyx", [10, 0, 0], degrees=True).as_matrix(), np.eye(3)])
    t_gt, t_pred = np.zeros((2, 3)), np.array([[0.0, 0.0, 0.3], [0.0, 0.0, 0.0]])
    e = g.euler_errors(R_pred, R_gt, t_pred, t_gt)
    assert e["mae_r_deg"] == pytest.approx(10.0 / 6)
    assert e["rmse_r_deg"] == pytest.approx(np.sqrt(100.0 / 6))
    assert e["mae_t"] == pytest.approx(0.05)
    assert e["rmse_t"] == pytest.approx(np.sqrt(0.09 / 6))


def test_voxel_downsample_keeps_the_lowest_index_per_voxel(samples_dir):
    pts = np.array([[0.05, 0.05, 0.05], [0.5, 0.5, 0.5], [0.01, 0.02, 0.03], [1.5, 0.0, 0.0], [-0.05, 0.0, 0.0]])
    np.testing.assert_array_equal(g.voxel_downsample(pts, 1.0), [0, 3, 4])
    xyz = np.fromfile(samples_dir / "kitti" / "pair_00_1554_4534" / "kitti_00_001554.bin", np.float32).reshape(-1, 6)[:, :3]
    idx = g.voxel_downsample(xyz, 0.3)
    assert idx.dtype == np.int64 and np.all(np.diff(idx) > 0)
    keys = np.floor(xyz[idx] / 0.3).astype(np.int64)
    assert len(np.unique(keys, axis=0)) == len(idx) == len(np.unique(np.floor(xyz / 0.3), axis=0))
    np.testing.assert_array_equal(idx, g.voxel_downsample(xyz, 0.3))



def test_voxel_downsample_handles_extents_too_large_for_one_int64_key(rng):
    pts = rng.uniform(-1e6, 1e6, size=(500, 3))
    pts[250:] = pts[:250] + 1e-5  # every point shares its 1 mm voxel with one other
    idx = g.voxel_downsample(pts, 1e-3)  # 2e9 cells per axis: 8e27 keys, the axis-wise path
    _, first = np.unique(np.floor(pts / 1e-3).astype(np.int64), axis=0, return_index=True)
    np.testing.assert_array_equal(idx, np.sort(first))


@pytest.mark.parametrize("pts, voxel", [(np.zeros((0, 3)), 0.1), (np.full((3, 3), np.nan), 0.1), (np.zeros((3, 3)), 0.0)])
def test_voxel_downsample_rejects_bad_input(pts, voxel):
    with pytest.raises(ValueError):
        g.voxel_downsample(pts, voxel)


def test_a_fixed_subset_is_the_same_sorted_rows_in_every_call_and_none_below_its_size():
    first = g.fixed_subset(10_000, 300, seed=7)
    assert first.shape == (300,) and np.all(np.diff(first) > 0) and first.max() < 10_000
    np.random.default_rng(123).random(50)  # no state carries over from other generators or calls
    assert np.array_equal(g.fixed_subset(10_000, 300, seed=7), first)
    assert not np.array_equal(g.fixed_subset(10_000, 300, seed=8), first)
    assert g.fixed_subset(300, 300) is None and g.fixed_subset(10, 300) is None
    assert g.fixed_subset(10_000, 0) is None


def test_correspondence_inlier_mask_uses_the_ground_truth_transform(rng):
    src = rng.normal(size=(5, 3))
    T = g.make_transform(g.random_rotation(rng, 30.0), np.array([1.0, 0, 0]))
    tgt = g.apply_transform(T, src)
    mask = g.correspondence_inlier_mask(src, tgt, np.array([0, 1, 2]), np.array([0, 2, 2]), T, 1e-6)
    np.testing.assert_array_equal(mask, [True, False, True])


def test_virtual_points_of_any_soft_diagonal_give_the_same_procrustes_rotation(rng, demo_points):
    """Supplementary Theorem 1 on real points: different D, different virtual points, same R."""
    from s2h_ros.commands.figure import ambiguity_virtual_points

    X = demo_points - demo_points.mean(0)
    R = g.random_rotation(rng, 120.0)
    _, D_star, _ = np.linalg.svd(X.T @ (X @ R.T))
    ones = torch.ones(len(X), dtype=torch.float64)
    for D, deformed in [(D_star, False), (np.full(3, D_star[0]), True), (D_star[::-1].copy(), True)]:
        V = ambiguity_virtual_points(X, R, D)
        R_est, _ = g.weighted_procrustes(torch.tensor(X), torch.tensor(V), ones)
        assert g.rotation_error_deg(R_est.numpy(), R) < 1e-4
        assert (np.abs(V - X @ R.T).max() > 0.1) == deformed
