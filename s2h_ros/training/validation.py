"""Validation metrics computed with torch alone (the training machine may have no Open3D); the
trainers turn correspondences into a transform with the pipeline's own RANSAC (s2h_ros.ransac,
torch too) for the validation recall (DGR/FCGF's "FCGF + RANSAC" number).
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
