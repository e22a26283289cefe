"""3DMatch / 3DLoMatch: fragments, gt.log / gt.info / gt_overlap.log, and the bundled demo pair.

A benchmark scene is a folder of fragments ``cloud_bin_N.ply`` (original release; ``.pth`` or
``.npy`` as FCGF/Predator users have them) plus ``gt.log``: entries ``i j n`` followed by four
rows of the 4x4 transform that maps ``cloud_bin_j`` into ``cloud_bin_i``'s frame (``n`` is the
scene's fragment count). Checked on the 8 bundled-benchmark scenes: ``T_ij . T_jk = T_ik``
holds to 1e-6 for all 3546 triples present, the opposite order is 0.49 off (Frobenius,
median). So a pair is ``PointCloudPair(source = cloud_bin_j, target = cloud_bin_i, T_ij)``.
``gt.info`` holds each pair's 6x6 information matrix, ``gt_overlap.log`` lines ``i,j,overlap``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from s2h_ros import paths
from s2h_ros.datasets.io import read_points
from s2h_ros.datasets.types import PointCloudPair

FRAGMENT_EXTENSIONS = (".ply", ".pth", ".npy")
BENCHMARKS = ("3DMatch", "3DLoMatch")


@dataclass
class GtEntry:
    """One gt.log entry: ``T`` maps fragment ``j`` into fragment ``i``'s frame."""

    i: int
    j: int
    n_fragments: int
    T: np.ndarray  # (4, 4) float64


def read_gt_log(path: str | Path) -> list[GtEntry]:
    """Parse a gt.log (a header ``i j n`` then 4 rows of 4 numbers, per entry)."""
    return [GtEntry(i, j, n, block) for (i, j, n), block in _read_blocks(path, rows=4)]


def read_gt_info(path: str | Path) -> dict[tuple[int, int], np.ndarray]:
    """Parse a gt.info: ``(i, j) -> (6, 6)`` information matrix."""
    return {(i, j): block for (i, j, _), block in _read_blocks(path, rows=6)}


def read_gt_overlap(path: str | Path) -> dict[tuple[int, int], float]:
    """Parse a gt_overlap.log (lines ``i,j,overlap``): ``(i, j) -> overlap ratio``."""
    path = _existing(path)
    overlaps = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        parts = line.replace(",", " ").split()
        try:
            overlaps[(int(parts[0]), int(parts[1]))] = float(parts[2])
        except (ValueError, IndexError) as error:
            raise ValueError(f"{path}:{number}: expected 'i,j,overlap', got {line!r}") from error
    return overlaps


def _read_blocks(path: str | Path, rows: int) -> list[tuple[tuple[int, int, int], np.ndarray]]:
    """Entries of a header line ``i j n`` followed by ``rows`` rows of ``rows`` numbers (4 or 6)."""
    path = _existing(path)
    lines = [(k, line.split()) for k, line in enumerate(path.read_text().splitlines(), 1) if line.strip()]
    if not lines:
        raise ValueError(f"{path} is empty")
    if len(lines) % (rows + 1):
        raise ValueError(f"{path}: {len(lines)} lines are not whole entries of 1 + {rows} lines (truncated?)")
    entries = []
    for start in range(0, len(lines), rows + 1):
        number, header = lines[start]
        try:
            i, j, n = (int(v) for v in header[:3])
            block = np.array([[float(v) for v in words] for _, words in lines[start + 1 : start + rows + 1]])
        except ValueError as error:
            raise ValueError(f"{path}:{number}: malformed entry ({error})") from error
        if len(header) != 3 or block.shape != (rows, rows) or not np.isfinite(block).all():
            raise ValueError(f"{path}:{number}: an entry is 'i j n' then {rows} rows of {rows} finite numbers")
        entries.append(((i, j, n), block))
    return entries


def _existing(path: str | Path) -> Path:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"3DMatch ground-truth file not found: {path}")
    return path


def fragment_path(folder: str | Path, index: int) -> Path:
    """``folder/cloud_bin_<index>`` with the first extension found (.ply, .pth, .npy)."""
    folder = Path(folder)
    for ext in FRAGMENT_EXTENSIONS:
        candidate = folder / f"cloud_bin_{index}{ext}"
        if candidate.exists():
            return candidate
    raise FileNotFoundError(f"no fragment cloud_bin_{index}{{{','.join(FRAGMENT_EXTENSIONS)}}} in {folder}")


class ThreeDMatchScene:
    """The registration pairs of one scene: fragments folder + its gt.log (gt.info, overlaps).

    ``scene[k]`` loads fragments lazily and returns ``PointCloudPair(source = cloud_bin_j,
    target = cloud_bin_i, T_gt)`` with ``meta`` holding ``i``, ``j``, the information matrix
    and the overlap when those files are present.
    """

    def __init__(self, fragments_dir: str | Path, gt_dir: str | Path | None = None, benchmark: str = "3DMatch"):
        self.fragments_dir = Path(fragments_dir)
        if not self.fragments_dir.is_dir():
            raise FileNotFoundError(f"3DMatch fragments folder not found: {self.fragments_dir}")
        gt_dir = Path(gt_dir) if gt_dir is not None else self.fragments_dir
        self.name = self.fragments_dir.name
        self.benchmark = benchmark
        self.entries = read_gt_log(gt_dir / "gt.log")
        self.info = read_gt_info(gt_dir / "gt.info") if (gt_dir / "gt.info").exists() else {}
        overlap_file = gt_dir / "gt_overlap.log"
        self.overlap = read_gt_overlap(overlap_file) if overlap_file.exists() else {}

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, k: int) -> PointCloudPair:
        entry = self.entries[k]
        # Indoor fragments in metres near the origin: float32 (PointCloudPair's type) loses nothing.
        source = read_points(fragment_path(self.fragments_dir, entry.j)).astype(np.float32, copy=False)
        target = read_points(fragment_path(self.fragments_dir, entry.i)).astype(np.float32, copy=False)
        key = (entry.i, entry.j)
        return PointCloudPair(
            source=source,
            target=target,
            T_gt=entry.T.copy(),
            name=f"{self.benchmark}/{self.name}/{entry.j}_{entry.i}",
            meta={"dataset": self.benchmark.lower(), "scene": self.name, "i": entry.i, "j": entry.j,
                  "information": self.info.get(key), "overlap": self.overlap.get(key)},
        )

    def __iter__(self) -> Iterator[PointCloudPair]:
        for k in range(len(self)):
            yield self[k]


def threedmatch_pairs(
    fragments_root: str | Path,
    benchmark_root: str | Path,
    benchmark: str = "3DMatch",
    scenes: list[str] | None = None,
) -> Iterator[PointCloudPair]:
    """All pairs of a benchmark: fragments in ``<fragments_root>/<scene>/``, ground truth in
    ``<benchmark_root>/<benchmark>/<scene>/`` (scenes: every scene folder of the benchmark)."""
    if benchmark not in BENCHMARKS:
        raise ValueError(f"benchmark must be one of {BENCHMARKS}, got {benchmark!r}")
    gt_root = Path(benchmark_root) / benchmark
    if not gt_root.is_dir():
        raise FileNotFoundError(f"3DMatch benchmark folder not found: {gt_root}")
    for scene in scenes or sorted(p.name for p in gt_root.iterdir() if p.is_dir()):
        yield from ThreeDMatchScene(Path(fragments_root) / scene, gt_root / scene, benchmark)


def threedmatch_demo_pair() -> PointCloudPair:
    """The bundled real 3DMatch pair: source = src.npy, target = ref.npy, T_gt = gt.npy.

    ``gt`` maps src into ref's frame: points within 5 cm of ref rise from 17.0 % (identity) to
    44.8 % with ``gt`` and fall to 7.3 % with its inverse (see test_threedmatch.py).
    """
    folder = paths.THREEDMATCH_DEMO_DIR
    T_gt = np.load(folder / "gt.npy", allow_pickle=False).astype(np.float64)
    return PointCloudPair(
        source=read_points(folder / "src.npy").astype(np.float32),  # stored float64; indoor, near the origin
        target=read_points(folder / "ref.npy").astype(np.float32),
        T_gt=T_gt,
        name="3dmatch_demo",
        meta={"dataset": "3dmatch", "origin": "GeoTransformer demo data (MIT); 3DMatch, Zeng et al."},
    )
