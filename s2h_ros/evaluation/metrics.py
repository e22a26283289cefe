"""Registration metrics for pairs (RE, TE, recall) and sequences (KITTI drift, ATE).

Pair metrics follow DGR/FCGF: a pair is a success when ``RE < tau_R`` and ``TE < tau_t``
(KITTI: 5 deg, 0.6 m; 3DMatch: 15 deg, 0.3 m), recall is the success rate and RE/TE are
averaged over the successful pairs only.

Sequence drift is the official KITTI odometry devkit definition (``evaluate_odometry.cpp``):
for every 10th frame ``i`` and each length ``L`` in 100, 200, ..., 800 m, ``j`` is the first
frame more than ``L`` metres further along the ground-truth path;
``E = (P_i^-1 P_j)^-1 (G_i^-1 G_j)`` and the segment's errors are ``angle(E) / L`` and
``||t(E)|| / L``, averaged over all segments. It is written here with numpy (one vectorised
pass per length) because the only packaged implementation, KISS-ICP's C++ binding, reports
rotation per metre without the per-length breakdown and is an optional dependency; the test
suite checks both agree.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
from scipy.spatial.transform import Rotation

from s2h_ros.geometry import invert_transform, rotation_error_deg, transform_errors


@dataclass(frozen=True)
class RecallThreshold:
    """A pair counts as registered when RE < ``re_deg`` and TE < ``te_m``."""

    re_deg: float
    te_m: float


THRESHOLDS: dict[str, RecallThreshold] = {
    "kitti": RecallThreshold(re_deg=5.0, te_m=0.6),
    "3dmatch": RecallThreshold(re_deg=15.0, te_m=0.3),
}

SEGMENT_LENGTHS: tuple[float, ...] = (100.0, 200.0, 300.0, 400.0, 500.0, 600.0, 700.0, 800.0)


def _check_transforms(name: str, T: np.ndarray) -> np.ndarray:
    T = np.asarray(T, dtype=np.float64)
    if T.ndim != 3 or T.shape[1:] != (4, 4):
        raise ValueError(f"{name} must have shape (K, 4, 4), got {T.shape}")
    if len(T) == 0:
        raise ValueError(f"{name} is empty")
    return T


# ------------------------------------------------------------------------------ pairs


def pair_errors(T_pred: np.ndarray, T_gt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(K, 4, 4)`` estimates and truths -> RE ``(K,)`` degrees, TE ``(K,)`` metres.

    A missing estimate (any NaN in ``T_pred[k]``, e.g. a method that raised) gets infinite
    errors, so it counts as a failure rather than vanishing from the statistics.
    """
    T_pred, T_gt = _check_transforms("T_pred", T_pred), _check_transforms("T_gt", T_gt)
    if T_pred.shape != T_gt.shape:
        raise ValueError(f"T_pred and T_gt differ in shape: {T_pred.shape} vs {T_gt.shape}")
    if not np.isfinite(T_gt).all():
        raise ValueError("T_gt contains NaN or inf")
    missing = ~np.isfinite(T_pred).all(axis=(1, 2))
    re, te = transform_errors(np.where(missing[:, None, None], np.eye(4), T_pred), T_gt)
    re, te = np.asarray(re, dtype=np.float64), np.asarray(te, dtype=np.float64)
    re[missing], te[missing] = np.inf, np.inf
    return re, te


def summarize_pairs(re: np.ndarray, te: np.ndarray, threshold: RecallThreshold) -> dict[str, float]:
    """Recall and the DGR-style means of RE (deg) and TE (m) over the successful pairs."""
    re, te = np.asarray(re, dtype=np.float64).ravel(), np.asarray(te, dtype=np.float64).ravel()
    if re.size == 0 or re.shape != te.shape:
        raise ValueError(f"re and te must be non-empty and of equal length, got {re.size} and {te.size}")
    ok = (re < threshold.re_deg) & (te < threshold.te_m)
    nan = float("nan")
    return {
        "pairs": int(re.size),
        "recall": float(ok.mean()),
        "re_mean_deg": float(re[ok].mean()) if ok.any() else nan,
        "te_mean_m": float(te[ok].mean()) if ok.any() else nan,
        "re_median_deg": float(np.median(re[ok])) if ok.any() else nan,
        "te_median_m": float(np.median(te[ok])) if ok.any() else nan,
    }


# --------------------------------------------------------------------------- sequences


def _check_trajectories(gt: np.ndarray, est: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    gt, est = _check_transforms("gt poses", gt), _check_transforms("estimated poses", est)
    if gt.shape != est.shape:
        raise ValueError(f"trajectories differ in length: {len(gt)} ground-truth vs {len(est)} estimated poses")
    if not (np.isfinite(gt).all() and np.isfinite(est).all()):
        raise ValueError("poses contain NaN or inf")
    return gt, est


def trajectory_distances(poses: np.ndarray) -> np.ndarray:
    """``(N, 4, 4)`` poses -> ``(N,)`` path length travelled up to each frame (metres)."""
    steps = np.linalg.norm(np.diff(poses[:, :3, 3], axis=0), axis=1)
    return np.concatenate([[0.0], np.cumsum(steps)])


def segment_errors(gt: np.ndarray, est: np.ndarray, lengths: tuple[float, ...] = SEGMENT_LENGTHS,
                   step: int = 10) -> np.ndarray:
    """KITTI devkit segment errors: ``(S, 4)`` rows ``(first frame, L, rot rad/m, trans m/m)``."""
    gt, est = _check_trajectories(gt, est)
    dist = trajectory_distances(gt)
    first = np.arange(0, len(gt), step)
    rows = []
    for length in lengths:
        last = np.searchsorted(dist, dist[first] + length, side="right")  # first frame beyond L
        keep = last < len(gt)
        i, j = first[keep], last[keep]
        if i.size == 0:
            continue
        delta_gt = invert_transform(gt[i]) @ gt[j]
        delta_est = invert_transform(est[i]) @ est[j]
        E = invert_transform(delta_est) @ delta_gt
        r = np.radians(rotation_error_deg(E[:, :3, :3], np.broadcast_to(np.eye(3), E[:, :3, :3].shape)))
        t = np.linalg.norm(E[:, :3, 3], axis=1)
        rows.append(np.stack([i, np.full(i.shape, length), r / length, t / length], axis=1))
    return np.concatenate(rows) if rows else np.zeros((0, 4))


def kitti_drift(gt: np.ndarray, est: np.ndarray, lengths: tuple[float, ...] = SEGMENT_LENGTHS,
                step: int = 10) -> dict:
    """Mean relative translation (%) and rotation (deg/100 m) over all segments, and per length.

    A trajectory shorter than the shortest length has no segment: the means are NaN and
    ``segments`` is 0 (not an error: short runs are still evaluated with ATE).
    """
    err = segment_errors(gt, est, lengths, step)
    nan = float("nan")

    def summary(rows: np.ndarray) -> dict:
        if len(rows) == 0:
            return {"t_err_pct": nan, "r_err_deg_per_100m": nan, "segments": 0}
        return {"t_err_pct": float(rows[:, 3].mean() * 100.0),
                "r_err_deg_per_100m": float(np.degrees(rows[:, 2].mean()) * 100.0),
                "segments": int(len(rows))}

    out = summary(err)
    out["per_length"] = {int(L): summary(err[err[:, 1] == L]) for L in lengths}
    return out


def align_trajectory(gt: np.ndarray, est: np.ndarray) -> np.ndarray:
    """The rigid ``(4, 4)`` ``S`` minimising ``sum_i ||S p_i - g_i||^2`` over positions (Horn/Umeyama, no scale)."""
    gt, est = _check_trajectories(gt, est)
    g, p = gt[:, :3, 3], est[:, :3, 3]
    mu_g, mu_p = g.mean(0), p.mean(0)
    R = np.eye(3)
    if len(g) > 1 and np.ptp(p, axis=0).max() > 0:
        with warnings.catch_warnings():
            # A straight-line trajectory leaves the roll about the line free; any choice is optimal.
            warnings.filterwarnings("ignore", message="Optimal rotation is not uniquely")
            R = Rotation.align_vectors(g - mu_g, p - mu_p)[0].as_matrix()
    S = np.eye(4)
    S[:3, :3], S[:3, 3] = R, mu_g - R @ mu_p
    return S


def absolute_trajectory_error(gt: np.ndarray, est: np.ndarray) -> dict[str, float]:
    """ATE after rigid alignment of the estimated positions to the truth: RMSE, mean, max (m)."""
    gt, est = _check_trajectories(gt, est)
    aligned = align_trajectory(gt, est) @ est
    d = np.linalg.norm(aligned[:, :3, 3] - gt[:, :3, 3], axis=1)
    return {"ate_rmse_m": float(np.sqrt(np.mean(d**2))), "ate_mean_m": float(d.mean()),
            "ate_max_m": float(d.max())}


def sequence_metrics(gt: np.ndarray, est: np.ndarray) -> dict:
    """KITTI drift, ATE and path length of one estimated trajectory against the truth."""
    gt, est = _check_trajectories(gt, est)
    return {"length_m": float(trajectory_distances(gt)[-1]), "frames": int(len(gt)),
            **kitti_drift(gt, est), **absolute_trajectory_error(gt, est)}
