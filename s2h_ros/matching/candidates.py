"""Sparse candidate support for S2H at lidar scale: each point's k nearest neighbours in feature
space, both ways (global search), or, with a motion prior, the k best in feature space among the
points near each point's predicted position (tracking, :func:`prior_support`).

A dense ``Nx x Ny`` score matrix is 400M entries at 20k points; the support keeps the pairs that
can carry probability mass (a point's k best partners seen from either cloud). The search is
exact brute force in torch, so it runs on whatever device the features are on (KD-trees such as
scipy's ``cKDTree`` are slow in 32 dimensions and CPU-only; faiss is not a dependency here).

The cost is in ``topk``, which over a whole row takes longer than the GEMM that made the row;
*grouped selection* (written by hand: no maintained library does it for torch tensors) cuts each
row into groups of ``G`` and searches only the k groups with the smallest minimum. Every one of the
k smallest entries lies in such a group (at most k groups hold an entry <= the k-th smallest), so
the result is exact, at about a third of the time of a full-row ``topk`` on the CPU.
"""
from __future__ import annotations

import numpy as np
import torch

from s2h_ros.config import cpu_workers
from s2h_ros.matching.defaults import REGISTRATION

GROUP = 32  # entries per group in the grouped selection (fastest of 4..128 measured on a CPU)
CHUNK = 512  # query rows per distance block


def _check_features(name: str, f: torch.Tensor) -> None:
    if not isinstance(f, torch.Tensor) or f.ndim != 2 or f.shape[0] == 0 or f.shape[1] == 0:
        shape = tuple(f.shape) if isinstance(f, torch.Tensor) else type(f).__name__
        raise ValueError(f"{name} must be a non-empty (N, C) torch tensor, got {shape}")
    if not bool(torch.isfinite(f).all()):
        raise ValueError(f"{name} contains NaN or inf")


def smallest_k(block: torch.Tensor, k: int, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """``(values (R, k), columns (R, k) int64)`` of the k smallest entries of each row of ``block (R, C)``.

    Exact; uses the grouped selection when ``C`` is a multiple of ``group`` with at least k groups.
    """
    R, C = block.shape
    if C % group or C // group <= k:
        return torch.topk(block, k, dim=1, largest=False)
    group_min = block.view(R, C // group, group).amin(2)
    best_groups = torch.topk(group_min, k, dim=1, largest=False, sorted=False).indices  # (R, k)
    offsets = torch.arange(group, device=block.device)
    cand = (best_groups[:, :, None] * group + offsets).reshape(R, k * group)
    values, pos = torch.topk(torch.gather(block, 1, cand), k, dim=1, largest=False)
    return values, torch.gather(cand, 1, pos)


def _padded(n: int, group: int = GROUP) -> int:
    return -(-n // group) * group


def feature_knn(query: torch.Tensor, ref: torch.Tensor, k: int, chunk: int = CHUNK) -> torch.Tensor:
    """Indices ``(Nq, k') int64`` of the ``k' = min(k, Nr)`` nearest ``ref`` rows (squared L2) per query row.

    Blocks of ``chunk`` queries keep the distance matrix small; the ref side is padded to a whole
    number of groups with columns at infinite distance.
    """
    n_r = ref.shape[0]
    k = min(int(k), n_r)
    with torch.no_grad():
        query, ref = query.detach(), ref.detach()
        width = _padded(n_r)
        ref_p = torch.cat([ref, ref.new_zeros(width - n_r, ref.shape[1])]) if width > n_r else ref
        ref_sq = (ref_p * ref_p).sum(1)[None, :]
        block = torch.empty((min(chunk, query.shape[0]), width), dtype=ref.dtype, device=ref.device)
        out = []
        for start in range(0, query.shape[0], chunk):
            q = query[start : start + chunk]
            b = block[: q.shape[0]]
            torch.addmm(ref_sq, q, ref_p.T, beta=1.0, alpha=-2.0, out=b)  # |r|^2 - 2 q.r (+|q|^2: same order)
            b[:, n_r:] = float("inf")
            out.append(smallest_k(b, k)[1])
    return torch.cat(out)


def candidate_support(feat_x: torch.Tensor, feat_y: torch.Tensor, k: int = REGISTRATION.k) -> tuple[torch.Tensor, torch.Tensor]:
    """Edges ``(rows (E,), cols (E,))`` int64, unique, sorted by row: x's k-NN in y plus y's k-NN in x.

    ``feat_x (Nx, C)``, ``feat_y (Ny, C)`` on any device; the edges live there too.
    """
    _check_features("feat_x", feat_x)
    _check_features("feat_y", feat_y)
    if feat_x.shape[1] != feat_y.shape[1]:
        raise ValueError(f"feature dimensions differ: {feat_x.shape[1]} vs {feat_y.shape[1]}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    n_x, n_y = feat_x.shape[0], feat_y.shape[0]
    nn_y = feature_knn(feat_x, feat_y, k)  # (Nx, k)
    nn_x = feature_knn(feat_y, feat_x, k)  # (Ny, k)
    ix = torch.arange(n_x, device=feat_x.device)[:, None].expand_as(nn_y)
    iy = torch.arange(n_y, device=feat_x.device)[:, None].expand_as(nn_x)
    keys = torch.cat([ix.reshape(-1) * n_y + nn_y.reshape(-1), nn_x.reshape(-1) * n_y + iy.reshape(-1)])
    keys = torch.unique(keys)
    return keys // n_y, keys % n_y


def prior_support(predicted_x: np.ndarray, tree_y, feat_x: torch.Tensor, feat_y: torch.Tensor, radius: float,
                  k: int = REGISTRATION.k, candidates: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """Edges ``(rows (E,), cols (E,))`` int64, unique, sorted: for each x, the ``k`` y in feature
    order among the ``candidates`` y nearest to x's predicted position within ``radius``.

    The tracking-mode support: ``predicted_x (Nx, 3)`` are x's points moved by a motion prior into
    y's frame, ``tree_y`` y's spatial index with cKDTree's ``query`` (``PreparedCloud.spatial_index``,
    built once per keyframe: scipy's cKDTree on the CPU, a hash grid on a GPU device); the feature
    ranking runs on the features' device. Points with no y within ``radius`` get no edge (they stay
    unmatched).
    """
    _check_features("feat_x", feat_x)
    _check_features("feat_y", feat_y)
    n_y = feat_y.shape[0]
    m = min(int(candidates), n_y)
    _, near = tree_y.query(np.asarray(predicted_x, dtype=np.float64), k=m, distance_upper_bound=radius, workers=cpu_workers())
    n_x = len(predicted_x)
    near = torch.as_tensor(np.asarray(near, dtype=np.int64).reshape(n_x, m), device=feat_x.device)
    valid = near < n_y
    cols = torch.where(valid, near, torch.zeros_like(near))
    with torch.no_grad():
        fx, fy = feat_x.detach(), feat_y.detach()
        # |x - y|^2 = |x|^2 + |y|^2 - 2 x.y: one (Nx, m, C) gather and a batched dot, no difference
        # tensor. Rows are gathered with index_select: on the CPU, advanced indexing (fy[cols]) took
        # 4-6x as long for the same copy (torch 2.13, 6,000 x 32 candidates: 26 against 4.4 ms).
        flat = cols.reshape(-1)
        sq_y = torch.linalg.vector_norm(fy, dim=1).square().index_select(0, flat).view(n_x, m)
        near_f = fy.index_select(0, flat).view(n_x, m, fy.shape[1])
        d = torch.linalg.vector_norm(fx, dim=1).square()[:, None] + sq_y - 2.0 * torch.einsum("nc,nmc->nm", fx, near_f)
        d = torch.where(valid, d, torch.full_like(d, float("inf")))
        # the order among a row's k does not matter: the edges are sorted by torch.unique below
        dist, pos = torch.topk(d, min(int(k), m), dim=1, largest=False, sorted=False)
    rows = torch.arange(n_x, device=feat_x.device)[:, None].expand_as(pos)
    keep = torch.isfinite(dist)
    keys = torch.unique(rows[keep] * n_y + torch.gather(cols, 1, pos)[keep])
    return keys // n_y, keys % n_y
