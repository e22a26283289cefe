"""Synthetic scan sequences with exact poses, registration pairs, and the KITTI odometry layout.

``simulate_sequence`` drives a sensor through a ``SyntheticWorld`` and renders scans on demand
(deterministic per frame, so nothing needs to stay in memory); ``synthetic_pairs`` draws scans
at least ``min_distance`` apart with the exact transform between them (DGR's KITTI protocol
uses pairs >= 10 m apart). Written sequences follow KITTI odometry exactly: ``velodyne/NNNNNN.bin``
(N x 4 float32 x, y, z, reflectance), ``poses.txt`` holding camera-0 poses P_i with
pose_velo_i = Tr^-1 P_i Tr, ``calib.txt`` with KITTI's real ``Tr`` (Velodyne -> camera-0) by
default, and ``times.txt``.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from s2h_ros import paths
from s2h_ros.outputs import write_json
from s2h_ros.datasets.kitti import POINT_TIMES, velodyne_to_camera, write_poses
from s2h_ros.datasets.synthetic.primitives import MeshBuilder
from s2h_ros.datasets.synthetic.scene import SyntheticWorld, seeded_rng
from s2h_ros.datasets.synthetic.sensor import LidarModel
from s2h_ros.datasets.synthetic.town import add_cars
from s2h_ros.datasets.synthetic.trajectory import Trajectory, rot_y
from s2h_ros.datasets.types import PointCloudPair, Scan

KITTI_CALIB = paths.SAMPLES_DIR / "kitti" / "calib" / "00.txt"


@dataclass
class SyntheticScan(Scan):
    """A simulated scan; ``ring`` is each point's beam index (image row for a depth camera)."""

    ring: np.ndarray | None = None  # (N,) int16


def _rotate(v: np.ndarray, R: np.ndarray) -> np.ndarray:
    """(N, 3) float32 vectors rotated by (3, 3) R, as three axpy's: a BLAS matmul on such a skinny
    array can cost 80 ms when OpenBLAS threads compete with Open3D's ray-casting threads."""
    R = R.astype(np.float32)
    return v[:, 0:1] * R[:, 0] + v[:, 1:2] * R[:, 1] + v[:, 2:3] * R[:, 2]


class SyntheticSequence:
    """A simulated drive (implements ``s2h_ros.datasets.types.Sequence``); scans render on access.

    ``poses`` are the exact sensor poses in the first scan's frame (``poses[0]`` is identity);
    ``world_poses`` are the same in the world's frame, where the geometry lives.
    """

    def __init__(self, world: SyntheticWorld, trajectory: Trajectory, sensor: LidarModel, stamps: np.ndarray,
                 seed: int, noise: bool = True, motion_distortion: bool = False, moving_objects: int = 0,
                 name: str = "") -> None:
        self.world, self.trajectory, self.sensor = world, trajectory, sensor
        self.stamps = np.asarray(stamps, np.float64)
        self.seed, self.noise, self.motion_distortion = int(seed), bool(noise), bool(motion_distortion)
        label = world.kind if world.family in ("town", "rooms") else world.family
        self.name = name or f"synthetic_{label}_{sensor.name}_seed{seed}"
        self.world_poses = self.sensor_poses(self.stamps)
        self._origin_inv = np.linalg.inv(self.world_poses[0])
        self._dirs = sensor.ray_directions()  # (R, C, 3)
        self._local = self._dirs.reshape(-1, 3).astype(np.float32)
        self._ring = np.repeat(np.arange(self._dirs.shape[0], dtype=np.int16), self._dirs.shape[1])
        self._movers = _movers(world, seed, moving_objects)

    def sensor_poses(self, t: np.ndarray) -> np.ndarray:
        """(M, 4, 4) world poses of the sensor at times (M,): the vehicle's, at the sensor's mount
        height (the world's default when the model has none) and pitched down by its tilt."""
        T = self.trajectory.poses(t, height=self.sensor.mount_height)
        if self.sensor.tilt_deg:
            T[:, :3, :3] = T[:, :3, :3] @ rot_y(np.full(len(T), np.radians(self.sensor.tilt_deg)))
        return T

    def __len__(self) -> int:
        return len(self.stamps)

    def __iter__(self) -> Iterator[SyntheticScan]:
        return (self[i] for i in range(len(self)))

    @property
    def poses(self) -> np.ndarray:
        """(len, 4, 4) float64 exact sensor poses in the first scan's frame."""
        return self._origin_inv[None] @ self.world_poses

    def __getitem__(self, i: int) -> SyntheticScan:
        if not -len(self) <= i < len(self):
            raise IndexError(f"scan {i} out of range for a sequence of {len(self)}")
        i = i % len(self)
        t = self.stamps[i]
        rays, local = self._dirs, self._local
        if self.sensor.projection == "rosette":  # the pattern drifts from scan to scan
            rays = self.sensor.ray_directions(t)
            local = rays.reshape(-1, 3).astype(np.float32)
        R, C, _ = rays.shape
        times = None
        if self.motion_distortion and self.sensor.projection != "pinhole":
            fired = self.sensor.column_times()  # (C,) seconds relative to the stamp
            times = np.broadcast_to(fired[None, :], (R, C)).reshape(-1)
            T = self.sensor_poses(t + fired)  # (C, 4, 4) pose at each firing
            dirs = np.einsum("cij,rcj->rci", T[:, :3, :3], rays).reshape(-1, 3)
            origins = np.broadcast_to(T[None, :, :3, 3], (R, C, 3)).reshape(-1, 3)
        else:
            T = self.world_poses[i]
            dirs = _rotate(local, T[:3, :3])
            origins = np.broadcast_to(T[:3, 3].astype(np.float32), dirs.shape)
        self.world.prepare(self.world_poses[i][:2, 3], self.sensor.max_range)
        hits = self.world.cast(origins, dirs, extra=self._movers_mesh(t))
        ranges, reflectance = self.sensor.measure(hits, local, seeded_rng(self.seed, 3, i), noise=self.noise)
        valid = np.isfinite(ranges)
        points = local[valid] * ranges[valid, None]
        return SyntheticScan(stamp=float(t), points=points, pose=self._origin_inv @ self.world_poses[i],
                             intensity=reflectance[valid], frame_id="velodyne", index=i, ring=self._ring[valid],
                             times=None if times is None else times[valid].astype(np.float64))

    def _movers_mesh(self, t: float) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Moving cars (outdoor) or walking people (indoor) at time t, placed along the route."""
        if not self._movers:
            return None
        mb = MeshBuilder()
        s_ego = float(self.trajectory.arc_at(t))
        rng = seeded_rng(self.seed, 4, 0)  # shapes are fixed per sequence
        for m in self._movers:
            s = s_ego + m.gap + m.sway * np.sin(m.omega * t + m.phase) if m.lead else m.s0 - m.speed * t
            ground, yaw = self.trajectory.ground_pose(np.array([s]), lateral=m.lateral)
            yaw = yaw + (0.0 if m.lead else np.pi)
            if self.world.kind == "outdoor":
                add_cars(mb, ground[:, :2], yaw, ground[:, 2], rng)
            else:
                mb.add_boxes(ground + [0.0, 0.0, 0.85], [[0.35, 0.5, 1.7]], yaw, 0.4)
        return mb.build()

    def describe(self) -> dict:
        """What produced this sequence (written next to it as simulation.json)."""
        return {"name": self.name, "seed": self.seed, "kind": self.world.kind, "family": self.world.family,
                "sensor": self.sensor.name,
                "frames": len(self), "noise": self.noise, "motion_distortion": self.motion_distortion,
                "moving_objects": len(self._movers),
                "length_m": round(float(self.trajectory.arc_at(self.stamps[-1])), 3),
                "note": "poses.txt holds camera-0 poses; pose_velo_i = Tr^-1 P_i Tr (KITTI convention)"}

    def write_kitti(self, out_dir: str | Path, Tr: np.ndarray | None = None, progress: bool = False) -> dict:
        """Render every scan, write the KITTI odometry layout plus ``simulation.json``; return that summary."""
        out = Path(out_dir)
        counts: list[int] = []
        t0 = time.perf_counter()

        def scans() -> Iterator[SyntheticScan]:
            for scan in self:
                counts.append(len(scan.points))
                yield scan

        it = scans()
        if progress:
            from tqdm import tqdm

            it = tqdm(it, total=len(self), desc="simulate", unit="scan")
        write_kitti_layout(out, it, self.poses, self.stamps, Tr)
        summary = {**self.describe(), "points_per_scan_mean": round(float(np.mean(counts)), 1),
                   "seconds_per_scan_incl_io": round((time.perf_counter() - t0) / len(self), 4)}
        write_json(out / "simulation.json", summary)
        return summary


def write_kitti_layout(out_dir: str | Path, scans, poses_velo: np.ndarray, stamps: np.ndarray,
                       Tr: np.ndarray | None = None) -> None:
    """Write scans (each with ``points`` (N, 3) and ``intensity`` (N,)) as a KITTI odometry sequence;
    scans with per-point ``times`` also get ``point_times/NNNNNN.bin`` ((N,) float32 seconds
    relative to the scan's stamp; read back by ``KittiSequence``).

    ``poses_velo`` (F, 4, 4) are Velodyne poses in the first scan's frame; poses.txt gets the
    camera-0 poses P_i = Tr pose_velo_i Tr^-1 (so pose_velo_i = Tr^-1 P_i Tr, as KITTI).
    """
    out = Path(out_dir)
    (out / "velodyne").mkdir(parents=True, exist_ok=True)
    n = 0
    for n, scan in enumerate(scans, start=1):
        refl = scan.intensity if scan.intensity is not None else np.zeros(len(scan.points), np.float32)
        np.column_stack([scan.points, refl]).astype(np.float32).tofile(out / "velodyne" / f"{n - 1:06d}.bin")
        if scan.times is not None:  # per-point times of a motion-distorted sweep, as the Newer College samples
            (out / POINT_TIMES).mkdir(exist_ok=True)
            np.asarray(scan.times, np.float32).tofile(out / POINT_TIMES / f"{n - 1:06d}.bin")
    if n != len(poses_velo) or n != len(stamps):
        raise ValueError(f"{n} scans but {len(poses_velo)} poses and {len(stamps)} stamps")
    if Tr is None:
        Tr = velodyne_to_camera(KITTI_CALIB)
        calib = KITTI_CALIB.read_text()
    else:
        lines = [ln for ln in KITTI_CALIB.read_text().splitlines() if not ln.startswith("Tr:")]
        calib = "\n".join(lines + ["Tr: " + " ".join(f"{v:.12e}" for v in np.asarray(Tr)[:3, :4].ravel())]) + "\n"
    P = Tr[None] @ np.asarray(poses_velo, np.float64) @ np.linalg.inv(Tr)[None]
    write_poses(out / "poses.txt", P)
    np.savetxt(out / "times.txt", np.asarray(stamps, np.float64), fmt="%.6e")
    (out / "calib.txt").write_text(calib)


@dataclass
class _Mover:
    """A moving car (outdoor) or person (indoor) that follows the ego route."""

    lead: bool  # ahead in the ego lane at a varying gap; else oncoming in the opposite lane
    gap: float  # m (lead)
    sway: float  # m, amplitude of the gap's variation (lead)
    omega: float  # rad/s
    phase: float
    s0: float  # m of route where it is at t = 0 (oncoming)
    speed: float  # m/s (oncoming)
    lateral: float  # m to the left of the ego lane


def _movers(world: SyntheticWorld, seed: int, n: int) -> list[_Mover]:
    """n moving objects: every third leads in the ego lane, the others come towards the vehicle."""
    rng = seeded_rng(seed, 5, 0)
    scale = 1.0 if world.kind == "outdoor" else 0.1  # people indoors: 10x slower and closer
    out = []
    for k in range(int(n)):
        lead = k % 3 == 0
        if world.kind == "outdoor":
            lateral = 0.0 if lead else 2 * world.lane_offset
        else:
            lateral = -0.6 if lead else 0.6
        out.append(_Mover(lead=lead, gap=float(rng.uniform(14.0, 30.0)) * scale + 1.0 - scale,
                          sway=4.0 * scale, omega=float(rng.uniform(0.1, 0.4)), phase=float(rng.uniform(0, 2 * np.pi)),
                          s0=float(rng.uniform(40.0, 300.0)) * scale, speed=float(rng.uniform(5.0, 12.0)) * scale,
                          lateral=lateral))
    return out


# How the sensor is carried (``simulate_sequence`` keywords): "vehicle" is every drive's default;
# "handheld" a walk with the sensor held 1.6 m up, leaning 20 deg forward and swaying 12 deg (about
# the 17-27 deg lean of the real Newer College handheld OS1-64 scans).
CARRIERS: dict[str, dict] = {
    "vehicle": {},
    "handheld": {"mount_height": 1.6, "tilt_deg": 20.0, "sway_deg": 12.0, "speed": (1.0, 1.6)},
}


def mounted(sensor: str | LidarModel, mount_height: float | None = None,
            tilt_deg: float | None = None) -> LidarModel:
    """The sensor model (a preset name or a model) with its mount height and tilt overridden where given."""
    model = sensor if isinstance(sensor, LidarModel) else LidarModel.preset(sensor)
    if mount_height is not None and not (np.isfinite(mount_height) and mount_height > 0):
        raise ValueError(f"mount_height must be a positive number of metres, got {mount_height}")
    changes = {k: float(v) for k, v in (("mount_height", mount_height), ("tilt_deg", tilt_deg)) if v is not None}
    return dataclasses.replace(model, **changes) if changes else model


def simulate_sequence(n_frames: int | None = None, length_m: float | None = None, seed: int = 0,
                      sensor: str | LidarModel = "hdl64", kind: str | None = None,
                      speed: float | tuple[float, float] | None = None, noise: bool = True,
                      motion_distortion: bool = False, moving_objects: int = 0,
                      out_dir: str | Path | None = None, progress: bool = False,
                      family: str | None = None, mount_height: float | None = None,
                      tilt_deg: float | None = None, sway_deg: float = 0.0) -> SyntheticSequence:
    """A drive of ``n_frames`` scans or ``length_m`` metres through the world of ``seed``.

    ``family`` picks the scene family (``FAMILIES``: town, suburban, parking_lot, open_field,
    highway, tunnel, rooms, office, warehouse); without it ``kind`` ("outdoor", the default, or
    "indoor") gives the town or the rooms.
    ``mount_height`` (m above the ground) and ``tilt_deg`` (downward pitch) override the sensor
    model's mount; by default the sensor sits at the world's vehicle height, level.
    ``sway_deg`` sways the carried sensor slowly in roll and pitch by up to that many degrees (half
    in yaw; ``Trajectory.generate``): with a low mount, a tilt and a walking speed, a handheld lidar.

    ``speed``: a cruise speed or a (low, high) range in m/s (default: outdoor 5-15, indoor
    0.4-1.5; turns and stops slow the vehicle down to 0). Scans come at the sensor's rate.
    With ``out_dir`` every scan is rendered and written in the KITTI odometry layout.
    """
    if (n_frames is None) == (length_m is None):
        raise ValueError("give exactly one of n_frames or length_m")
    if n_frames is not None and int(n_frames) < 1:
        raise ValueError(f"n_frames must be >= 1, got {n_frames}")
    if length_m is not None and not (np.isfinite(length_m) and length_m > 0):
        raise ValueError(f"length_m must be a positive number, got {length_m}")
    model = mounted(sensor, mount_height, tilt_deg)
    world = SyntheticWorld(seed, kind=kind, family=family)
    speed_range = (float(speed), float(speed)) if np.isscalar(speed) else speed
    hi = (speed_range or world.speed_range)[1]
    if length_m is not None:
        traj = Trajectory.generate(world, float(length_m) + world.pitch, seed, speed_range=speed_range,
                                   sway_deg=sway_deg)
        end = float(traj.time_at_arc(float(length_m)))
        stamps = np.arange(0.0, end + 1e-9, 1.0 / model.rate_hz)
    else:
        traj = Trajectory.generate(world, n_frames / model.rate_hz * hi * 1.1 + world.pitch, seed,
                                   speed_range=speed_range, sway_deg=sway_deg)
        stamps = np.arange(int(n_frames)) / model.rate_hz
    seq = SyntheticSequence(world, traj, model, stamps, seed, noise=noise, motion_distortion=motion_distortion,
                            moving_objects=moving_objects)
    if out_dir is not None:
        seq.write_kitti(out_dir, progress=progress)
    return seq


def _pair_frames(pos: np.ndarray, arc: np.ndarray, n: int, min_distance: float, max_distance: float,
                 rng: np.random.Generator) -> list[tuple[int, int]]:
    """n frame pairs (a, b), a < b, with min <= |pos_b - pos_a| <= max; starts 5-20 m of route apart.

    b is the frame nearest a random target distance before the drive first leaves the range; a
    start with no frame inside [min, max] (a window narrower than one frame's travel) is skipped.
    """
    out, a = [], 0
    while len(out) < n:
        want = rng.uniform(min_distance, max_distance)
        dist = np.linalg.norm(pos[a:] - pos[a], axis=1)
        beyond = np.flatnonzero(dist > max_distance)
        inside = np.flatnonzero(dist[: beyond[0] if len(beyond) else len(dist)] >= min_distance)
        if len(inside):
            out.append((a, a + int(inside[np.argmin(np.abs(dist[inside] - want))])))
        nxt = np.flatnonzero(arc >= arc[a] + rng.uniform(5.0, 20.0))
        if len(nxt) == 0 or (not len(inside) and not len(beyond)):
            raise RuntimeError(f"the drive ended after {len(out)} of {n} pairs; lower n or max_distance")
        a = int(nxt[0])
    return out


def synthetic_pairs(n: int, seed: int, min_distance: float = 10.0, max_distance: float = 20.0,
                    sensor: str | LidarModel = "hdl64", kind: str | None = None, noise: bool = True,
                    family: str | None = None, mount_height: float | None = None,
                    tilt_deg: float | None = None,
                    target_sensor: str | LidarModel | None = None) -> list[PointCloudPair]:
    """n scan pairs from the world of ``seed``, sensors between min and max distance apart.

    ``T_gt`` maps source into target exactly (x_target = T_gt x_source). Successive pairs start
    5-20 m further along one drive; source and target order is random. Worlds are pure functions
    of the seed, so pairs of different seeds share no geometry (use held-out seeds for testing).
    ``family``, ``kind``, ``mount_height`` and ``tilt_deg`` act as in ``simulate_sequence``.
    ``target_sensor``: render every target with this sensor instead (mixed-sensor pairs: the same
    world, drive, frames and poses; ``meta["target_sensor"]`` names it). Without it the output is
    unchanged.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not 0.0 <= min_distance < max_distance:
        raise ValueError(f"need 0 <= min_distance < max_distance, got {min_distance}, {max_distance}")
    model = mounted(sensor, mount_height, tilt_deg)
    world = SyntheticWorld(seed, kind=kind, family=family)
    traj = Trajectory.generate(world, n * (max_distance + 25.0) + 2 * world.pitch, seed, index=1)
    step = 1.0 / model.rate_hz
    stamps = np.arange(0.0, traj.duration, step)
    seq = SyntheticSequence(world, traj, model, stamps, seed, noise=noise, name=f"pairs_seed{seed}")
    tseq = seq if target_sensor is None else SyntheticSequence(
        world, traj, mounted(target_sensor, mount_height, tilt_deg), stamps, seed, noise=noise,
        name=f"pairs_seed{seed}_target")
    pos = seq.world_poses[:, :3, 3]
    arc = traj.arc_at(stamps)
    rng = seeded_rng(seed, 6, 0)
    pairs: list[PointCloudPair] = []
    cache: dict[tuple[int, int], SyntheticScan] = {}  # (sequence: 0 source, 1 target, frame) -> scan
    for a, b in _pair_frames(pos, arc, n, min_distance, max_distance, rng):
        i, j = (a, b) if rng.uniform() < 0.5 else (b, a)
        cache = {k: v for k, v in cache.items() if k[1] >= a}  # keep memory bounded
        for key in ((0, i), (int(tseq is not seq), j)):
            if key not in cache:
                cache[key] = (tseq if key[0] else seq)[key[1]]
        T_gt = np.linalg.inv(tseq.world_poses[j]) @ seq.world_poses[i]
        meta = {"dataset": "synthetic", "kind": world.kind, "family": world.family, "sensor": model.name,
                "seed": seed, "frames": (i, j), "distance": float(np.linalg.norm(pos[b] - pos[a]))}
        if tseq is not seq:
            meta["target_sensor"] = tseq.sensor.name
        pairs.append(PointCloudPair(
            source=cache[0, i].points, target=cache[int(tseq is not seq), j].points, T_gt=T_gt,
            name=f"synthetic_s{seed}_{i:05d}_{j:05d}", meta=meta))
    return pairs
