"""KITTI odometry: sequence reader, DGR/FCGF pair protocol, standard pair lists, loop pair.

Layouts read by :class:`KittiSequence`:

* the KITTI tree: ``<root>/sequences/NN/velodyne/NNNNNN.bin``, ``<root>/sequences/NN/calib.txt``,
  ``<root>/sequences/NN/times.txt`` and ``<root>/poses/NN.txt`` (``KittiSequence(root, NN)``);
* one sequence folder: ``<dir>/velodyne/``, ``<dir>/poses.txt``, ``<dir>/calib.txt``,
  ``<dir>/times.txt`` (``KittiSequence(dir)``; what the synthetic generator writes), and, for a
  motion-distorted simulation, ``<dir>/point_times/NNNNNN.bin`` (each point's seconds relative to
  the scan's stamp, ``Scan.times``).

KITTI poses ``P_i`` are camera-0 poses in the first camera frame; ``Tr`` (calib.txt) maps
Velodyne into camera-0 coordinates, so the Velodyne pose is ``Tr^-1 . P_i . Tr`` and the
transform that maps scan i's points into scan j's frame is ``Tr^-1 . P_j^-1 . P_i . Tr``.

DGR pair protocol (``dataloader/kitti_loader.py`` of DGR, ``KITTINMPairDataset``): on camera-0
positions, for the current frame c take the first frame within the next 100 whose distance
is > 10 m, pair c with the frame *just before it* (so pairs are the last frame within 10 m,
8-10 m apart in practice), continue from that frame + 1, and drop sequence 8's (15, 58).
:func:`dgr_pairs` reproduces all 2093 pairs of the bundled train/val/test lists exactly.
"""
from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from s2h_ros import paths
from s2h_ros.datasets.icp_refine import IcpResult, refine_with_icp
from s2h_ros.datasets.io import read_point_fields
from s2h_ros.datasets.types import PointCloudPair, Scan

PAIR_LISTS_DIR = paths.SAMPLES_DIR / "kitti" / "pairs"
SAMPLE_POSES = paths.SAMPLES_DIR / "kitti" / "poses" / "00.txt"
SAMPLE_CALIB = paths.SAMPLES_DIR / "kitti" / "calib" / "00.txt"
DGR_SPLITS = {"train": (0, 1, 2, 3, 4, 5), "val": (6, 7), "test": (8, 9, 10)}
DGR_EXCLUDED = frozenset({(8, 15, 58)})  # (sequence, t0, t1) that DGR removes
DGR_MIN_DISTANCE = 10.0  # metres
DGR_WINDOW = 100  # frames searched ahead
SCAN_PERIOD = 0.1  # s: KITTI's 10 Hz, used when times.txt is absent


# ------------------------------------------------------------------------- file parsers


def read_calib(path: str | Path) -> dict[str, np.ndarray]:
    """calib.txt -> {name: flat float64 values} (``P0``..``P3`` 12 values, ``Tr`` 12)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"KITTI calib file not found: {path}")
    calib = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        name, sep, values = line.partition(":")
        try:
            calib[name.strip()] = np.array(values.split(), dtype=np.float64)
        except ValueError as error:
            raise ValueError(f"{path}:{number}: malformed calib line {line!r}") from error
        if not sep:
            raise ValueError(f"{path}:{number}: calib lines read 'NAME: values', got {line!r}")
    return calib


def velodyne_to_camera(calib: dict[str, np.ndarray] | str | Path) -> np.ndarray:
    """``Tr`` as a (4, 4) float64 matrix: x_cam0 = Tr @ x_velo."""
    if not isinstance(calib, dict):
        calib = read_calib(calib)
    if "Tr" not in calib or calib["Tr"].size != 12:
        raise ValueError("KITTI calib has no 12-value 'Tr' (Velodyne -> camera-0) entry")
    return _homogeneous(calib["Tr"].reshape(1, 3, 4))[0]


def read_poses(path: str | Path) -> np.ndarray:
    """poses file (12 numbers a line, row-major 3x4) -> (N, 4, 4) float64 camera-0 poses."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"KITTI poses file not found: {path}")
    try:
        values = np.loadtxt(path, dtype=np.float64, ndmin=2)
    except ValueError as error:
        raise ValueError(f"{path}: not a KITTI poses file ({error})") from error
    if values.shape[1] != 12 or len(values) == 0:
        raise ValueError(f"{path}: KITTI poses have 12 numbers a line, got shape {values.shape}")
    if not np.isfinite(values).all():
        raise ValueError(f"{path}: poses contain NaN or infinite values")
    return _homogeneous(values.reshape(-1, 3, 4))


def write_poses(path: str | Path, poses: np.ndarray) -> None:
    """(N, 4, 4) poses -> KITTI poses file (first 3 rows, row-major, 12 numbers a line)."""
    poses = np.asarray(poses, dtype=np.float64)
    if poses.ndim != 3 or poses.shape[1:] != (4, 4):
        raise ValueError(f"poses must be (N, 4, 4), got {poses.shape}")
    np.savetxt(path, poses[:, :3, :].reshape(-1, 12), fmt="%.12e")


def read_times(path: str | Path) -> np.ndarray:
    """times.txt (one timestamp in seconds a line) -> (N,) float64."""
    try:
        return np.loadtxt(path, dtype=np.float64, ndmin=1)
    except ValueError as error:
        raise ValueError(f"{path}: not a KITTI times file ({error})") from error


def camera_to_velodyne(camera_poses: np.ndarray, Tr: np.ndarray) -> np.ndarray:
    """Velodyne poses ``Tr^-1 . P_i . Tr`` from (N, 4, 4) camera-0 poses ``P_i``."""
    return np.linalg.inv(Tr) @ camera_poses @ Tr


def relative_transform(pose_i: np.ndarray, pose_j: np.ndarray) -> np.ndarray:
    """(4, 4) transform mapping frame i's points into frame j's: ``pose_j^-1 . pose_i``."""
    return np.linalg.inv(pose_j) @ pose_i


def _homogeneous(rows: np.ndarray) -> np.ndarray:
    out = np.tile(np.eye(4), (len(rows), 1, 1))
    out[:, :3, :] = rows
    return out


# ------------------------------------------------------------------------- the sequence

# Folder beside velodyne/ with each scan's per-point times ((N,) float32 seconds relative to its
# stamp, same file names): not KITTI's, written by the simulator for motion-distorted sweeps.
POINT_TIMES = "point_times"


class KittiSequence:
    """Lazily loaded KITTI odometry sequence (implements ``datasets.types.Sequence``).

    ``KittiSequence(root, 0)`` reads ``<root>/sequences/00``; ``KittiSequence(folder)`` reads a
    single-sequence folder. Scans are ``Scan(points (N, 3) float32 Velodyne frame, pose =
    Velodyne pose in the first scan's Velodyne frame, index = KITTI frame id)``. Poses are optional
    (KITTI's test sequences 11-21 have none); ``times.txt`` is optional (10 Hz assumed).
    """

    def __init__(self, root: str | Path, sequence: int | str | None = None):
        root = Path(root)
        if sequence is None:
            self.name = root.name
            folder, pose_file = root, root / "poses.txt"
        else:
            self.name = f"{int(sequence):02d}"
            folder, pose_file = root / "sequences" / self.name, root / "poses" / f"{self.name}.txt"
        self.folder = folder
        velodyne = folder / "velodyne"
        if not velodyne.is_dir():
            hint = " (a KITTI tree needs KittiSequence(root, sequence))" if (root / "sequences").is_dir() else ""
            raise FileNotFoundError(f"no KITTI velodyne folder at {velodyne}{hint}")
        files = sorted(p for p in velodyne.iterdir() if re.fullmatch(r"\d+\.bin", p.name))
        if not files:
            raise ValueError(f"{velodyne} holds no NNNNNN.bin scans")
        self.files = files
        self.frame_ids = np.array([int(p.stem) for p in files])
        self._index_of = {int(f): i for i, f in enumerate(self.frame_ids)}
        last = int(self.frame_ids.max())

        self.camera_poses: np.ndarray | None = None  # (F, 4, 4) indexed by frame id
        self.Tr: np.ndarray | None = None
        if pose_file.exists():
            self.camera_poses = read_poses(pose_file)
            if last >= len(self.camera_poses):
                raise ValueError(f"{pose_file} has {len(self.camera_poses)} poses but scan {last} exists")
            self.Tr = velodyne_to_camera(folder / "calib.txt")
            self._origin = np.linalg.inv(self.velodyne_pose(int(self.frame_ids[0])))
        times_file = folder / "times.txt"
        if times_file.exists():
            self.times = read_times(times_file)
            if last >= len(self.times):
                raise ValueError(f"{times_file} has {len(self.times)} stamps but scan {last} exists")
        else:
            self.times = np.arange(last + 1) * SCAN_PERIOD

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> Scan:
        if not -len(self) <= i < len(self):
            raise IndexError(f"scan {i} out of range for {len(self)} scans")
        frame = int(self.frame_ids[i])
        fields = read_point_fields(self.files[i])
        pose = None if self.camera_poses is None else self._origin @ self.velodyne_pose(frame)
        return Scan(
            stamp=float(self.times[frame]),
            points=fields.points,
            pose=pose,
            intensity=fields.intensity,
            frame_id="velodyne",
            index=frame,
            times=self._point_times(self.files[i], len(fields.points)),
        )

    def _point_times(self, scan_file: Path, n: int) -> np.ndarray | None:
        """``(n,)`` float64 seconds of each point relative to the stamp from ``point_times/`` (written
        by the simulator for motion-distorted sweeps); None where the sequence has none."""
        path = self.folder / POINT_TIMES / scan_file.name
        if not path.exists():
            return None
        times = np.fromfile(path, np.float32).astype(np.float64)
        if len(times) != n:
            raise ValueError(f"{path} holds {len(times)} point times for {n} points")
        return times

    def __iter__(self) -> Iterator[Scan]:
        for i in range(len(self)):
            yield self[i]

    def frame(self, frame_id: int) -> Scan:
        """The scan with KITTI frame id ``frame_id`` (file ``NNNNNN.bin``)."""
        if frame_id not in self._index_of:
            raise KeyError(f"sequence {self.name} has no frame {frame_id}")
        return self[self._index_of[frame_id]]

    def velodyne_pose(self, frame_id: int) -> np.ndarray:
        """(4, 4) Velodyne pose of a frame id in frame 0's Velodyne frame: ``Tr^-1 . P_frame . Tr``."""
        if self.camera_poses is None:
            raise ValueError(f"sequence {self.name} has no poses")
        return camera_to_velodyne(self.camera_poses[frame_id], self.Tr)

    @property
    def poses(self) -> np.ndarray | None:
        """(len, 4, 4) float64 Velodyne poses of the scans, in scan 0's Velodyne frame."""
        if self.camera_poses is None:
            return None
        return self._origin @ camera_to_velodyne(self.camera_poses[self.frame_ids], self.Tr)


# ------------------------------------------------------------------ DGR pair protocol


def dgr_pairs(
    positions: np.ndarray,
    frame_ids: np.ndarray | None = None,
    min_distance: float = DGR_MIN_DISTANCE,
    window: int = DGR_WINDOW,
) -> list[tuple[int, int]]:
    """DGR's KITTI pairs (t0, t1) from (F, 3) camera-0 positions indexed by frame id.

    From frame c: the first frame c + k (k < ``window``) farther than ``min_distance`` from c,
    then the pair (c, c + k - 1), then continue at c + k. Frames missing from ``frame_ids``
    (default: all) are never paired; DGR's own loop would stop or spin there.
    """
    positions = np.asarray(positions, dtype=np.float64)
    present = np.ones(len(positions), bool)
    if frame_ids is not None:
        present[:] = False
        present[np.asarray(frame_ids)] = True
    pairs = []
    current = int(np.flatnonzero(present)[0]) if present.any() else len(positions)
    while current < len(positions):
        ahead = np.linalg.norm(positions[current : current + window] - positions[current], axis=1)
        far = np.flatnonzero(ahead > min_distance)
        partner = current + int(far[0]) - 1 if len(far) else -1
        if partner > current and present[current] and present[partner]:
            pairs.append((current, partner))
            current = partner + 1
        else:
            current += 1
    return pairs


class KittiPairs:
    """DGR/FCGF KITTI pairs with ICP-refined ground truth, cached on disk.

    ``pairs[k]`` is a ``PointCloudPair(source = scan t0, target = scan t1, T_gt)`` where
    ``T_gt`` maps t0's Velodyne points into t1's: the pose-derived ``Tr^-1 P_t1^-1 P_t0 Tr``
    refined by :func:`refine_with_icp` (DGR's settings by default). Each refinement is stored
    in ``cache_dir/<seq>_<t0>_<t1>.npz`` (default ``<root>/icp_cache``) and reused.
    """

    def __init__(
        self,
        root: str | Path,
        sequences: tuple[int, ...] | int | str = "test",
        cache_dir: str | Path | None = None,
        min_distance: float = DGR_MIN_DISTANCE,
        icp_distances: tuple[float, ...] = (0.2,),
        exclude: frozenset = DGR_EXCLUDED,
    ):
        if isinstance(sequences, str):
            if sequences not in DGR_SPLITS:
                raise ValueError(f"unknown split {sequences!r}; use one of {sorted(DGR_SPLITS)} or sequence ids")
            sequences = DGR_SPLITS[sequences]
        elif isinstance(sequences, int):
            sequences = (sequences,)
        self.sequences = {int(s): KittiSequence(root, s) for s in sequences}
        self.cache_dir = Path(cache_dir) if cache_dir is not None else Path(root) / "icp_cache"
        self.icp_distances = tuple(icp_distances)
        self.pairs: list[tuple[int, int, int]] = []
        for s, seq in self.sequences.items():
            if seq.camera_poses is None:
                raise ValueError(f"sequence {s} has no poses: pairs need ground truth")
            for t0, t1 in dgr_pairs(seq.camera_poses[:, :3, 3], seq.frame_ids, min_distance):
                if (s, t0, t1) not in exclude:
                    self.pairs.append((s, t0, t1))

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, k: int) -> PointCloudPair:
        s, t0, t1 = self.pairs[k]
        seq = self.sequences[s]
        source, target = seq.frame(t0), seq.frame(t1)
        T_pose = relative_transform(seq.velodyne_pose(t0), seq.velodyne_pose(t1))
        T_gt, fitness = self._refined(f"{s:02d}_{t0:06d}_{t1:06d}", source.points, target.points, T_pose)
        return PointCloudPair(
            source=source.points,
            target=target.points,
            T_gt=T_gt,
            name=f"kitti_{s:02d}_{t0:06d}_{t1:06d}",
            meta={"dataset": "kitti", "sequence": s, "frames": (t0, t1), "T_pose": T_pose, "icp_fitness": fitness},
        )

    def __iter__(self) -> Iterator[PointCloudPair]:
        for k in range(len(self)):
            yield self[k]

    def _refined(self, key: str, source, target, T_pose) -> tuple[np.ndarray, float]:
        path = self.cache_dir / f"{key}.npz"
        if path.exists():
            cached = np.load(path)
            if tuple(cached["icp_distances"]) == self.icp_distances and np.allclose(cached["T_pose"], T_pose):
                return cached["T_gt"], float(cached["fitness"])
        result = refine_with_icp(source, target, T_pose, distances=self.icp_distances)
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        np.savez(path, T_gt=result.transform, T_pose=T_pose, fitness=result.fitness,
                 icp_distances=np.array(self.icp_distances))
        return result.transform, result.fitness


# -------------------------------------------------------------- standard pair lists


@dataclass
class PairRecord:
    """One row of a standard KITTI pair list, direction made explicit."""

    sequence: int
    source_frame: int  # the csv's frame1 (the earlier frame, DGR's t0)
    target_frame: int  # the csv's frame0 (DGR's t1)
    T: np.ndarray  # (4, 4) float64: x_target = T @ x_source (ICP-refined)


def read_pair_list(path: str | Path) -> list[PairRecord]:
    """Read a bundled-style pair list (``seq,frame0,frame1,T00..T23``).

    Checked against sequence 00-02 poses: the csv transform maps **frame1**'s Velodyne points
    into **frame0**'s frame (it matches ``Tr^-1 P_frame0^-1 P_frame1 Tr`` to a median 0.10 m,
    the reverse is about 19 m off), i.e. frame1 is the source. See docs/datasets.md.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"KITTI pair list not found: {path}")
    records = []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        names = [f"T{r}{c}" for r in range(3) for c in range(4)]
        missing = {"seq", "frame0", "frame1", *names} - set(reader.fieldnames or [])
        if missing:
            raise ValueError(f"{path}: pair list lacks columns {sorted(missing)}")
        for row in reader:
            T = np.eye(4)
            T[:3, :] = np.array([float(row[n]) for n in names]).reshape(3, 4)
            records.append(PairRecord(int(row["seq"]), int(row["frame1"]), int(row["frame0"]), T))
    return records


def pair_list_agreement(records: list[PairRecord], velodyne_poses: np.ndarray) -> dict[str, dict[str, float]]:
    """How far a pair list's transforms are from the pose-derived ones, as read and reversed.

    ``velodyne_poses`` (F, 4, 4) of the records' one sequence. Returns, for ``"as_read"``
    (source -> target as :func:`read_pair_list` states) and ``"reversed"``, the median and max
    translation gap (m) and rotation gap (deg): the right direction differs only by the ICP
    refinement (~0.1 m), the wrong one by about twice the pair distance.
    """
    gaps: dict[str, list[tuple[float, float]]] = {"as_read": [], "reversed": []}
    for record in records:
        T_pose = relative_transform(velodyne_poses[record.source_frame], velodyne_poses[record.target_frame])
        for key, T in (("as_read", T_pose), ("reversed", np.linalg.inv(T_pose))):
            delta = np.linalg.inv(T) @ record.T
            angle = np.degrees(np.arccos(np.clip((np.trace(delta[:3, :3]) - 1.0) / 2.0, -1.0, 1.0)))
            gaps[key].append((float(np.linalg.norm(record.T[:3, 3] - T[:3, 3])), float(angle)))
    if not gaps["as_read"]:
        raise ValueError("no pair records given")
    summary = {}
    for key, values in gaps.items():
        te, re_ = np.array(values).T
        summary[key] = {"te_median_m": float(np.median(te)), "te_max_m": float(te.max()),
                        "re_median_deg": float(np.median(re_)), "re_max_deg": float(re_.max()), "pairs": len(te)}
    return summary


def kitti_benchmark_pairs(root: str | Path, split: str = "test", lists_dir: str | Path = PAIR_LISTS_DIR) -> Iterator[PointCloudPair]:
    """The standard DGR/FCGF split (train/val/test csv) over a KITTI tree, with the lists' transforms."""
    sequences: dict[int, KittiSequence] = {}
    for record in read_pair_list(Path(lists_dir) / f"{split}.csv"):
        seq = sequences.setdefault(record.sequence, KittiSequence(root, record.sequence))
        s, t0, t1 = record.sequence, record.source_frame, record.target_frame
        yield PointCloudPair(
            source=seq.frame(t0).points,
            target=seq.frame(t1).points,
            T_gt=record.T,
            name=f"kitti_{s:02d}_{t0:06d}_{t1:06d}",
            meta={"dataset": "kitti", "split": split, "sequence": s, "frames": (t0, t1)},
        )


# --------------------------------------------------------------------- the loop pair

LOOP_FRAMES = (1554, 4534)
LOOP_ICP_DISTANCES = (1.0, 0.5, 0.2)  # the raw poses are ~1.5 m off: coarse to fine


def kitti_loop_pair(refine: bool = True) -> PointCloudPair:
    """The bundled KITTI 00 loop closure: source = frame 1554, target = frame 4534.

    ``T_gt`` maps 1554's Velodyne points into 4534's frame: ``Tr^-1 P_4534^-1 P_1554 Tr`` from
    the bundled poses, refined by coarse-to-fine point-to-point ICP (``refine=False`` keeps the
    raw-pose transform). ``meta`` holds ``T_pose`` and the ICP fit (median NN distances).
    """
    source, target = (read_point_fields(p).points for p in paths.KITTI_LOOP_PAIR)
    poses = camera_to_velodyne(read_poses(SAMPLE_POSES)[list(LOOP_FRAMES)], velodyne_to_camera(SAMPLE_CALIB))
    T_pose = relative_transform(poses[0], poses[1])
    meta = {"dataset": "kitti", "sequence": 0, "frames": LOOP_FRAMES, "T_pose": T_pose}
    T_gt = T_pose
    if refine:
        result: IcpResult = refine_with_icp(source, target, T_pose, distances=LOOP_ICP_DISTANCES)
        T_gt = result.transform
        meta.update(icp_fitness=result.fitness, median_nn_before=result.median_nn_before,
                    median_nn_after=result.median_nn_after)
    return PointCloudPair(source=source, target=target, T_gt=T_gt, name="kitti_00_001554_004534", meta=meta)
