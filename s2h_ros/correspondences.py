"""Correspondences between two clouds' features, and DGR's RANSAC safeguard on them (no ROS).

``match_features`` is the one entry: S2H (the soft-to-hard partial permutation of
:mod:`s2h_ros.matching`), DGR's 1-NN or mutual nearest neighbours (``RegistrationConfig.matcher``).
FPFH (Open3D) stands in where no learned weights fit the voxel size.
"""
from __future__ import annotations

import numpy as np
import torch

from s2h_ros.config import RegistrationConfig
from s2h_ros.ransac import ransac


def fpfh_features(xyz: np.ndarray, voxel: float) -> np.ndarray:
    """(M, 33) float32 L2-normalised Open3D FPFH of voxelised points (normals at 2 x voxel)."""
    import open3d as o3d

    pcd = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(xyz.astype(np.float64)))
    pcd.estimate_normals(o3d.geometry.KDTreeSearchParamHybrid(radius=2.0 * voxel, max_nn=30))
    fpfh = o3d.pipelines.registration.compute_fpfh_feature(
        pcd, o3d.geometry.KDTreeSearchParamHybrid(radius=5.0 * voxel, max_nn=100)
    )
    f = np.asarray(fpfh.data, dtype=np.float32).T
    return f / np.maximum(np.linalg.norm(f, axis=1, keepdims=True), 1e-12)


def s2h_correspondences(feat_x: torch.Tensor, feat_y: torch.Tensor, cfg: RegistrationConfig,
                        feature_kind: str = "fcgf", support: tuple[torch.Tensor, torch.Tensor] | None = None):
    """S2H matches ``(src_idx (K,), tgt_idx (K,))`` int64, ``P`` on them ``(K,)`` (differentiable in
    the features: the trainers use it too) and the :class:`MatchResult`, on the features' device.
    ``support``: candidate edges (tracking, ``matching.prior_support``); default the feature k-NN.

    Fewer than ``cfg.min_matches``: the H-step again with the authors' constant outlier profit.
    Weak features (e.g. FPFH) leave P flat and the calibrated rule matches almost nothing; the
    small constant keeps enough pairs for RANSAC.
    """
    from s2h_ros.matching import match_options, s2h_match

    m = s2h_match(feat_x, feat_y, **match_options(cfg, feature_kind), support=support)
    if len(m.src_idx) >= cfg.min_matches:
        return m.src_idx, m.tgt_idx, m.p_values, m
    again = m.rematch("constant")
    return again.src_idx, again.tgt_idx, again.p_values, m


def match_features(
    feat_x: torch.Tensor, feat_y: torch.Tensor, cfg: RegistrationConfig, feature_kind: str = "fcgf",
    support: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[np.ndarray, np.ndarray, int]:
    """Correspondences ``(K, 2)``, their matching probability ``(K,)`` and the candidate count.
    ``support`` (S2H only): candidate edges from a motion prior instead of the feature k-NN."""
    if cfg.matcher == "s2h":
        src, tgt, probs, m = s2h_correspondences(feat_x, feat_y, cfg, feature_kind, support)
        pairs = torch.stack([src, tgt], 1).cpu().numpy().astype(np.int64)
        return pairs, probs.detach().cpu().numpy().astype(np.float32), int(m.rows.numel())
    from s2h_ros.matching import feature_knn

    # DGR: every source voxel's nearest target voxel in feature space; mutual: kept if reciprocal.
    nn_y = feature_knn(feat_x, feat_y, 1)[:, 0]
    src_idx = torch.arange(len(feat_x), device=feat_x.device)
    if cfg.matcher == "mutual_nn":
        nn_x = feature_knn(feat_y, feat_x, 1)[:, 0]
        keep = nn_x[nn_y] == src_idx
        src_idx, nn_y = src_idx[keep], nn_y[keep]
    pairs = torch.stack([src_idx, nn_y], 1).cpu().numpy().astype(np.int64)
    return pairs, np.ones(len(pairs), np.float32), len(feat_x)


def ransac_on_correspondences(src: np.ndarray, tgt: np.ndarray, pairs: np.ndarray, cfg: RegistrationConfig) -> np.ndarray:
    """DGR's safeguard: RANSAC over the ``(K >= 3, 2)`` correspondences ``pairs`` into ``src (N, 3)``
    and ``tgt (M, 3)`` (s2h_ros.ransac: reproducible for a seed, on the config's device), 4x4 float64."""
    return ransac(src, tgt, pairs, cfg.inlier_distance, cfg.ransac_iters, cfg.seed, cfg.device).transform
