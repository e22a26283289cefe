"""Pair metrics (RE, TE, recall) and sequence metrics (KITTI devkit drift, ATE)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from s2h_ros.evaluation.metrics import (
    THRESHOLDS,
    absolute_trajectory_error,
    kitti_drift,
    pair_errors,
    segment_errors,
    sequence_metrics,
    summarize_pairs,
    trajectory_distances,
)


def _transform(rotvec_deg, t) -> np.ndarray:
    T = np.eye(4)
    T[:3, :3] = Rotation.from_rotvec(np.radians(rotvec_deg)).as_matrix()
    T[:3, 3] = t
    return T


def _drive(rng: np.random.Generator, n: int, step: float = 1.5) -> np.ndarray:
    """(n, 4, 4) gently curving planar ground-truth trajectory."""
    yaw = np.cumsum(rng.normal(0.0, 0.02, n))
    poses = np.tile(np.eye(4), (n, 1, 1))
    poses[:, :3, :3] = Rotation.from_euler("z", yaw[:, None]).as_matrix()
    poses[:, :3, 3] = np.cumsum(np.stack([np.cos(yaw), np.sin(yaw), np.zeros(n)], 1) * step, axis=0)
    return poses


def _noisy_odometry(rng: np.random.Generator, gt: np.ndarray, rot_sigma=0.002, t_sigma=0.02) -> np.ndarray:
    rel = np.linalg.inv(gt[:-1]) @ gt[1:]
    est = [np.eye(4)]
    for k in range(len(rel)):
        noise = _transform(np.degrees(rng.normal(0, rot_sigma, 3)), rng.normal(0, t_sigma, 3))
        est.append(est[-1] @ rel[k] @ noise)
    return np.stack(est)


def test_pair_errors_measure_rotation_angle_and_translation_distance():
    gt = np.stack([_transform([0, 0, 30], [1, 2, 0]), np.eye(4)])
    pred = np.stack([gt[0] @ _transform([0, 0, 10], [0, 0, 0]), _transform([0, 0, 0], [0.3, 0.4, 0])])
    re, te = pair_errors(pred, gt)
    np.testing.assert_allclose(re, [10.0, 0.0], atol=1e-9)
    np.testing.assert_allclose(te, [0.0, 0.5], atol=1e-9)


def test_missing_estimate_counts_as_infinite_error_not_dropped():
    pred = np.stack([np.eye(4), np.full((4, 4), np.nan)])
    re, te = pair_errors(pred, np.stack([np.eye(4), np.eye(4)]))
    assert re[0] == 0 and math.isinf(re[1]) and math.isinf(te[1])
    assert summarize_pairs(re, te, THRESHOLDS["kitti"])["recall"] == 0.5


def test_recall_uses_strict_dataset_thresholds_and_means_cover_successes_only():
    kitti = THRESHOLDS["kitti"]
    assert (kitti.re_deg, kitti.te_m) == (5.0, 0.6)
    assert (THRESHOLDS["3dmatch"].re_deg, THRESHOLDS["3dmatch"].te_m) == (15.0, 0.3)
    re = np.array([1.0, 3.0, 5.0, 2.0, 90.0])  # 5.0 deg is not < 5
    te = np.array([0.1, 0.3, 0.1, 0.6, 9.0])  # 0.6 m is not < 0.6
    s = summarize_pairs(re, te, kitti)
    assert s["pairs"] == 5 and s["recall"] == pytest.approx(0.4)
    assert s["re_mean_deg"] == pytest.approx(2.0) and s["te_mean_m"] == pytest.approx(0.2)
    none = summarize_pairs(np.array([50.0]), np.array([5.0]), kitti)
    assert none["recall"] == 0 and math.isnan(none["re_mean_deg"])


def test_pair_errors_reject_wrong_shapes_with_a_named_error():
    with pytest.raises(ValueError, match="T_pred must have shape"):
        pair_errors(np.eye(4), np.eye(4)[None])
    with pytest.raises(ValueError, match="differ in shape"):
        pair_errors(np.stack([np.eye(4)] * 2), np.eye(4)[None])


def test_perfect_odometry_has_zero_drift_and_zero_ate(rng):
    gt = _drive(rng, 700)
    m = sequence_metrics(gt, gt.copy())
    assert m["t_err_pct"] == pytest.approx(0, abs=1e-9)
    assert m["r_err_deg_per_100m"] == pytest.approx(0, abs=1e-4)  # arccos near 1 limits precision
    assert m["ate_rmse_m"] == pytest.approx(0, abs=1e-9)
    assert m["length_m"] == pytest.approx(699 * 1.5)


def test_one_percent_scale_error_on_a_straight_line_is_one_percent_translation_drift():
    n = 1000
    gt = np.tile(np.eye(4), (n, 1, 1))
    gt[:, 0, 3] = np.arange(n) * 1.0
    est = gt.copy()
    est[:, 0, 3] *= 1.01
    d = kitti_drift(gt, est)
    # each segment ends at the first frame past L (L + 1 m here) and is normalised by L
    for L, per in d["per_length"].items():
        assert per["t_err_pct"] == pytest.approx(1.0 * (L + 1) / L, rel=1e-9)
    assert 1.0 < d["t_err_pct"] < 1.01
    assert d["r_err_deg_per_100m"] == pytest.approx(0.0, abs=1e-9)


def test_segments_start_every_tenth_frame_and_end_past_each_length():
    n = 350
    gt = np.tile(np.eye(4), (n, 1, 1))
    gt[:, 0, 3] = np.arange(n) * 1.0  # frame i is at i metres
    err = segment_errors(gt, gt, lengths=(100.0, 200.0, 300.0, 400.0))
    firsts_100 = err[err[:, 1] == 100, 0]
    # the devkit's last frame is the first one strictly beyond first + L, i.e. first + 101 here
    np.testing.assert_array_equal(firsts_100, np.arange(0, n - 101, 10))
    assert (err[:, 1] == 300).sum() == len(np.arange(0, n - 301, 10))
    assert (err[:, 1] == 400).sum() == 0
    assert kitti_drift(gt, gt)["per_length"][400]["segments"] == 0


def test_kitti_drift_agrees_with_kiss_icp_implementation(rng):
    kiss_metrics = pytest.importorskip("kiss_icp.metrics")
    gt = _drive(rng, 800)
    est = _noisy_odometry(rng, gt)
    d = kitti_drift(gt, est)
    t_pct, r_deg_per_m = kiss_metrics.sequence_error(gt, est)
    assert d["segments"] > 100
    assert d["t_err_pct"] == pytest.approx(t_pct, rel=1e-4)
    assert d["r_err_deg_per_100m"] == pytest.approx(100 * r_deg_per_m, rel=1e-2)  # KISS-ICP: float32
    assert absolute_trajectory_error(gt, est)["ate_rmse_m"] == pytest.approx(
        kiss_metrics.absolute_trajectory_error(gt, est)[1], rel=1e-4)


def test_short_trajectory_has_no_segments_but_still_an_ate(rng):
    gt = _drive(rng, 30)
    m = sequence_metrics(gt, _noisy_odometry(rng, gt))
    assert m["segments"] == 0 and math.isnan(m["t_err_pct"])
    assert m["ate_rmse_m"] > 0


def test_ate_aligns_a_rigidly_moved_trajectory_before_measuring(rng):
    gt = _drive(rng, 200)
    est = _transform([0, 0, 40], [5, -3, 1]) @ gt
    assert absolute_trajectory_error(gt, est)["ate_rmse_m"] == pytest.approx(0, abs=1e-6)
    assert trajectory_distances(est)[-1] == pytest.approx(trajectory_distances(gt)[-1])


def test_sequence_metrics_reject_mismatched_or_nan_trajectories(rng):
    gt = _drive(rng, 20)
    with pytest.raises(ValueError, match="differ in length"):
        sequence_metrics(gt, gt[:10])
    bad = gt.copy()
    bad[3, 0, 3] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        sequence_metrics(gt, bad)
