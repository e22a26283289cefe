"""Validation metrics computed with torch alone (the training machine may have no Open3D).

``hypothesis_registration`` is a small batched RANSAC over given correspondences: minimal
3-point hypotheses solved by the (batched) weighted Procrustes, scored by inlier count, best one
refit on its inliers. It is written here because Open3D's RANSAC, used by the pipeline's
safeguard, is not available where training runs; it serves only to turn FCGF's correspondences
into a transform for the validation recall (DGR/FCGF's "FCGF + RANSAC" number).
"""
from __future__ import annotations

import numpy as np
import torch
from scipy.spatial import cKDTree

from s2h_ros.geometry import apply_transform, make_transform, registration_recall, transform_errors, weighted_procrustes

RE_THRESH_DEG = 5.0  # DGR KITTI success: RE < 5 deg and TE < 0.6 m
TE_THRESH_M = 0.6


def nearest_feature(feat_x: torch.Tensor, feat_y: torch.Tensor) -> torch.Tensor:
    """``(Nx,) int64``: each source descriptor's nearest target descriptor (DGR's correspondences)."""
    from s2h_ros.matching import feature_knn

    return feature_knn(feat_x, feat_y, 1)[:, 0]


def correspondence_residuals(src: torch.Tensor, tgt: torch.Tensor, T: np.ndarray | torch.Tensor) -> torch.Tensor:
    """``(K,)`` distances ``||T src_k - tgt_k||`` of paired ``(K, 3)`` points."""
    T = torch.as_tensor(T, dtype=src.dtype, device=src.device)
    return torch.linalg.vector_norm(apply_transform(T, src) - tgt, dim=1)


def ground_truth_partner(src: np.ndarray, tgt: np.ndarray, T_gt: np.ndarray, radius: float) -> np.ndarray:
    """``(Ns,) int64``: the target row nearest ``T_gt src_i`` within ``radius``, or -1 (the trainers'
    ground-truth pairs: FCGF's positives, the matrix ``M_gt`` of the S2H losses)."""
    dist, j = cKDTree(tgt).query(apply_transform(np.asarray(T_gt), src), k=1, distance_upper_bound=radius)
    return np.where(np.isfinite(dist), j, -1).astype(np.int64)


@torch.no_grad()
def hypothesis_registration(src: torch.Tensor, tgt: torch.Tensor, threshold: float, rng: np.random.Generator,
                            hypotheses: int = 2000, chunk: int = 250) -> np.ndarray:
    """``(4, 4)`` float64 transform from paired ``(K, 3)`` points, robust to outliers (batched RANSAC)."""
    k = src.shape[0]
    if k < 3:
        return np.eye(4)
    best_count, best_T = -1, np.eye(4)
    for start in range(0, hypotheses, chunk):
        n = min(chunk, hypotheses - start)
        pick = torch.as_tensor(rng.integers(0, k, size=(n, 3)), device=src.device)
        ones = torch.ones(n, 3, dtype=src.dtype, device=src.device)
        try:
            R, t = weighted_procrustes(src[pick], tgt[pick], ones)
        except ValueError:
            continue
        moved = torch.einsum("hij,kj->hki", R, src) + t[:, None, :]  # (n, K, 3)
        counts = (torch.linalg.vector_norm(moved - tgt[None], dim=2) < threshold).sum(1)
        h = int(torch.argmax(counts))
        if int(counts[h]) > best_count:
            best_count = int(counts[h])
            best_T = make_transform(R[h].double().cpu().numpy(), t[h].double().cpu().numpy())
    inliers = correspondence_residuals(src, tgt, best_T) < threshold
    if int(inliers.sum()) >= 3:
        R, t = weighted_procrustes(src[inliers].double(), tgt[inliers].double(), inliers[inliers].double())
        best_T = make_transform(R.cpu().numpy(), t.cpu().numpy())
    return best_T


def procrustes_transform(xs: torch.Tensor, ys: torch.Tensor, w: torch.Tensor) -> np.ndarray | None:
    """``(4, 4)`` float64 weighted Procrustes of paired ``(K, 3)`` points with weights ``(K,)``, or
    None with fewer than 3 pairs or weights summing to zero (validation of the learned weights)."""
    if len(w) < 3 or float(w.sum()) <= 0:
        return None
    R, t = weighted_procrustes(xs.double(), ys.double(), w.double())
    return make_transform(R.cpu().numpy(), t.cpu().numpy())


def summarize(T_preds: list[np.ndarray], T_gts: list[np.ndarray]) -> dict[str, float]:
    """Recall (RE < 5 deg, TE < 0.6 m), mean RE (deg) and TE (m) over pairs."""
    re, te = transform_errors(np.stack(T_preds), np.stack(T_gts))
    return {"recall": registration_recall(re, te, RE_THRESH_DEG, TE_THRESH_M),
            "re_deg": float(np.mean(re)), "te_m": float(np.mean(te))}
