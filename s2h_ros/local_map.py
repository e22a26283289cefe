"""The odometry's local map and the fine refinement of a trusted pose against it (no ROS).

Registration (:class:`s2h_ros.pipeline.Registrar`) finds a scan's pose against the current
keyframe and decides whether it is trusted. Its ICP runs on ``voxel_size`` (0.3 m) voxels against
that one keyframe, so every step carries its own error and every keyframe switch passes it on.
The fine refinement then aligns the scan, downsampled at ``map_voxel``, with a local map: the last
``map_keyframes`` keyframe scans at their odometry poses, downsampled at ``map_voxel`` together
(:func:`s2h_ros.geometry.voxel_mean`), their normals computed once per change of keyframes. The
alignment is the pipeline's robust point-to-plane ICP (:func:`s2h_ros.refinement.refine_icp`) at the
map's voxel size. A map of five 64-beam keyframes (about 64k voxels) costs about 0.3 s of CPU on
the 2-core VM, two thirds of it Open3D's neighbour searches, which hold the interpreter lock while
they run (s2h_ros.surface). It is built from the moment a keyframe is added, one of two ways
(``OdometryConfig.map_in_background``):

- **in the helper process** (default; :func:`s2h_ros.handover.in_low_priority_process`, at a lower
  priority, on the CPU: the same numbers as the device's path). Scans go on being refined against the
  newest map built by then, some keyframes behind the current ones
  (``Refinement.map_behind``), while the new one takes what the scans' threads leave of the cores
  and none of their interpreter lock. A scan that becomes a keyframe (``newest``) is refined
  against the map of the current keyframes, waiting for it: keyframes carry the track on, and a
  version that let them align to an older map drifted 3.5x as far (held-out VLP-16 drive, world
  992, lock-step: KITTI drift 0.030 -> 0.106 %). A build superseded before it started is not run.
- **on a helper thread**, and the next refinement waits for it: every pose independent of timing
  (offline evaluation), the map built on the registration's device (on a GPU machine the rebuild
  cost 70 ms of the next step).

Measured with both on held-out simulated drives (docs/performance.md, "The local map in a
low-priority process"): at 10 Hz on the 2-core VM, HDL-64 world 924, three runs each alternating,
latency p95 422-482 against 554-589 ms and 5.9-7.1 against 5.1-5.6 scans/s (VLP-32 world 993: no
difference beyond the runs' spread); in lock-step the same KITTI drift (VLP-16 world 992 0.030 /
0.030 %, VLP-32 world 993 0.053 / 0.055 %, HDL-64 world 994 0.031 / 0.032 %). The helper process
holds 370-390 MB resident (torch's and Open3D's libraries, mostly pages the node maps too).

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
from concurrent.futures.process import BrokenProcessPool
from typing import NamedTuple

import numpy as np

from s2h_ros import geometry
from s2h_ros.cloud import CheckedCloud, IcpTarget, check_cloud
from s2h_ros.config import RegistrationConfig
from s2h_ros.handover import in_background, in_low_priority_process, start_helper_process
from s2h_ros.refinement import refine_icp
from s2h_ros.registration_result import Refinement
from s2h_ros.surface import estimate_surface, planar_surface


# Seconds the construction waits for the helper process to start and import this module (about
# 3 s of CPU on the 2-core VM; a loaded machine may take several times that).
HELPER_START_TIMEOUT_S = 120.0


class MapSurface(NamedTuple):
    """A local map (``build_map``): its points, their normals and what the ICP aligns a scan to."""

    xyz: np.ndarray  # (P, 3) float64 points in the odometry frame, downsampled at the map's voxel
    normals: np.ndarray  # (P, 3) float64 unit normals
    target: IcpTarget  # the points with planes (``icp_min_planarity``, surface.planar_surface) and their normals
    keyframes: int  # keyframe scans it holds


def build_map(scans: list[tuple[np.ndarray, np.ndarray]], voxel: float, normal_voxel: float, min_planarity: float,
              device: str = "cpu") -> MapSurface:
    """The map of keyframe ``scans`` ((M_i, 3) points in their sensor frames, (4, 4) poses):
    downsampled at ``voxel`` together, normals over ``normal_voxel``'s neighbourhood (computed once per
    change of keyframes), the ICP target of the points without line-like neighbourhoods."""
    xyz = geometry.voxel_mean(np.concatenate([geometry.apply_transform(pose, scan) for scan, pose in scans]),
                              voxel, device)
    surface = estimate_surface(xyz, normal_voxel, device)
    up = np.mean([pose[:3, 2] for _, pose in scans], axis=0)  # the sensors' z: their rings' axis
    keep, planes = planar_surface(xyz, surface, normal_voxel, min_planarity, up / np.linalg.norm(up), device)
    return MapSurface(xyz, surface.normals, IcpTarget(xyz[keep], planes), len(scans))


class LocalMap:
    """The last ``keyframes`` keyframe scans at their poses, and ``refine`` of a pose against them."""

    def __init__(self, voxel: float, keyframes: int, registration: RegistrationConfig | None = None,
                 background: bool = True) -> None:
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
        self.background = background  # module text; False after all when the helper does not start
        self.fallback = ""  # why not, then
        self._scans: deque[tuple[np.ndarray, np.ndarray]] = deque(maxlen=int(keyframes))  # (points, pose)
        self._map: MapSurface | None = None  # the newest built map taken up
        # maps started by ``add``, oldest first: the build, ``build_map``'s arguments, and ``_added`` when it started
        self._builds: deque[tuple[Future, tuple, int]] = deque()
        self._added = self._map_added = 0  # keyframes added so far; when the map taken up was started
        self.held = 0  # keyframe scans in the map that the last refinement used
        if self.background:
            self._start_helper()

    def _start_helper(self) -> None:
        """Wait until the helper process runs with this module imported (``start_helper_process``),
        so that its start costs the scans nothing; one that does not start leaves the map to a thread,
        and ``fallback`` says why."""
        try:
            start_helper_process(__name__, optional=("open3d",)).result(timeout=HELPER_START_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - any failure to start: the thread builds the same maps
            self.background = False
            self.fallback = f"the helper process did not start ({type(exc).__name__}: {exc}): built on a thread"

    def where(self) -> str:
        """Where maps are built, for a log line: "helper process" or "thread" (and why, when asked otherwise)."""
        return "helper process" if self.background else "thread" + (f" ({self.fallback})" if self.fallback else "")

    def __len__(self) -> int:
        return len(self._scans)

    def clear(self) -> None:
        self._scans.clear()
        self._map = None
        for build, *_ in self._builds:
            build.cancel()
        self._builds.clear()

    def scan(self, points: np.ndarray | CheckedCloud) -> np.ndarray:
        """``(N, >=3)`` points (sensor frame) as ``add`` and ``refine`` take them: ``(M, 3)`` float64,
        downsampled at ``voxel``, of the points the registration keeps (``cloud.check_cloud``:
        finite, within range of the median: one point at 1e9 m must not break the voxel grid).
        The odometry passes the cloud it checked for ``Registrar.prepare``; raw points are checked
        here and raise ``RegistrationError`` where ``prepare`` would."""
        checked = points if isinstance(points, CheckedCloud) else check_cloud("scan", points, self.check_voxel)
        return geometry.voxel_mean(checked.xyz.astype(np.float64) + checked.origin, self.voxel, self.device)

    def add(self, scan: np.ndarray, pose: np.ndarray) -> None:
        """A keyframe's ``scan`` (from ``scan``) at its ``(4, 4)`` pose; the oldest drops out. Its
        map is built from now on (module text); one still waiting to start is not built."""
        self._scans.append((scan, np.asarray(pose, dtype=np.float64)))
        self._added += 1
        for build, *_ in self._builds:
            build.cancel()
        args = (list(self._scans), self.voxel, self.normal_voxel, self.icp.icp_min_planarity)
        build = (in_low_priority_process(build_map, *args) if self.background
                 else in_background(build_map, *args, self.device, name="local map"))
        self._builds.append((build, args, self._added))

    def points(self) -> tuple[np.ndarray, np.ndarray]:
        """The map of the current keyframes (waiting for it): ``(P, 3)`` points in the odometry
        frame, downsampled at ``voxel``, and their ``(P, 3)`` normals."""
        surface = self._surface(newest=True)
        return surface.xyz, surface.normals

    def _surface(self, newest: bool) -> MapSurface:
        """With ``newest`` (or in the foreground, or before any map is built) the map of the current
        keyframes, waiting for its build; else the newest map built by now."""
        if newest or not self.background or self._map is None:
            ready = len(self._builds)
        else:  # one helper process: maps finish in the order they were started
            ready = next((i for i, (build, *_) in enumerate(self._builds) if not build.done()), len(self._builds))
        taken = [self._builds.popleft() for _ in range(ready)]
        usable = [(build, args, added) for build, args, added in taken if not build.cancelled()]
        if usable:
            build, args, self._map_added = usable[-1]
            self._map = self._built(build, args)
        return self._map

    def _built(self, build: Future, args: tuple) -> MapSurface:
        """A build's map; built here from its ``build_map`` arguments when the helper process died under it."""
        try:
            return build.result()
        except BrokenProcessPool:
            return build_map(*args, self.device)

    def refine(self, scan: np.ndarray, pose: np.ndarray, max_move_m: float, max_turn_deg: float,
               newest: bool = False) -> Refinement:
        """``pose`` (4, 4: the scan in the odometry frame, trusted) refined against the map: the
        newest built by now, or with ``newest`` that of the current keyframes, waiting for it (a
        scan that becomes a keyframe: module text); ``map_behind`` says how many keyframes behind
        the map was. Used when it moves the pose by less than ``max_move_m`` and ``max_turn_deg``:
        a bigger move is not a refinement of a trusted pose but a different answer, so the trusted
        pose stands and ``message`` says so."""
        t0 = time.perf_counter()
        if not self._scans:
            return Refinement(pose, False, "the local map is empty", 0.0, 0.0, 0.0)
        surface = self._surface(newest)
        self.held = surface.keyframes
        refined = refine_icp(scan, surface.target.xyz, pose, self.icp, surface.target.normals)
        refinement = Refinement.bounded(pose, refined, max_move_m, max_turn_deg,
                                        "the refinement against the local map moved the trusted pose",
                                        1e3 * (time.perf_counter() - t0))
        refinement.map_behind = self._added - self._map_added
        return refinement
