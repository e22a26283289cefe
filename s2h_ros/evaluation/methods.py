"""Registration methods as the harness sees them, and the registry that names them.

A *pair method* has ``register(source (N, 3), target (M, 3)) -> result`` where the result
carries ``.transform`` (4, 4) mapping source into target's frame, ``.success`` and a
``.timings`` dict of seconds per stage. A *sequence method* has ``odometry(sequence) ->
(len, 4, 4)`` sensor poses in the first scan's frame. The harness chains any pair method
frame to frame when it has no ``odometry`` of its own.

Methods are built by name through :data:`METHODS` and imported only when asked for, so a
method whose code or dependency is missing (``s2h`` before ``s2h_ros.pipeline`` exists,
KISS-ICP when ``kiss_icp`` is not installed) fails with :class:`MethodUnavailable` naming the
problem, never with an ImportError when the evaluation package is imported.
"""
from __future__ import annotations

import importlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, runtime_checkable

import numpy as np

from s2h_ros.datasets.types import Sequence


class MethodUnavailable(RuntimeError):
    """A method was named that cannot run in this installation (missing code or package)."""


@dataclass
class MethodResult:
    """What a baseline's ``register`` returns (the pipeline returns its own, richer result)."""

    transform: np.ndarray  # (4, 4) float64, maps source into target's frame
    success: bool
    timings: dict[str, float] = field(default_factory=dict)  # stage -> seconds
    info: dict[str, Any] = field(default_factory=dict)  # e.g. fitness, inlier count
    # (K, 2, 3) source and target point of each match in the input frames, and the distance within
    # which a match counts as an inlier: the harness scores them against the truth (None: no matches)
    matches: np.ndarray | None = None
    match_inlier_distance: float | None = None


@runtime_checkable
class PairMethod(Protocol):
    name: str

    def register(self, source: np.ndarray, target: np.ndarray) -> Any: ...


@runtime_checkable
class SequenceMethod(Protocol):
    name: str

    def odometry(self, sequence: Sequence) -> np.ndarray: ...


# Dataset scale -> the settings every method is tuned to (voxel in metres).
SCALES: dict[str, dict[str, float]] = {
    "outdoor": {"voxel": 0.3},  # KITTI-like lidar (DGR protocol)
    "indoor": {"voxel": 0.05},  # 3DMatch-like depth fragments
}


@dataclass(frozen=True)
class MethodSpec:
    module: str  # imported lazily
    factory: str  # attribute of module: callable(scale: str, **overrides) -> method
    kinds: tuple[str, ...]  # "pairs", "sequence"
    help: str


METHODS: dict[str, MethodSpec] = {
    "fpfh_ransac": MethodSpec(
        "s2h_ros.evaluation.baselines", "FpfhRansac", ("pairs", "sequence"),
        "Open3D FPFH + RANSAC (mutual filter, edge-length and distance checkers)"),
    "fpfh_fgr": MethodSpec(
        "s2h_ros.evaluation.baselines", "FpfhFgr", ("pairs", "sequence"),
        "Open3D FPFH + Fast Global Registration"),
    "icp": MethodSpec(
        "s2h_ros.evaluation.baselines", "PointToPlaneIcp", ("pairs", "sequence"),
        "Open3D point-to-plane ICP from identity (pairs) or the previous motion (sequences)"),
    "kiss_icp": MethodSpec(
        "s2h_ros.evaluation.baselines", "KissIcp", ("sequence",),
        "KISS-ICP odometry (kiss_icp package)"),
    "s2h": MethodSpec(
        "s2h_ros.evaluation.methods", "PipelineMethod", ("pairs", "sequence"),
        "SHM_DGR: s2h_ros.pipeline.register (FCGF + S2H matching + weighted Procrustes)"),
}


def split_variant(name: str) -> tuple[str, str]:
    """``"s2h:matcher=nn+k=8"`` -> ``("s2h", "matcher=nn+k=8")``; plain names have an empty variant.

    A variant changes ``RegistrationConfig`` fields of the ``s2h`` method, so ablations run side
    by side under their own names in one evaluation.
    """
    base, _, variant = name.partition(":")
    return base, variant


def make_method(name: str, scale: str = "outdoor", **overrides: Any) -> Any:
    """Build the method registered as ``name`` (or an ``s2h:KEY=VALUE+...`` variant) for ``scale``."""
    name, variant = split_variant(name)
    if variant:
        if name != "s2h":
            raise ValueError(f"only s2h takes KEY=VALUE variants, not {name!r}")
        overrides["variant"] = variant
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r} (choose from {', '.join(METHODS)})")
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r} (choose from {', '.join(SCALES)})")
    spec = METHODS[name]
    try:
        module = importlib.import_module(spec.module)
    except ImportError as err:
        raise MethodUnavailable(f"method {name!r} cannot be imported: {err}") from err
    factory: Callable[..., Any] = getattr(module, spec.factory)
    return factory(scale=scale, **overrides)


def _fine_info(fine) -> dict:
    """The fine stage's outcome as flat numbers for a pair record (records keep scalars only):
    whether it was used and how far it moved the refined result; nothing where it did not run."""
    if fine is None:
        return {}
    return {"fine_used": bool(fine.used), "fine_moved_m": float(fine.moved_m), "fine_moved_deg": float(fine.moved_deg)}


class PipelineMethod:
    """The SHM_DGR pipeline (``s2h_ros.pipeline.register``) as a pair method named ``s2h``, and on
    sequences the keyframe odometry the node runs (``odometry``).

    Without an explicit ``config`` it uses the pipeline's defaults with the scale's voxel size
    (inlier distance 2 x voxel, as DGR) and ``device``; ``variant`` (``"matcher=nn+k=8"``)
    changes config fields on top. The pipeline reports stage timings in
    milliseconds; they are converted to seconds like every other method's. The result carries
    the S2H matches (``matches``) so that the harness can count those the truth confirms.
    """

    name = "s2h"

    def __init__(self, scale: str = "outdoor", config: Any = None, voxel: float | None = None,
                 device: str | None = None, variant: str = "", **_: Any):
        try:
            pipeline = importlib.import_module("s2h_ros.pipeline")
            self._register = pipeline.register
        except (ImportError, AttributeError) as err:
            raise MethodUnavailable(
                "method 's2h' needs s2h_ros.pipeline.register(source_xyz, target_xyz, config), "
                f"which this checkout does not provide ({err})") from err
        from s2h_ros.config import RegistrationConfig, parse_overrides

        if config is None:
            v = voxel if voxel is not None else SCALES[scale]["voxel"]
            config = RegistrationConfig(voxel_size=v, inlier_distance=2.0 * v, device=device or "cpu")
        if variant:
            config = config.replace(**parse_overrides(RegistrationConfig, variant))
        self.config = config
        self.name = f"s2h:{variant}" if variant else "s2h"

    def odometry(self, sequence: Sequence) -> np.ndarray:
        """``(len, 4, 4)`` poses from the keyframe odometry the node runs (``s2h_ros.odometry``:
        tracking, global search, trust, the local map), scans in order with
        their stamps (0.1 s apart where a scan has none). A scan it does not trust keeps the last
        trusted pose, as the replay evaluation holds it; ``odometry_info`` counts them."""
        from s2h_ros.config import OdometryConfig
        from s2h_ros.odometry import KeyframeOdometry
        from s2h_ros.pipeline import Registrar

        odo = KeyframeOdometry(odometry=OdometryConfig(), registrar=Registrar(self.config))
        poses, pose = [], np.eye(4)
        counts: Counter[str] = Counter()
        for i, scan in enumerate(sequence):
            stamp = getattr(scan, "stamp", None)
            step = odo.step(scan.points, float(stamp) if stamp is not None else 0.1 * i, times=getattr(scan, "times", None))
            if step.success:
                pose = step.pose
            counts["trusted" if step.success else "not_trusted"] += 1
            if step.event:
                counts[step.event] += 1
            poses.append(pose)
        self.odometry_info = dict(counts)
        return np.stack(poses)

    def register(self, source: np.ndarray, target: np.ndarray) -> MethodResult:
        r = self._register(source, target, config=self.config)
        pairs = np.asarray(r.correspondences, dtype=np.int64).reshape(-1, 2)
        matches = np.stack([np.asarray(r.source_xyz, np.float64)[pairs[:, 0]],
                            np.asarray(r.target_xyz, np.float64)[pairs[:, 1]]], axis=1)
        return MethodResult(
            transform=np.asarray(r.transform, dtype=np.float64), success=bool(r.success),
            timings={k: v / 1e3 for k, v in r.timings.items() if k != "total"},
            info={"message": r.message, "correspondences": len(r.correspondences), "inliers": r.num_inliers,
                  "inlier_ratio": r.inlier_ratio, "fitness": r.fitness, "structure_fit": r.structure_fit,
                  "used_fallback": r.used_fallback, "fallback": r.fallback, "slid_m": r.slid_m,
                  "feature_kind": r.feature_kind, "heading_deg": float(getattr(r, "heading_deg", 0.0)),
                  **_fine_info(getattr(r, "fine", None))},
            matches=matches, match_inlier_distance=float(self.config.inlier_distance))
