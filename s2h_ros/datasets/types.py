"""The data objects every reader yields: a registration pair and a scan sequence.

Readers (KITTI, 3DMatch, rosbag2, synthetic, plain files) all produce these, so the
evaluation harness, training and replay never care where data came from.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Iterator, Protocol

import numpy as np


@dataclass
class PointCloudPair:
    """Two clouds and the ground-truth transform that maps ``source`` into ``target``'s frame."""

    source: np.ndarray  # (N, 3) float32, metres, source sensor frame
    target: np.ndarray  # (M, 3) float32, metres, target sensor frame
    T_gt: np.ndarray  # (4, 4) float64: x_target = T_gt @ x_source
    name: str = ""
    meta: dict = field(default_factory=dict)  # e.g. dataset, sequence, frame ids, overlap


def turned_pair(pair: PointCloudPair, heading_deg: float) -> PointCloudPair:
    """``pair`` with its source turned by ``heading_deg`` about z (``T_gt`` follows): the same
    scene seen at another relative heading (``meta["turn_deg"]`` records it)."""
    from s2h_ros import geometry

    turn = geometry.yaw_transform(heading_deg)
    source = geometry.apply_transform(turn, np.asarray(pair.source, dtype=np.float64)).astype(pair.source.dtype)
    return PointCloudPair(source, pair.target, pair.T_gt @ geometry.invert_transform(turn), pair.name,
                          {**pair.meta, "turn_deg": heading_deg})


def overlap_fractions(pair: PointCloudPair, voxel: float = 0.05) -> tuple[float, float]:
    """The pair's overlap seen from each side: of the source's ``voxel`` grid points (after
    ``T_gt``), the fraction within 1.5 voxels of the target's, and the same of the target's.
    A narrow view inside a wide one has a high first and a low second fraction."""
    from scipy.spatial import cKDTree

    from s2h_ros.geometry import apply_transform, voxel_downsample

    def grid(points: np.ndarray) -> np.ndarray:
        return points[voxel_downsample(points, voxel)] if len(points) else points

    src = grid(apply_transform(np.asarray(pair.T_gt, np.float64), np.asarray(pair.source, np.float64)))
    tgt = grid(np.asarray(pair.target, np.float64))
    if len(src) == 0 or len(tgt) == 0:
        return 0.0, 0.0
    near = 1.5 * voxel
    return (float(np.mean(cKDTree(tgt).query(src)[0] < near)),
            float(np.mean(cKDTree(src).query(tgt)[0] < near)))


def overlap_ratio(pair: PointCloudPair, voxel: float = 0.05) -> float:
    """The overlap of a pair: the smaller of its two :func:`overlap_fractions`."""
    return min(overlap_fractions(pair, voxel))


def turned_pairs(pairs: Iterable[PointCloudPair], low: float, high: float, seed: int) -> Iterator[PointCloudPair]:
    """Each pair turned (:func:`turned_pair`) by a heading of ``low``-``high`` deg either way,
    drawn in order from a generator seeded by ``seed``: the same turns for the same seed."""
    rng = np.random.default_rng([int(seed), 7])
    for pair in pairs:
        yield turned_pair(pair, float(rng.choice([-1.0, 1.0]) * rng.uniform(low, high)))


def tilted_pair(pair: PointCloudPair, source_tilt: np.ndarray, target_tilt: np.ndarray) -> PointCloudPair:
    """``pair`` with its source and target each turned by a ``(3, 3)`` rotation (``T_gt`` follows):
    the same scene seen by tilted sensors, e.g. a handheld rig (``meta["tilt_deg"]`` records the two
    angles)."""
    from scipy.spatial.transform import Rotation

    from s2h_ros import geometry

    Rs, Rt = geometry.make_transform(source_tilt, np.zeros(3)), geometry.make_transform(target_tilt, np.zeros(3))
    source = geometry.apply_transform(Rs, np.asarray(pair.source, dtype=np.float64)).astype(pair.source.dtype)
    target = geometry.apply_transform(Rt, np.asarray(pair.target, dtype=np.float64)).astype(pair.target.dtype)
    angles = [float(np.degrees(Rotation.from_matrix(R).magnitude())) for R in (source_tilt, target_tilt)]
    return PointCloudPair(source, target, Rt @ pair.T_gt @ geometry.invert_transform(Rs), pair.name,
                          {**pair.meta, "tilt_deg": angles})


def tilted_pairs(pairs: Iterable[PointCloudPair], low: float, high: float, seed: int) -> Iterator[PointCloudPair]:
    """Each pair's source and target tilted (:func:`tilted_pair`), each by ``low``-``high`` deg about
    its own random horizontal axis, drawn in order from a generator seeded by ``seed``."""
    from scipy.spatial.transform import Rotation

    rng = np.random.default_rng([int(seed), 11])

    def tilt() -> np.ndarray:
        axis = rng.uniform(0.0, 2.0 * np.pi)
        angle = np.radians(rng.uniform(low, high))
        return Rotation.from_rotvec(angle * np.array([np.cos(axis), np.sin(axis), 0.0])).as_matrix()

    for pair in pairs:
        yield tilted_pair(pair, tilt(), tilt())


@dataclass
class Scan:
    """One sensor sweep with its timestamp and, when known, its ground-truth pose."""

    stamp: float  # seconds
    points: np.ndarray  # (N, 3) float32, sensor frame
    pose: np.ndarray | None = None  # (4, 4) float64 sensor pose in the world frame (None: unknown)
    intensity: np.ndarray | None = None  # (N,) float32
    frame_id: str = "velodyne"
    index: int = 0
    times: np.ndarray | None = None  # (N,) float64 seconds of each point relative to ``stamp`` (None: not known)


def scan_fields(scan: Scan) -> dict[str, np.ndarray] | None:
    """The per-point fields a scan is published or written with besides x, y, z: ``intensity``
    (float32) and ``time`` (float32 seconds relative to the stamp, the Velodyne driver's field)
    where the scan has them; None when it has neither."""
    fields = {}
    if scan.intensity is not None:
        fields["intensity"] = np.asarray(scan.intensity, np.float32)
    if scan.times is not None:
        fields["time"] = np.asarray(scan.times, np.float32)
    return fields or None


class Sequence(Protocol):
    """A time-ordered scan sequence (KITTI odometry layout, rosbag2, synthetic)."""

    name: str

    def __len__(self) -> int: ...

    def __getitem__(self, i: int) -> Scan: ...

    def __iter__(self) -> Iterator[Scan]: ...

    @property
    def poses(self) -> np.ndarray | None:
        """(len, 4, 4) float64 ground-truth sensor poses in the first scan's world frame."""
        ...


class SubSequence:
    """The scans of ``sequence`` at ``indices``, in that order, loaded on demand."""

    def __init__(self, sequence: Sequence, indices: list[int], name: str | None = None) -> None:
        self.sequence, self.indices = sequence, [int(i) for i in indices]
        self.name = name or getattr(sequence, "name", "scans")

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> Scan:
        return self.sequence[self.indices[i]]

    def __iter__(self) -> Iterator[Scan]:
        return (self.sequence[i] for i in self.indices)

    @property
    def poses(self) -> np.ndarray | None:
        poses = self.sequence.poses
        return None if poses is None else np.asarray(poses)[self.indices]


class ScanList:
    """A ``Sequence`` over scans already in memory (e.g. read from a rosbag2 file)."""

    def __init__(self, scans: list[Scan], name: str = "scans") -> None:
        self.scans = list(scans)
        self.name = name

    def __len__(self) -> int:
        return len(self.scans)

    def __getitem__(self, i: int) -> Scan:
        return self.scans[i]

    def __iter__(self) -> Iterator[Scan]:
        return iter(self.scans)

    @property
    def poses(self) -> np.ndarray | None:
        if not self.scans or any(s.pose is None for s in self.scans):
            return None
        return np.stack([s.pose for s in self.scans])
