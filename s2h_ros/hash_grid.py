"""Exact neighbour search within a radius, on a torch device: a hash grid of cells as large as the radius.

A point's neighbours within ``cell`` lie in the 27 cells around its own, so a search gathers the
points of those cells (sorted by cell key once, when the grid is built) and ranks them by distance.
Where ``device`` is a GPU this replaces scipy's ``cKDTree`` on the scan's path (the tracking
support, the verification's nearest voxels, the normals' neighbourhoods): cKDTree runs on the CPU,
and on a GPU machine its all-core queries (``workers=-1`` starts a thread per core per query)
competed with the preparer and keyframe threads: on an H200 host at 10 Hz the tracking support
took 45 ms a scan inside the odometry where its query alone takes 5 ms, and 8 ms on the device;
the normals of a scan 69 -> 13 ms with the closed-form eigen-solver (docs/performance.md). Written
here because no maintained library does it for torch tensors on any device: Open3D's tensor
neighbour search needs its CUDA build (not on PyPI for every platform), torch_cluster and faiss are
CUDA builds tied to one torch version.

:class:`DeviceIndex` puts cKDTree's ``query`` contract (distances, inf where none; indices, ``n``
where none) over one grid per radius asked, so the pipeline's callers take either.
"""
from __future__ import annotations

import numpy as np
import torch

# Hash of integer cell coordinates: 21 bits per axis (cells of 0.6 m: +-600 km around the frame's origin).
_BITS = 21
_OFFSET = 1 << (_BITS - 1)
_NEIGHBOUR_CELLS = torch.tensor([[i, j, k] for i in (-1, 0, 1) for j in (-1, 0, 1) for k in (-1, 0, 1)])
# Candidate entries (queries x 27 cells x cell capacity) gathered at once: bounds a search's memory
# whatever the density (25-41 bytes an entry in float32 / float64: 100-170 MB).
CANDIDATE_BUDGET = 1 << 22


def _cell_keys(cells: torch.Tensor) -> torch.Tensor:
    """``(..., 3)`` int64 cell coordinates -> ``(...)`` int64 keys (one per cell)."""
    c = cells + _OFFSET
    return (c[..., 0] << (2 * _BITS)) | (c[..., 1] << _BITS) | c[..., 2]


class HashGrid:
    """The ``(M, 3)`` ``points`` (a float tensor on any device) in cells of ``cell`` metres; searches
    within ``cell`` of a query are exact."""

    def __init__(self, points: torch.Tensor, cell: float) -> None:
        self.points, self.cell = points, float(cell)
        keys = _cell_keys(torch.floor(points / self.cell).long())
        keys, self.order = torch.sort(keys)
        self.keys, counts = torch.unique_consecutive(keys, return_counts=True)
        self.starts = torch.cumsum(counts, 0) - counts
        self.counts = counts
        self.capacity = int(counts.max()) if len(counts) else 0

    def _chunk(self) -> int:
        return max(1, CANDIDATE_BUDGET // max(1, 27 * self.capacity))

    def _candidates(self, query: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(n, 27 * capacity)`` squared distances of the points in the 27 cells around each of the
        ``(n, 3)`` queries (inf from ``cell`` on and in empty slots) and their indices into ``points``."""
        slots = torch.arange(self.capacity, device=query.device)
        keys = _cell_keys(torch.floor(query / self.cell).long()[:, None, :] + _NEIGHBOUR_CELLS.to(query.device))
        pos = torch.searchsorted(self.keys, keys).clamp_max(len(self.keys) - 1)
        count = torch.where(self.keys[pos] == keys, self.counts[pos], 0)  # (n, 27)
        valid = slots < count[..., None]  # (n, 27, capacity)
        cand = self.order[torch.where(valid, self.starts[pos][..., None] + slots, 0)]
        d2 = ((self.points[cand] - query[:, None, None, :]) ** 2).sum(-1)
        d2 = torch.where(valid & (d2 < self.cell ** 2), d2, float("inf"))
        return d2.flatten(1), cand.flatten(1)

    def nearest(self, query: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(N,)`` squared distance to the nearest point closer than ``cell`` (inf where none) and
        its ``(N,)`` index (-1 where none), for ``(N, 3)`` queries on the grid's device."""
        d2, idx = self.knearest(query, 1)
        return d2[:, 0], idx[:, 0]

    def knearest(self, query: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(N, k)`` squared distances to the ``k`` nearest points closer than ``cell``, ascending
        (inf where fewer), and their ``(N, k)`` indices (-1 there)."""
        d2 = torch.full((len(query), k), float("inf"), device=query.device, dtype=query.dtype)
        idx = torch.full((len(query), k), -1, device=query.device, dtype=torch.long)
        if self.capacity == 0 or len(query) == 0 or k < 1:
            return d2, idx
        chunk = self._chunk()
        for lo in range(0, len(query), chunk):
            dist, cand = self._candidates(query[lo:lo + chunk])
            m = min(k, dist.shape[1])
            best, arg = (dist.min(1, keepdim=True) if m == 1 else torch.topk(dist, m, dim=1, largest=False))
            found = torch.isfinite(best)
            d2[lo:lo + len(dist), :m] = best
            idx[lo:lo + len(dist), :m] = torch.where(found, cand.gather(1, arg), -1)
        return d2, idx


class DeviceIndex:
    """scipy ``cKDTree``'s ``query`` over ``(M, 3)`` points, searched on ``device`` (one
    :class:`HashGrid` per radius asked, built on first use and kept): a keyframe's voxels serve
    many scans' searches."""

    def __init__(self, points: np.ndarray, device: str | torch.device) -> None:
        self.n = len(points)
        self.points = torch.as_tensor(np.asarray(points, dtype=np.float32), device=device)
        self._grids: dict[float, HashGrid] = {}

    def grid(self, radius: float) -> HashGrid:
        radius = float(radius)
        if radius not in self._grids:
            self._grids[radius] = HashGrid(self.points, radius)
        return self._grids[radius]

    def query(self, x, k: int = 1, distance_upper_bound: float = np.inf, workers: int = 1):
        """cKDTree's ``query``: ``(N,)`` (``k`` 1) or ``(N, k)`` distances to the ``k`` nearest
        points closer than ``distance_upper_bound`` (finite: the grid's cell), inf where fewer, and
        their indices (``n`` there), as numpy arrays; ``workers`` is accepted and unused."""
        if not np.isfinite(distance_upper_bound) or distance_upper_bound <= 0:
            raise ValueError(f"a device index needs a finite positive distance_upper_bound, got {distance_upper_bound}")
        queries = torch.as_tensor(np.asarray(x, dtype=np.float32), device=self.points.device).reshape(-1, 3)
        d2, idx = self.grid(distance_upper_bound).knearest(queries, int(k))
        none = idx < 0
        dist = torch.where(none, float("inf"), d2.double().sqrt()).cpu().numpy()
        idx = torch.where(none, self.n, idx).cpu().numpy()
        return (dist[:, 0], idx[:, 0]) if k == 1 else (dist, idx)
