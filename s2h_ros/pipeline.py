"""SHM_DGR: register a source cloud to a target cloud.

voxelise -> features (FCGF, or FPFH where no weights fit) -> S2H matching (S-step on a feature
k-NN support, exact H-step) -> inlier weights (DGR's 6-D network when the weights carry one) ->
weighted Procrustes -> safeguard (RANSAC on the correspondences when the weight sum is too small)
-> robust ICP refinement -> success test.

``Registrar`` holds the networks and a prepared-cloud cache, so a keyframe's features are
computed once and reused; ``register()`` is the one-call entry of the design contract.
"""
from __future__ import annotations

import dataclasses
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from s2h_ros import geometry
from s2h_ros.config import RegistrationConfig


class RegistrationError(ValueError):
    """The input clouds cannot be registered (empty, non-finite, wrong shape)."""


@dataclass
class PreparedCloud:
    """A voxelised cloud with its per-voxel features, reusable across many registrations."""

    xyz: np.ndarray  # (M, 3) float32 voxel representatives, metres
    features: torch.Tensor  # (M, C) float32, L2-normalised, on the config's device
    num_input_points: int
    feature_kind: str  # "fcgf" or "fpfh"
    timings: dict[str, float] = field(default_factory=dict)  # ms


@dataclass
class RegistrationResult:
    """What ``register`` found; ``transform`` maps source points into the target frame."""

    transform: np.ndarray  # (4, 4) float64
    success: bool
    message: str
    correspondences: np.ndarray  # (K, 2) int64: (source voxel index, target voxel index)
    weights: np.ndarray  # (K,) float32 inlier weights used by Procrustes
    source_xyz: np.ndarray  # (Ns, 3) float32 voxels the indices refer to
    target_xyz: np.ndarray  # (Nt, 3) float32
    num_candidates: int = 0
    num_inliers: int = 0
    inlier_ratio: float = 0.0
    fitness: float = 0.0
    weight_sum: float = 0.0
    used_fallback: bool = False
    feature_kind: str = ""
    inlier_mask: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))  # (K,) within inlier distance
    timings: dict[str, float] = field(default_factory=dict)  # ms per stage, plus "total"

    def to_dict(self) -> dict:
        return {
            "transform": self.transform.tolist(),
            "success": self.success,
            "message": self.message,
            "num_source_voxels": int(len(self.source_xyz)),
            "num_target_voxels": int(len(self.target_xyz)),
            "num_candidates": self.num_candidates,
            "num_correspondences": int(len(self.correspondences)),
            "num_inliers": self.num_inliers,
            "inlier_ratio": self.inlier_ratio,
            "fitness": self.fitness,
            "weight_sum": self.weight_sum,
            "used_fallback": self.used_fallback,
            "feature_kind": self.feature_kind,
            "timings_ms": self.timings,
            "correspondences": self.correspondences.tolist(),
            "weights": self.weights.tolist(),
        }


class _Timer:
    def __init__(self) -> None:
        self.ms: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str, device: torch.device | None = None) -> Iterator[None]:
        t0 = time.perf_counter()
        yield
        if device is not None and device.type == "cuda":
            torch.cuda.synchronize(device)
        self.ms[name] = self.ms.get(name, 0.0) + 1e3 * (time.perf_counter() - t0)


def _check_cloud(name: str, xyz: np.ndarray) -> np.ndarray:
    """(N, >=3) array-like -> (N', 3) float32 with non-finite rows dropped; clear errors otherwise."""
    if isinstance(xyz, torch.Tensor):
        xyz = xyz.detach().cpu().numpy()
    xyz = np.asarray(xyz)
    if xyz.ndim != 2 or xyz.shape[1] < 3:
        raise RegistrationError(f"{name} must have shape (N, 3), got {xyz.shape}")
    xyz = xyz[:, :3].astype(np.float32, copy=False)
    finite = np.isfinite(xyz).all(axis=1)
    if not finite.any():
        raise RegistrationError(f"{name} has no finite points ({len(xyz)} given)")
    return xyz[finite]


class Registrar:
    """SHM_DGR with loaded networks; ``prepare`` a cloud once, ``register`` it many times."""

    def __init__(self, config: RegistrationConfig | None = None) -> None:
        self.config = config or RegistrationConfig()
        self.device = torch.device(self.config.device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise RegistrationError(f"device {self.config.device!r} requested but CUDA is not available")
        self._models = None  # (fcgf, inlier or None, voxel the weights were trained at), loaded lazily
        self._rng = np.random.default_rng(self.config.seed)

    # ------------------------------------------------------------------ features
    def _load_models(self):
        if self._models is None:
            from s2h_ros.models.checkpoint import load_registration_models

            self._models = load_registration_models(self.config.weights or None, device=self.device)
        return self._models

    def feature_kind(self) -> str:
        """Features in use. ``auto``: fcgf when weights are given or shipped and were trained at
        this voxel size (within 10 %), else fpfh: learned features do not transfer across scales."""
        kind = self.config.features
        if kind == "auto":
            cfg = self.config
            if not (cfg.weights or default_weights_path().exists()):
                return "fpfh"
            trained = self._load_models().voxel
            fits = trained is None or abs(trained - cfg.voxel_size) <= 0.1 * cfg.voxel_size
            kind = "fcgf" if fits else "fpfh"
        return kind

    def prepare(self, xyz: np.ndarray) -> PreparedCloud:
        """Voxelise ``(N, 3)`` points and compute per-voxel features (the expensive, cacheable half)."""
        cfg = self.config
        timer = _Timer()
        points = _check_cloud("cloud", xyz)
        with timer.stage("voxelize"):
            keep = geometry.voxel_downsample(points, cfg.voxel_size)
            if len(keep) > cfg.max_points:
                keep = np.sort(self._rng.choice(keep, cfg.max_points, replace=False))
            voxels = points[keep]
        if len(voxels) < 3:
            raise RegistrationError(f"cloud has only {len(voxels)} occupied voxels at {cfg.voxel_size} m")
        kind = self.feature_kind()
        with timer.stage("features", self.device):
            if kind == "fcgf":
                from s2h_ros.models.fcgf import extract_features

                fcgf = self._load_models().fcgf
                voxels, feats = extract_features(fcgf, voxels, cfg.voxel_size, device=self.device)
                voxels = np.asarray(voxels, dtype=np.float32)
            else:
                feats = torch.as_tensor(fpfh_features(voxels, cfg.voxel_size), device=self.device)
        return PreparedCloud(voxels, feats, len(points), kind, timer.ms)

    # ------------------------------------------------------------------ registration
    def register(
        self,
        source: np.ndarray | PreparedCloud,
        target: np.ndarray | PreparedCloud,
        init: np.ndarray | None = None,
    ) -> RegistrationResult:
        """Transform mapping ``source`` into ``target``'s frame (arrays or prepared clouds).

        ``init``: a prior transform (e.g. a constant-velocity prediction), the ICP start when
        there are too few correspondences for RANSAC. (``KeyframeOdometry`` also refines from its
        prior when this global result is not trusted.)
        """
        cfg = self.config
        t_start = time.perf_counter()
        src = source if isinstance(source, PreparedCloud) else self.prepare(source)
        tgt = target if isinstance(target, PreparedCloud) else self.prepare(target)
        timer = _Timer()
        # Stage times of freshly prepared clouds count towards this call; cached ones cost nothing.
        for prepared, given in ((src, source), (tgt, target)):
            if not isinstance(given, PreparedCloud):
                for k, v in prepared.timings.items():
                    timer.ms[k] = timer.ms.get(k, 0.0) + v

        with timer.stage("match", self.device):
            pairs, probs, n_cand = match_features(src.features, tgt.features, cfg, src.feature_kind)
        with timer.stage("inlier", self.device):
            weights, learned = self._inlier_weights(src.xyz, tgt.xyz, pairs, probs)
        weight_sum = float(weights.sum())
        T = np.eye(4)
        used_fallback = False
        message = ""
        with timer.stage("procrustes"):
            threshold = max(cfg.safeguard_min_weight, cfg.safeguard_ratio * len(src.xyz))
            # Without a learned inlier network the weights say little about outliers: go robust.
            if learned and len(pairs) >= 3 and weight_sum >= threshold:
                R, t = geometry.weighted_procrustes(
                    torch.from_numpy(src.xyz[pairs[:, 0]]).double(),
                    torch.from_numpy(tgt.xyz[pairs[:, 1]]).double(),
                    torch.from_numpy(weights).double(),
                )
                T = geometry.make_transform(R.numpy(), t.numpy())
            else:
                used_fallback = True
        if used_fallback:
            with timer.stage("ransac"):
                if len(pairs) >= 3:
                    T = ransac_on_correspondences(src.xyz, tgt.xyz, pairs, cfg)
                elif init is not None:
                    T = np.asarray(init, dtype=np.float64)
                else:
                    message = "fewer than 3 correspondences"
        if cfg.refine == "icp" and not message:
            with timer.stage("refine"):
                T = refine_icp(src.xyz, tgt.xyz, T, cfg)
        with timer.stage("verify"):
            n_inl, inl_mask, fitness = verify(src.xyz, tgt.xyz, pairs, T, cfg.inlier_distance)
        inlier_ratio = n_inl / max(len(pairs), 1)
        success = not message and n_inl >= cfg.min_inliers and fitness >= cfg.min_fitness
        if not success and not message:
            message = (
                f"not trusted: {n_inl} inlier correspondences (need {cfg.min_inliers}), "
                f"fitness {fitness:.2f} (need {cfg.min_fitness:.2f})"
            )
        timer.ms["total"] = 1e3 * (time.perf_counter() - t_start)
        result = RegistrationResult(
            transform=T,
            success=bool(success),
            message=message,
            correspondences=pairs,
            weights=weights.astype(np.float32),
            source_xyz=src.xyz,
            target_xyz=tgt.xyz,
            num_candidates=int(n_cand),
            num_inliers=int(n_inl),
            inlier_ratio=float(inlier_ratio),
            fitness=float(fitness),
            weight_sum=weight_sum,
            used_fallback=used_fallback,
            feature_kind=src.feature_kind,
            inlier_mask=inl_mask,
            timings=timer.ms,
        )
        return result

    def _inlier_weights(self, src_xyz, tgt_xyz, pairs: np.ndarray, probs: np.ndarray) -> tuple[np.ndarray, bool]:
        """DGR's learned weights when available (True), else the S-step probabilities (False)."""
        cfg = self.config
        if len(pairs) == 0:
            return np.zeros(0, np.float32), False
        use_net = cfg.use_inlier_model and self.feature_kind() == "fcgf"
        inlier_net = self._load_models().inlier if use_net else None
        if inlier_net is None:
            return probs.astype(np.float32), False
        from s2h_ros.models.inlier import correspondence_weights

        w = correspondence_weights(inlier_net, src_xyz[pairs[:, 0]], tgt_xyz[pairs[:, 1]], cfg.voxel_size, self.device)
        w = np.asarray(w, dtype=np.float32)
        w[w < cfg.weight_floor] = 0.0
        return w, True


# ---------------------------------------------------------------------------- stages


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
                        feature_kind: str = "fcgf"):
    """S2H matches ``(src_idx (K,), tgt_idx (K,))`` int64, ``P`` on them ``(K,)`` (differentiable in
    the features: the trainers use it too) and the :class:`MatchResult`, on the features' device.

    Fewer than ``cfg.min_matches``: the H-step again with the authors' constant outlier profit.
    Weak features (e.g. FPFH) leave P flat and the calibrated rule matches almost nothing; the
    small constant keeps enough pairs for RANSAC.
    """
    from s2h_ros.matching import s2h_match, sparse_outlier_profits, sparse_partial_permutation

    temperature, slack_score = cfg.s_step(feature_kind)
    m = s2h_match(
        feat_x,
        feat_y,
        k=cfg.k,
        iters=cfg.sinkhorn_iters,
        temperature=temperature,
        slack_score=slack_score,
        outlier_profit=cfg.outlier_profit,
        scale=None if cfg.outlier_scale < 0 else cfg.outlier_scale,
    )
    if len(m.src_idx) >= cfg.min_matches:
        return m.src_idx, m.tgt_idx, m.p_values, m
    n_x, n_y = len(feat_x), len(feat_y)
    p = m.p.detach()
    sx, sy = sparse_outlier_profits(m.rows, m.cols, p, n_x, n_y, "constant", None)
    src, tgt = sparse_partial_permutation(m.rows, m.cols, p, n_x, n_y, sx, sy)
    src = torch.as_tensor(src, dtype=torch.long, device=feat_x.device)
    tgt = torch.as_tensor(tgt, dtype=torch.long, device=feat_x.device)
    pos = torch.searchsorted(m.rows * n_y + m.cols, src * n_y + tgt)  # edges are sorted and unique
    return src, tgt, m.p[pos], m


def match_features(
    feat_x: torch.Tensor, feat_y: torch.Tensor, cfg: RegistrationConfig, feature_kind: str = "fcgf"
) -> tuple[np.ndarray, np.ndarray, int]:
    """Correspondences ``(K, 2)``, their matching probability ``(K,)`` and the candidate count."""
    if cfg.matcher == "s2h":
        src, tgt, probs, m = s2h_correspondences(feat_x, feat_y, cfg, feature_kind)
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
    """DGR's safeguard: RANSAC over the given correspondences (Open3D), 4x4 float64."""
    import open3d as o3d

    reg = o3d.pipelines.registration
    o3d.utility.random.seed(cfg.seed)
    ps = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(src.astype(np.float64)))
    pt = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(tgt.astype(np.float64)))
    corr = o3d.utility.Vector2iVector(pairs.astype(np.int32))
    dist = cfg.inlier_distance
    res = reg.registration_ransac_based_on_correspondence(
        ps,
        pt,
        corr,
        dist,
        reg.TransformationEstimationPointToPoint(False),
        3,
        [reg.CorrespondenceCheckerBasedOnEdgeLength(0.9), reg.CorrespondenceCheckerBasedOnDistance(dist)],
        reg.RANSACConvergenceCriteria(cfg.ransac_iters, 0.999),
    )
    return np.asarray(res.transformation, dtype=np.float64)


def refine_icp(src: np.ndarray, tgt: np.ndarray, T: np.ndarray, cfg: RegistrationConfig) -> np.ndarray:
    """Robust (Tukey) point-to-plane ICP from ``T`` on the voxelised clouds (Open3D)."""
    import open3d as o3d

    reg = o3d.pipelines.registration
    ps = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(src.astype(np.float64)))
    pt = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(tgt.astype(np.float64)))
    pt.estimate_normals(o3d.geometry.KDTreeSearchParamHybrid(radius=2.0 * cfg.voxel_size, max_nn=30))
    loss = reg.TukeyLoss(k=cfg.voxel_size)
    res = reg.registration_icp(
        ps,
        pt,
        2.0 * cfg.voxel_size,
        T,
        reg.TransformationEstimationPointToPlane(loss),
        reg.ICPConvergenceCriteria(max_iteration=cfg.refine_iters),
    )
    return np.asarray(res.transformation, dtype=np.float64)


def verify(
    src: np.ndarray, tgt: np.ndarray, pairs: np.ndarray, T: np.ndarray, dist: float
) -> tuple[int, np.ndarray, float]:
    """Inlier correspondences, their mask and the cloud fitness of ``T``."""
    from scipy.spatial import cKDTree

    moved = geometry.apply_transform(T, src.astype(np.float64))
    if len(pairs):
        mask = np.linalg.norm(moved[pairs[:, 0]] - tgt[pairs[:, 1]], axis=1) < dist
    else:
        mask = np.zeros(0, bool)
    nn_dist, _ = cKDTree(tgt).query(moved, distance_upper_bound=dist)
    fitness = float(np.mean(np.isfinite(nn_dist)))
    return int(mask.sum()), mask, fitness


# ---------------------------------------------------------------------------- entry point

_REGISTRARS: dict[tuple, Registrar] = {}


def register(
    source_xyz: np.ndarray, target_xyz: np.ndarray, config: RegistrationConfig | None = None
) -> RegistrationResult:
    """Register ``(N, 3)`` source points to ``(M, 3)`` target points with SHM_DGR.

    Returns the 4x4 ``transform`` mapping source into target's frame, the correspondences and
    their weights, ``success`` and per-stage timings (ms). Networks are loaded once per config.
    """
    key = dataclasses.astuple(config) if config is not None else ()
    if key not in _REGISTRARS:
        _REGISTRARS[key] = Registrar(config)
    return _REGISTRARS[key].register(source_xyz, target_xyz)


def default_weights_path() -> Path:
    """The shipped weights (``features: auto`` uses them when present)."""
    from s2h_ros.models.checkpoint import DEFAULT_WEIGHTS
    from s2h_ros.paths import WEIGHTS_DIR

    return WEIGHTS_DIR / DEFAULT_WEIGHTS
