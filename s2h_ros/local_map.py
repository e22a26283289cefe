"""The odometry's local map and the fine refinement of a trusted pose against it (no ROS).

Registration (:class:`s2h_ros.pipeline.Registrar`) finds a scan's pose against the current
keyframe and decides whether it is trusted. Its ICP runs on ``voxel_size`` (0.3 m) voxels against
that one keyframe, so every step carries its own error and every keyframe switch passes it on.
The fine refinement then aligns the scan, downsampled at ``map_voxel``, with a local map: the last
``map_keyframes`` keyframe scans at their odometry poses, downsampled at ``map_voxel`` together
(:func:`s2h_ros.geometry.voxel_mean`), their normals computed once per change of keyframes. The
alignment is the pipeline's robust point-to-plane ICP (:func:`s2h_ros.pipeline.refine_icp`) at the
map's voxel size. A new keyframe's map is built on a helper thread from the moment the keyframe
is added, and the next refinement waits for it: the same map as built in line, off the path of
the scans (on a GPU machine the rebuild cost 70 ms of the next step; on a 2-core CPU about 200 ms
of a 64-beam map, where Open3D's neighbour searches, about two thirds of it, hold the interpreter
lock and stall the worker while they run: s2h_ros.surface).

Measured on a held-out VLP-32 drive (world seed 13; maps of five keyframes at ground-truth poses,
starts 5 cm / 0.3 deg off; docs/performance.md): the registration's one-keyframe ICP ends 0.8 cm /
0.185 deg from the truth (medians), this refinement 0.4 cm / 0.033 deg at 0.3 m (the default) and
0.2 cm / 0.017 deg at 0.15 m; small_gicp's GICP against the same map 0.6 cm / 0.080 deg and its
VGICP 1.2-1.9 cm / 0.16-0.20 deg, so the maintained alternatives were measured and are not used.
Over that whole 1 km drive the KITTI drift falls from 1.55 % to 0.10 % (KISS-ICP: 4.1 %).

Nothing here is written by hand but the bookkeeping: which keyframes the map holds, and the rule
that a refinement which moves the trusted pose further than the registration's own agreement
tolerance is not used (:class:`Refinement` says so).
"""
from __future__ import annotations

import time
from collections import deque
from concurrent.futures import Future

import numpy as np

from s2h_ros import geometry
from s2h_ros.config import RegistrationConfig
from s2h_ros.handover import in_background
from s2h_ros.pipeline import CheckedCloud, IcpTarget, Refinement, check_cloud, refine_icp
from s2h_ros.surface import estimate_surface, planar_surface


class LocalMap:
    """The last ``keyframes`` keyframe scans at their poses, and ``refine`` of a pose against them."""

    def __init__(self, voxel: float, keyframes: int, registration: RegistrationConfig | None = None) -> None:
        if keyframes < 1 or voxel <= 0:
            raise ValueError(f"need keyframes >= 1 and voxel > 0, got {keyframes} and {voxel}")
        self.voxel = float(voxel)
        registration = registration or RegistrationConfig()
        # The pipeline's ICP settings (robust kernel, iterations) at the map's voxel size; normals
        # over the registration's neighbourhood, not the finer map's: at 0.15 m a sparse sensor's
        # ground ring alone fills the neighbourhood, its "normal" lies in the ground plane and ICP
        # slides along with the rings (the vlp16 drive in test_odometry: 28 cm after 0.7 m).
        self.icp = registration.replace(voxel_size=self.voxel)
        self.normal_voxel = max(self.voxel, registration.voxel_size)
        self.check_voxel = registration.voxel_size
        self.device = registration.device
        self._scans: deque[tuple[np.ndarray, np.ndarray]] = deque(maxlen=int(keyframes))  # (points, pose)
        self._map: tuple[np.ndarray, np.ndarray, IcpTarget] | None = None  # points, normals, ICP target
        self._building: Future | None = None  # the map of the current keyframes, started by ``add``

    def __len__(self) -> int:
        return len(self._scans)

    def clear(self) -> None:
        self._scans.clear()
        self._map = None
        self._building = None

    def scan(self, points: np.ndarray | CheckedCloud) -> np.ndarray:
        """``(N, >=3)`` points (sensor frame) as ``add`` and ``refine`` take them: ``(M, 3)`` float64,
        downsampled at ``voxel``, of the points the registration keeps (``pipeline.check_cloud``:
        finite, within range of the median: one point at 1e9 m must not break the voxel grid).
        The odometry passes the cloud it checked for ``Registrar.prepare``; raw points are checked
        here and raise ``RegistrationError`` where ``prepare`` would."""
        checked = points if isinstance(points, CheckedCloud) else check_cloud("scan", points, self.check_voxel)
        return geometry.voxel_mean(checked.xyz.astype(np.float64) + checked.origin, self.voxel, self.device)

    def add(self, scan: np.ndarray, pose: np.ndarray) -> None:
        """A keyframe's ``scan`` (from ``scan``) at its ``(4, 4)`` pose; the oldest drops out. The new
        map is built from now on a helper thread, and ``points`` waits for it."""
        self._scans.append((scan, np.asarray(pose, dtype=np.float64)))
        self._map = None
        self._building = in_background(self._build, list(self._scans), name="local map")

    def points(self) -> tuple[np.ndarray, np.ndarray]:
        """The map: ``(P, 3)`` points in the odometry frame, downsampled at ``voxel``, and their
        ``(P, 3)`` normals (computed once per change of keyframes)."""
        return self._surface()[:2]

    def _surface(self) -> tuple[np.ndarray, np.ndarray, IcpTarget]:
        """``points`` and what the ICP aligns a scan to (``icp_min_planarity``: the points without
        line-like neighbourhoods, :func:`s2h_ros.surface.planar_surface`)."""
        if self._map is None:
            building, self._building = self._building, None
            self._map = building.result() if building is not None else self._build(list(self._scans))
        return self._map

    def _build(self, scans: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, IcpTarget]:
        xyz = geometry.voxel_mean(np.concatenate([geometry.apply_transform(pose, scan) for scan, pose in scans]),
                                  self.voxel, self.device)
        surface = estimate_surface(xyz, self.normal_voxel, self.device)
        up = np.mean([pose[:3, 2] for _, pose in scans], axis=0)  # the sensors' z: their rings' axis
        keep, planes = planar_surface(xyz, surface, self.normal_voxel, self.icp.icp_min_planarity,
                                      up / np.linalg.norm(up), self.device)
        return xyz, surface.normals, IcpTarget(xyz[keep], planes)

    def refine(self, scan: np.ndarray, pose: np.ndarray, max_move_m: float, max_turn_deg: float) -> Refinement:
        """``pose`` (4, 4: the scan in the odometry frame, trusted) refined against the map. Used
        when it moves the pose by less than ``max_move_m`` and ``max_turn_deg``: a bigger move is not
        a refinement of a trusted pose but a different answer, so the trusted pose stands and
        ``message`` says so."""
        t0 = time.perf_counter()
        if not self._scans:
            return Refinement(pose, False, "the local map is empty", 0.0, 0.0, 0.0)
        target = self._surface()[2]
        refined = refine_icp(scan, target.xyz, pose, self.icp, target.normals)
        return Refinement.bounded(pose, refined, max_move_m, max_turn_deg,
                                  "the refinement against the local map moved the trusted pose",
                                  1e3 * (time.perf_counter() - t0))
