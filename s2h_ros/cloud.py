"""A cloud checked and prepared for registration: its voxels in a local frame, their features, and
what registrations against it reuse (normals, planarity, the ICP target, a spatial index, a range
image), computed once (no ROS).

Input checking (:func:`check_cloud`): an array must be ``(N, >=3)``; rows with a NaN/inf
coordinate are dropped and counted; so are points more than :func:`range_limit` metres from the
cloud's median along some axis (a stray 1e9 or 1e30 return), and a cloud that is mostly such
points (random or byte-swapped bytes) is refused. Every refusal is a :class:`RegistrationError`
(file readers raise ``PointCloudFileError``, the PointCloud2 codec ``PointCloud2Error``).

Georeferenced clouds: each cloud is centred in float64 on its median rounded to
``ORIGIN_GRID_M`` before anything is cast to float32 (a UTM coordinate of 5e6 m in float32 is
rounded to 0.5 m); every stage runs on those local coordinates and the transform is carried back
exactly, ``T = Tr(o_t) T_local Tr(-o_s)`` (:func:`geometry.shift_transform`). Each cloud keeps its
own origin because a prepared keyframe is registered against many scans and a local scan may be
registered to a georeferenced map; with ``o_s == o_t`` this is the usual ``Tr(o) T Tr(-o)``.
Clouds whose median lies within 500 m of the frame origin get origin 0: they are processed
exactly as they were before centring existed.
"""
from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch

from s2h_ros.config import RegistrationConfig
from s2h_ros.datasets.io import points_shape_problem
from s2h_ros.free_space import range_image
from s2h_ros.hash_grid import DeviceIndex
from s2h_ros.sparse.kernel_map import max_key_span
from s2h_ros.surface import Surface, estimate_normals, estimate_surface, icp_surface, on_device, planar_surface

# Points farther than this from their cloud's median are not measurements: no lidar or depth
# sensor reaches 1e4 m, a 20 km-wide map still fits, and float32 holds local coordinates below
# 16384 m to 1 mm or better. Small voxels lower the limit so that FCGF's kernel-map keys fit int64.
MAX_RANGE_M = 1e4
ORIGIN_GRID_M = 1000.0  # cloud origins are medians rounded to this: 0 for clouds near the origin
FLOAT32_STEP_OF_VOXEL = 0.1  # float32 input rounded to steps above this fraction of a voxel is refused


class RegistrationError(ValueError):
    """The input clouds cannot be registered: wrong shape or dtype, no finite point, mostly absurd
    coordinates, float32 coordinates too far out to be precise, too few voxels, a device or weight
    file that cannot be used. The message names the cloud ("source", "target") and the problem."""


class IcpTarget(NamedTuple):
    """What point-to-plane ICP aligns a scan to (``PreparedCloud.icp_target``)."""

    xyz: np.ndarray  # (K, 3) voxels, local frame
    normals: np.ndarray  # (K, 3) float64 unit normals


@dataclass
class PreparedCloud:
    """A voxelised cloud with its per-voxel features, reusable across many registrations."""

    xyz: np.ndarray  # (M, 3) float32 voxel representatives, metres, relative to ``origin``
    features: torch.Tensor  # (M, C) float32, L2-normalised, on the config's device
    num_input_points: int  # points kept (finite, within range)
    feature_kind: str  # "fcgf" or "fpfh"
    timings: dict[str, float] = field(default_factory=dict)  # ms
    origin: np.ndarray = field(default_factory=lambda: np.zeros(3))  # (3,) float64: input = xyz + origin
    num_non_finite: int = 0  # input rows dropped for a NaN/inf coordinate
    num_out_of_range: int = 0  # input points dropped beyond range_limit() of the median
    # Learned features of a tilted cloud are computed on it levelled (``level_above_deg``,
    # s2h_ros.gravity): ``level`` the (3, 3) rotation that took its ground's up to z (None: the cloud
    # as given), ``tilt_deg`` the up's estimated angle from z (reported whether levelled or not).
    level: np.ndarray | None = None
    tilt_deg: float = 0.0

    _normals: np.ndarray | None = field(default=None, repr=False)
    _surface: Surface | None = field(default=None, repr=False)  # covariances dropped once the ICP target is made
    _icp_target: tuple[float, "IcpTarget"] | None = field(default=None, repr=False)  # (min_planarity, target)
    _tree: object = field(default=None, repr=False)
    _range_image: np.ndarray | None = field(default=None, repr=False)
    # A keyframe's are computed on a helper thread (``warm``) while the worker may already ask for
    # them; the worker then waits for the one in progress, and only for it: ``_lock`` guards the
    # three surface caches above (they are made from one another), ``_tree_lock`` the spatial
    # index and ``_range_lock`` the range image. With one lock for all five, the scan after a
    # keyframe could wait for the keyframe's surface (Open3D) before its tracking support could
    # query the spatial index (RAW KITTI scan at 8000 voxels, 2-core VM: 4-22 ms, now 0).
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)
    _tree_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)
    _range_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)
    _pattern_axis: np.ndarray | None = field(default=None, repr=False)  # asked by the verification only
    # A keyframe's surface and ICP target being computed elsewhere (``surface_in``): (future, min_planarity)
    _elsewhere: tuple[Future, float] | None = field(default=None, repr=False)

    def input_frame_xyz(self) -> np.ndarray:
        """``(M, 3)`` voxels in the input frame: ``xyz`` itself when the origin is 0, else float64."""
        return self.xyz if not self.origin.any() else self.xyz.astype(np.float64) + self.origin

    @property
    def levelled_deg(self) -> float:
        """Degrees the features' view of the cloud was levelled by (0: as given)."""
        return self.tilt_deg if self.level is not None else 0.0

    def feature_frame_xyz(self) -> np.ndarray:
        """``(M, 3)`` float64 voxels as the features saw them: levelled when ``level`` is set."""
        return self.feature_frame(self.xyz.astype(np.float64))

    def feature_frame(self, vectors: np.ndarray) -> np.ndarray:
        """``(..., 3)`` float64 points or directions of this cloud's local frame in the frame its
        features saw (levelled when ``level`` is set, else unchanged)."""
        vectors = np.asarray(vectors, np.float64)
        return vectors if self.level is None else vectors @ self.level.T

    def up(self) -> np.ndarray:
        """``(3,)`` float64 up in the cloud's frame: its ground's when levelled, else z (REP-103)."""
        return np.array([0.0, 0.0, 1.0]) if self.level is None else np.asarray(self.level[2], np.float64)

    def pattern_axis(self) -> np.ndarray:
        """``(3,)`` float64 the axis its scan pattern (a lidar's rings) is drawn about, in the cloud's
        frame (``s2h_ros.scan_pattern``): z unless it was levelled and its rings say its ground's up."""
        if self._pattern_axis is None:
            from s2h_ros.scan_pattern import pattern_axis

            self._pattern_axis = pattern_axis(self.input_frame_xyz(), self.up())
        return self._pattern_axis

    @property
    def device(self) -> torch.device:
        """Where the features are (the CPU for a cloud without features)."""
        return self.features.device if self.features is not None else torch.device("cpu")

    def normals(self, voxel_size: float) -> np.ndarray:
        """``(M, 3)`` float64 unit normals of the voxels (:mod:`s2h_ros.surface`, on the features'
        device), computed once: alone (a scan's tests ask only these) unless the surface came first."""
        with self._lock:
            if self._normals is None:
                self._normals = estimate_normals(self.xyz, voxel_size, self.device)
            return self._normals

    def planarity(self, voxel_size: float) -> np.ndarray:
        """``(M,)`` planarity of each voxel's normal neighbourhood (:mod:`s2h_ros.surface`), computed once."""
        return self.surface(voxel_size).planarity

    def surface(self, voxel_size: float) -> Surface:
        """The voxels' normals, planarity and neighbourhood covariances from one neighbour search
        (:mod:`s2h_ros.surface`, on the features' device), computed once; normals computed before
        stay the cloud's normals."""
        with self._lock:
            self._take_elsewhere()
            if self._surface is None:
                found = estimate_surface(self.xyz, voxel_size, self.device)
                if self._normals is None:
                    self._normals = found.normals
                self._surface = found._replace(normals=self._normals)
            return self._surface

    def icp_target(self, cfg: RegistrationConfig) -> "IcpTarget":
        """The voxels point-to-plane ICP aligns a scan to and their normals (``icp_min_planarity``:
        without line-like neighbourhoods, :func:`s2h_ros.surface.planar_surface`), computed once."""
        if not cfg.icp_min_planarity > 0:
            return IcpTarget(self.xyz, self.normals(cfg.voxel_size))
        found, axis = self.surface(cfg.voxel_size), self.pattern_axis()  # takes what surface_in asked for
        with self._lock:
            if self._icp_target is None or self._icp_target[0] != cfg.icp_min_planarity:
                keep, unit = planar_surface(self.xyz, found, cfg.voxel_size, cfg.icp_min_planarity, axis, self.device)
                self._icp_target = (cfg.icp_min_planarity, IcpTarget(self.xyz[keep], unit))
                self._surface = found._replace(covariances=None)  # 72 bytes a voxel, not kept with a keyframe
            return self._icp_target[1]

    def surface_in(self, submit: Callable[..., Future], cfg: RegistrationConfig) -> None:
        """Have ``submit(fn, *args) -> Future`` (``s2h_ros.handover.in_low_priority_process``) compute
        the surface and the ICP target (``s2h_ros.surface.icp_surface``), which ``surface`` and
        ``icp_target`` then take, waiting for them. On the CPU only: there Open3D computes them and
        holds the interpreter lock while it does (a keyframe's 8000 voxels: about 40 ms in which the
        scan's threads stall); a GPU device's torch path holds none. Computed here after all when
        the other side fails."""
        if on_device(self.device) or not cfg.icp_min_planarity > 0:
            return
        axis = self.pattern_axis()
        with self._lock:
            if self._surface is None and self._elsewhere is None:
                self._elsewhere = (submit(icp_surface, self.xyz, cfg.voxel_size, cfg.icp_min_planarity, axis,
                                          self._normals), cfg.icp_min_planarity)

    def _take_elsewhere(self) -> None:
        """Under ``_lock``: what ``surface_in`` asked for, waiting for it; nothing when it failed."""
        if self._elsewhere is None:
            return
        (pending, min_planarity), self._elsewhere = self._elsewhere, None
        try:
            found, keep, unit = pending.result()
        except Exception:  # noqa: BLE001 - e.g. the helper process died: computed here when asked
            return
        if self._normals is None:
            self._normals = found.normals
        self._surface = found._replace(normals=self._normals)
        self._icp_target = (min_planarity, IcpTarget(self.xyz[keep], unit))

    def spatial_index(self):
        """The voxels' neighbour search with cKDTree's ``query``, built once (a keyframe serves many
        scans): scipy's cKDTree on the CPU, :class:`s2h_ros.hash_grid.DeviceIndex` on a GPU device."""
        with self._tree_lock:
            if self._tree is None:
                if on_device(self.device):
                    self._tree = DeviceIndex(self.xyz, self.device)
                else:
                    from scipy.spatial import cKDTree

                    self._tree = cKDTree(self.xyz)
            return self._tree

    def range_image(self) -> np.ndarray:
        """The voxels' view from the input frame's origin (``s2h_ros.free_space.range_image``: the
        nearest return per direction), built once."""
        with self._range_lock:
            if self._range_image is None:
                self._range_image = range_image(self.input_frame_xyz())
            return self._range_image

    def warm(self, cfg: RegistrationConfig) -> None:
        """Compute now what a keyframe's registrations ask for (spatial index, normals, planarity,
        ICP target), in the order they ask; an error is left for the registration that asks to raise."""
        try:
            self.spatial_index()
            self.surface(cfg.voxel_size)  # normals and planarity from one search when no normals came first
            self.icp_target(cfg)
        except Exception:  # noqa: BLE001 - the worker computes it again and raises there
            pass

    def subset(self, index: np.ndarray, features: torch.Tensor | None = None) -> "PreparedCloud":
        """The voxels ``index`` ``(K,)`` int64 with their rows of ``features`` ``(M, C)`` (default: this
        cloud's; e.g. those of the cloud turned to a heading), same origin (nothing cached is shared)."""
        features = self.features if features is None else features
        return dataclasses.replace(self, xyz=self.xyz[index], features=features[torch.as_tensor(index, device=features.device)],
                                   _normals=None, _surface=None, _icp_target=None, _tree=None, _range_image=None,
                                   _pattern_axis=None, _elsewhere=None)


def range_limit(voxel: float) -> float:
    """Metres from a cloud's median (per axis) beyond which points are dropped: ``MAX_RANGE_M``,
    or less at voxels under about 1.2 cm, where the cloud's span must stay hashable."""
    return min(MAX_RANGE_M, (max_key_span(3) // 2 - 1) * voxel)


@dataclass
class CheckedCloud:
    """A cloud after :func:`check_cloud`: float32 coordinates relative to a float64 origin."""

    xyz: np.ndarray  # (N, 3) float32, metres, relative to origin
    origin: np.ndarray  # (3,) float64
    num_non_finite: int
    num_out_of_range: int


def check_cloud(name: str, xyz: np.ndarray | torch.Tensor, voxel: float) -> CheckedCloud:
    """Validate an ``(N, >=3)`` cloud and centre it in float64 (see the module docstring).

    Raises :class:`RegistrationError` naming ``name`` for a wrong shape or dtype, no finite point,
    a majority of points beyond :func:`range_limit`, or float32 input whose rounding step at the
    cloud's distance from the frame origin exceeds ``FLOAT32_STEP_OF_VOXEL`` voxels.
    """
    if isinstance(xyz, torch.Tensor):
        xyz = xyz.detach().cpu().numpy()
    xyz = np.asarray(xyz)
    problem = points_shape_problem(xyz.shape)
    if problem:
        raise RegistrationError(f"{name}: {problem}")
    if xyz.dtype.kind not in "fiu":
        raise RegistrationError(f"{name}: expected numeric coordinates, got dtype {xyz.dtype}")
    xyz = xyz[:, :3] if xyz.dtype.kind == "f" else xyz[:, :3].astype(np.float64)
    finite = np.isfinite(xyz).all(axis=1)
    num_finite = int(finite.sum())
    if num_finite == 0:
        raise RegistrationError(f"{name} has no finite points ({len(xyz)} given)")
    if num_finite < len(xyz):
        xyz = xyz[finite]
    median = np.median(xyz, axis=0)
    limit = range_limit(voxel)
    with np.errstate(over="ignore", invalid="ignore"):
        near = (np.abs(xyz - median) <= limit).all(axis=1)
    num_far = int(len(xyz) - near.sum())
    if 2 * num_far > len(xyz):
        raise RegistrationError(
            f"{name}: {num_far} of {len(xyz)} finite points lie more than {limit:g} m from the cloud's "
            f"median along some axis: not metric coordinates (random, corrupt or byte-swapped data?)"
        )
    if num_far:
        xyz = xyz[near]
    if xyz.dtype.itemsize < 8:
        reach = np.abs(xyz).max()
        step = float(np.spacing(reach))
        if step > FLOAT32_STEP_OF_VOXEL * voxel:
            raise RegistrationError(
                f"{name}: {xyz.dtype} coordinates reach {float(reach):.4g} m, where {xyz.dtype} is rounded to "
                f"{step:g} m steps (more than {FLOAT32_STEP_OF_VOXEL:g} of the {voxel:g} m voxel): pass float64 "
                f"coordinates, or coordinates centred near the origin"
            )
    origin = np.round(median.astype(np.float64) / ORIGIN_GRID_M) * ORIGIN_GRID_M
    local = (xyz - origin).astype(np.float32) if origin.any() else xyz.astype(np.float32, copy=False)
    return CheckedCloud(local, origin, len(finite) - num_finite, num_far)
