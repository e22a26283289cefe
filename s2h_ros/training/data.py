"""Cached training pairs: voxelised clouds as int16 npz files plus the exact ``T_gt``.

Ray-casting a 64-beam scan costs about 0.3-1 s and needs Open3D, so pairs are generated once
(``write_pairs``) and training reads the cache alone (``PairCache``), also on a machine without
Open3D. Each cloud keeps one real point per ``voxel`` (``geometry.voxel_downsample``) stored as
``round(x / scale)`` int16 with ``scale = voxel / 16`` (1.9 cm at 0.3 m, well under the sensor
noise, +-614 m of range), compressed: a 64-beam pair takes about 110 kB.

Layout: ``DIR/<split>/pair_00000.npz`` (``source``, ``target`` int16 (N, 3), ``T_gt`` (4, 4)
float64, ``scale``) and ``DIR/<split>/index.json`` (voxel, scale, one entry per pair), rewritten
after every pair so an interrupted generation keeps what it made.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from s2h_ros.datasets.types import PointCloudPair, overlap_ratio

FORMAT = "s2h_ros.pair_cache/1"
SCALE_DIVISOR = 16  # stored coordinate step = voxel / SCALE_DIVISOR
INT16_MAX = np.iinfo(np.int16).max
RESERVED_EVAL_SEEDS = range(0, 1000)  # held-out evaluation worlds: never train on them
OVERLAP_VOXEL = 0.05  # grid of the --min-overlap test (m)


def overlaps_enough(pair: PointCloudPair, min_overlap: float) -> bool:
    """The ``--min-overlap`` test of training pairs: its ``overlap_ratio`` at ``OVERLAP_VOXEL``
    reaches ``min_overlap`` (always true for 0: no test)."""
    return min_overlap <= 0.0 or overlap_ratio(pair, OVERLAP_VOXEL) >= min_overlap


class CacheError(ValueError):
    """A pair cache that is missing, incomplete or corrupt."""


@dataclass
class CachedPair:
    """One training pair decoded from the cache (float32 metres)."""

    source: np.ndarray  # (N, 3) float32, voxelised source cloud
    target: np.ndarray  # (M, 3) float32, voxelised target cloud
    T_gt: np.ndarray  # (4, 4) float64: x_target = T_gt @ x_source
    name: str


def quantize_cloud(xyz: np.ndarray, scale: float) -> np.ndarray:
    """``(N, 3)`` metres -> ``(N, 3) int16`` steps of ``scale``; raises when a point is out of range."""
    q = np.round(np.asarray(xyz, dtype=np.float64) / scale)
    if len(q) and np.abs(q).max() > INT16_MAX:
        raise CacheError(f"point at {np.abs(xyz).max():.1f} m exceeds the int16 range of scale {scale} m")
    return q.astype(np.int16)


def voxelize_pair(pair: PointCloudPair, voxel: float) -> tuple[np.ndarray, np.ndarray]:
    """One real point per occupied voxel of each side, ``(N, 3)``/``(M, 3)`` float32."""
    from s2h_ros.geometry import voxel_downsample

    clouds = []
    for side, xyz in (("source", pair.source), ("target", pair.target)):
        xyz = np.asarray(xyz, dtype=np.float32)[:, :3]
        xyz = xyz[np.isfinite(xyz).all(1)]
        if len(xyz) < 3:
            raise CacheError(f"pair {pair.name!r}: {side} has {len(xyz)} finite points")
        clouds.append(xyz[voxel_downsample(xyz, voxel)])
    return clouds[0], clouds[1]


def write_pairs(out_dir: str | Path, pairs: Iterable[PointCloudPair], voxel: float,
                meta: dict | None = None) -> Path:
    """Voxelise and store ``pairs`` under ``out_dir`` (one npz each plus ``index.json``)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    scale = voxel / SCALE_DIVISOR
    index = {"format": FORMAT, "voxel": voxel, "scale": scale, "meta": meta or {}, "pairs": []}
    for i, pair in enumerate(pairs):
        src, tgt = voxelize_pair(pair, voxel)
        name = f"pair_{i:05d}.npz"
        np.savez_compressed(out / name, source=quantize_cloud(src, scale), target=quantize_cloud(tgt, scale),
                            T_gt=np.asarray(pair.T_gt, np.float64), scale=np.float64(scale))
        index["pairs"].append({"file": name, "name": pair.name, "source_voxels": len(src),
                               "target_voxels": len(tgt), "seed": pair.meta.get("seed"),
                               "distance": pair.meta.get("distance")})
        tmp = out / "index.json.tmp"
        tmp.write_text(json.dumps(index, indent=1))
        tmp.replace(out / "index.json")
    return out


@dataclass(frozen=True)
class WorldDraw:
    """What one training world is rendered with, drawn from its seed (``draw_world``)."""

    sensor: str
    family: str | None
    mount_height: float | None  # None: the sensor's own
    target_sensor: str | None  # None: source and target from the same sensor


def draw_world(seed: int, sensors: tuple[str, ...], families: tuple[str | None, ...],
               mount_heights: tuple[float, float] | None = None, mixed: float = 0.0) -> WorldDraw:
    """The sensor, scene family, mount height and (with probability ``mixed``) a second sensor for
    the targets of world ``seed``: a pure function of the seed, so a cache can be regenerated."""
    rng = np.random.default_rng([seed, 77])
    sensor, family = str(rng.choice(sensors)), families[int(rng.integers(len(families)))]
    height = float(rng.uniform(*mount_heights)) if mount_heights else None
    target = str(rng.choice(sensors)) if len(sensors) > 1 and rng.uniform() < mixed else None
    return WorldDraw(sensor, family, height, target if target != sensor else None)


def synthetic_training_pairs(n: int, seed: int, per_world: int = 5, sensor: str | tuple[str, ...] = "hdl64",
                             min_distance: float = 10.0, max_distance: float = 20.0,
                             family: str | None | tuple[str | None, ...] = None,
                             mount_heights: tuple[float, float] | None = None,
                             mixed: float = 0.0, min_overlap: float = 0.0) -> Iterator[PointCloudPair]:
    """``n`` synthetic pairs from worlds ``seed, seed + 1, ...`` (``per_world`` pairs each), lazily.

    ``sensor`` and ``family`` (default: the town; see ``FAMILIES``) are one preset or a tuple to
    draw from per world, with a mount height uniform in ``mount_heights`` (default: the sensor's)
    and, with probability ``mixed``, targets rendered by a second drawn sensor (``draw_world``).
    ``min_overlap``: pairs whose ``overlap_ratio`` (at 0.05 m) is lower are skipped and replaced
    (a depth camera that turned away sees nothing of the other view: no positive pairs to learn from).
    Several short drives in different worlds give more varied scenes than one long drive.
    Seeds below 1000 are refused: they are the held-out evaluation worlds.
    """
    if n < 1 or per_world < 1:
        raise ValueError(f"need n >= 1 and per_world >= 1, got {n}, {per_world}")
    last = seed + (n - 1) // per_world
    if seed in RESERVED_EVAL_SEEDS or last in RESERVED_EVAL_SEEDS:
        raise ValueError(f"seeds {seed}..{last} overlap the held-out evaluation seeds 0-999")
    from s2h_ros.datasets.synthetic import synthetic_pairs

    sensors = (sensor,) if isinstance(sensor, str) else tuple(sensor)
    families = (family,) if family is None or isinstance(family, str) else tuple(family)
    made = 0
    world = seed
    while made < n:
        draw = draw_world(world, sensors, families, mount_heights, mixed)
        k = min(per_world, n - made)
        while k >= 1:
            try:  # some worlds' drives are too short for k pairs: take fewer, the next world makes up
                pairs = synthetic_pairs(k, world, min_distance=min_distance, max_distance=max_distance,
                                        sensor=draw.sensor, family=draw.family, mount_height=draw.mount_height,
                                        target_sensor=draw.target_sensor)
                break
            except RuntimeError:
                k //= 2
        if k >= 1:
            for pair in pairs:
                if overlaps_enough(pair, min_overlap):
                    yield pair
                    made += 1
        world += 1


class PairCache:
    """The pairs of one cache split, decoded in memory (a few tens of MB for hundreds of pairs)."""

    def __init__(self, split_dir: str | Path, limit: int | None = None) -> None:
        self.dir = Path(split_dir)
        index_path = self.dir / "index.json"
        if not index_path.is_file():
            raise CacheError(f"no pair cache at {self.dir} (missing index.json; make one with `s2h train data`)")
        try:
            index = json.loads(index_path.read_text())
        except json.JSONDecodeError as err:
            raise CacheError(f"corrupt {index_path}: {err}") from err
        if index.get("format") != FORMAT or not index.get("pairs"):
            raise CacheError(f"{index_path} is not a non-empty {FORMAT} index")
        self.voxel = float(index["voxel"])
        self.meta = index.get("meta", {})
        entries = index["pairs"][:limit] if limit else index["pairs"]
        self.pairs = [self._load(e) for e in entries]

    def _load(self, entry: dict) -> CachedPair:
        path = self.dir / entry["file"]
        try:
            with np.load(path) as z:
                scale = float(z["scale"])
                src = z["source"].astype(np.float32) * np.float32(scale)
                tgt = z["target"].astype(np.float32) * np.float32(scale)
                T = z["T_gt"].astype(np.float64)
        except (OSError, KeyError, ValueError) as err:
            raise CacheError(f"cannot read cached pair {path}: {err}") from err
        if src.ndim != 2 or src.shape[1] != 3 or tgt.ndim != 2 or tgt.shape[1] != 3 or T.shape != (4, 4):
            raise CacheError(f"cached pair {path} has wrong shapes {src.shape}, {tgt.shape}, {T.shape}")
        return CachedPair(src, tgt, T, entry.get("name", entry["file"]))

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i: int) -> CachedPair:
        return self.pairs[i]


def open_split(data_dir: str | Path, split: str, limit: int | None = None) -> PairCache | None:
    """The ``split`` of a cache directory, or None when that split was not made."""
    path = Path(data_dir) / split
    if not (path / "index.json").exists():
        if split == "train":
            raise CacheError(f"no training split at {path} (make it with `s2h train data --out {data_dir}`)")
        return None
    return PairCache(path, limit)
