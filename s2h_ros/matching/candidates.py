"""Sparse candidate support for S2H at lidar scale: each point's k nearest neighbours in feature space, both ways.

A dense ``Nx x Ny`` score matrix is 400M entries at 20k points; the support keeps the pairs that
can carry probability mass (a point's k best partners seen from either cloud). Feature k-NN is a
chunked ``cdist``-style GEMM plus ``topk`` in torch, so it runs on whatever device the features
are on (KD-trees such as scipy's ``cKDTree`` are slow in 32 dimensions and CPU-only).
"""
from __future__ import annotations

import torch


def _check_features(name: str, f: torch.Tensor) -> None:
    if not isinstance(f, torch.Tensor) or f.ndim != 2 or f.shape[0] == 0 or f.shape[1] == 0:
        shape = tuple(f.shape) if isinstance(f, torch.Tensor) else type(f).__name__
        raise ValueError(f"{name} must be a non-empty (N, C) torch tensor, got {shape}")
    if not bool(torch.isfinite(f).all()):
        raise ValueError(f"{name} contains NaN or inf")


def feature_knn(query: torch.Tensor, ref: torch.Tensor, k: int, chunk: int = 512) -> torch.Tensor:
    """Indices ``(Nq, k') int64`` of the ``k' = min(k, Nr)`` nearest ``ref`` rows (squared L2) per query row.

    Chunks of ``chunk`` queries keep the distance block small (memory-bound otherwise).
    """
    k = min(int(k), ref.shape[0])
    with torch.no_grad():
        ref = ref.detach()
        ref_sq = (ref * ref).sum(1)[None, :]
        d2 = torch.empty((min(chunk, query.shape[0]), ref.shape[0]), dtype=ref.dtype, device=ref.device)
        out = []
        for start in range(0, query.shape[0], chunk):
            q = query[start : start + chunk].detach()
            block = d2[: q.shape[0]]
            torch.addmm(ref_sq, q, ref.T, beta=1.0, alpha=-2.0, out=block)  # |r|^2 - 2 q.r (+|q|^2: same order)
            out.append(torch.topk(block, k, dim=1, largest=False).indices)
    return torch.cat(out)


def candidate_support(feat_x: torch.Tensor, feat_y: torch.Tensor, k: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
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
