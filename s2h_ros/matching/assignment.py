"""H-step: project a soft matrix ``P`` to a partial permutation matrix (PPM) by exact assignment.

The paper augments the ``Nx x Ny`` profit matrix ``P`` to ``(Nx+Ny) x (Nx+Ny)``::

    [[ P            , diag(sigma_x) ],
     [ diag(sigma_y), 0             ]]

and solves a maximum-profit assignment; the ``Nx x Ny`` crop is the PPM. With ``sigma >= 0`` that
optimum equals a maximum-weight bipartite matching with edge weights
``w_ij = P_ij - sigma_x_i - sigma_y_j`` (total profit = sum of all sigmas + sum of matched ``w``),
which gives two exact reductions used by the sparse solver: a pair with ``w_ij <= 0`` never helps
and is dropped, and a pair that is the only positive edge of both its points is matched as is.
The rest is one call of scipy's sparse LAPJV (``min_weight_full_bipartite_matching``), where each
row also gets a private "unmatched" column: every row can always be matched, there are no
dummy-to-dummy edges (whose ties stall the solver), and each augmenting-path search stays inside
its own connected component.

``sigma`` (the outlier profit) follows one of these rules (``outlier_profit=``):

- ``"inverse_variance"``: the paper's literal ``1 / var(row or column of P)``. For a one-hot row
  the variance is about ``1/N`` so ``sigma ~ N`` and nothing is ever matched; kept for reference.
- ``"scaled_inverse_variance"`` (default, scale 1/16): ``scale / (n var)``, i.e. ``1/var`` divided
  by the row length n, about ``scale / p^2`` for a row with one peak of mass ``p`` and still large
  for flat rows; a mutual one-peak pair is kept when roughly ``p^3 > 2 scale`` (p > 0.5).
- ``"slack"``: ``scale * (1 - row or column sum of P)``: the mass the S-step already sent to its
  slack (outlier) bin; with ``scale = 0.5`` a pair is matched when ``P_ij`` exceeds the mean
  outlier mass of its two points.
- ``"constant"`` (or a plain float): the same ``sigma`` everywhere (the authors' code used 5e-5).

The default was chosen by measurement (docs/matching.md).
"""
from __future__ import annotations

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import min_weight_full_bipartite_matching

from s2h_ros.matching.defaults import REGISTRATION

OUTLIER_RULES = ("inverse_variance", "scaled_inverse_variance", "slack", "constant")
DEFAULT_SCALE = {"inverse_variance": 1.0, "scaled_inverse_variance": 1.0 / 16.0, "slack": 0.5, "constant": 5e-5}
DEFAULT_OUTLIER_PROFIT = REGISTRATION.outlier_profit  # measured choice (docs/matching.md), set in RegistrationConfig
VAR_EPS = 1e-12  # variance floor: constant rows/columns give a large finite sigma, never inf/NaN


def _resolve(outlier_profit: str | float, scale: float | None) -> tuple[str, float]:
    if isinstance(outlier_profit, (int, float)) and not isinstance(outlier_profit, bool):
        return "constant", float(outlier_profit)
    if outlier_profit not in OUTLIER_RULES:
        raise ValueError(f"outlier_profit must be a float or one of {OUTLIER_RULES}, got {outlier_profit!r}")
    value = DEFAULT_SCALE[outlier_profit] if scale is None else float(scale)
    if not value >= 0:
        raise ValueError(f"outlier scale must be >= 0, got {value}")
    return outlier_profit, value


def outlier_profit_from_moments(
    total: np.ndarray, sumsq: np.ndarray, n: int, outlier_profit: str | float = DEFAULT_OUTLIER_PROFIT,
    scale: float | None = None,
) -> np.ndarray:
    """``sigma`` per row (or column) of ``P`` from its sum and sum of squares over ``n`` entries.

    Moments let the dense and the sparse H-step share one rule: entries off a sparse support are 0.
    """
    rule, value = _resolve(outlier_profit, scale)
    if rule == "constant":
        return np.full(total.shape, value, dtype=np.float64)
    if rule == "slack":
        return value * np.clip(1.0 - total, 0.0, 1.0)
    var = np.maximum(sumsq / n - (total / n) ** 2, VAR_EPS)
    return value / var if rule == "inverse_variance" else value / (n * var)


def outlier_profits(
    P: np.ndarray, outlier_profit: str | float = DEFAULT_OUTLIER_PROFIT, scale: float | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``(sigma_x (Nx,), sigma_y (Ny,))`` for a dense ``P`` ``(Nx, Ny)``."""
    P = np.asarray(P, dtype=np.float64)
    n_x, n_y = P.shape
    sq = P * P
    return (
        outlier_profit_from_moments(P.sum(1), sq.sum(1), n_y, outlier_profit, scale),
        outlier_profit_from_moments(P.sum(0), sq.sum(0), n_x, outlier_profit, scale),
    )


def _check_P(P: np.ndarray) -> None:
    if P.ndim != 2 or 0 in P.shape:
        raise ValueError(f"P must be a non-empty (Nx, Ny) matrix, got shape {P.shape}")
    if not np.isfinite(P).all():
        raise ValueError("P contains NaN or inf")


def _check_sigma(sigma: np.ndarray, n: int, name: str) -> np.ndarray:
    sigma = np.asarray(sigma, dtype=np.float64).reshape(-1)
    if sigma.shape != (n,):
        raise ValueError(f"{name} must have shape ({n},), got {sigma.shape}")
    if not np.isfinite(sigma).all() or (sigma < 0).any():
        raise ValueError(f"{name} must be finite and >= 0 (the augmented assignment assumes it)")
    return sigma


def augmented_profit_matrix(P: np.ndarray, sigma_x: np.ndarray, sigma_y: np.ndarray) -> np.ndarray:
    """The paper's ``(Nx+Ny) x (Ny+Nx)`` profit matrix ``[[P, diag(sigma_x)], [diag(sigma_y), 0]]``."""
    n_x, n_y = P.shape
    A = np.zeros((n_x + n_y, n_y + n_x), dtype=np.float64)
    A[:n_x, :n_y] = P
    A[np.arange(n_x), n_y + np.arange(n_x)] = sigma_x
    A[n_x + np.arange(n_y), np.arange(n_y)] = sigma_y
    return A


def _dense_ppm(P: np.ndarray, outlier_profit: str | float, scale: float | None) -> np.ndarray:
    _check_P(P)
    sigma_x, sigma_y = outlier_profits(P, outlier_profit, scale)
    rows, cols = linear_sum_assignment(augmented_profit_matrix(P, sigma_x, sigma_y), maximize=True)
    keep = (rows < P.shape[0]) & (cols < P.shape[1])
    M = np.zeros(P.shape, dtype=np.float64)
    M[rows[keep], cols[keep]] = 1.0
    return M


def partial_permutation(
    P: np.ndarray | torch.Tensor, outlier_profit: str | float = DEFAULT_OUTLIER_PROFIT, scale: float | None = None
) -> np.ndarray | torch.Tensor:
    """The paper's H-step on a dense ``P`` ``(Nx, Ny)`` or ``(B, Nx, Ny)``: 0/1 PPM of the same shape.

    Exact: builds the augmented ``(Nx+Ny)^2`` profit matrix and solves it with scipy's
    ``linear_sum_assignment``. O((Nx+Ny)^3): for large clouds use ``sparse_partial_permutation``.
    numpy in -> numpy out; torch in -> torch out (same dtype and device, no gradient).
    """
    is_torch = isinstance(P, torch.Tensor)
    P_np = P.detach().cpu().double().numpy() if is_torch else np.asarray(P, dtype=np.float64)
    if P_np.ndim == 3:
        M = np.stack([_dense_ppm(p, outlier_profit, scale) for p in P_np])
    else:
        M = _dense_ppm(P_np, outlier_profit, scale)
    if is_torch:
        return torch.as_tensor(M, dtype=P.dtype, device=P.device)
    return M.astype(P_np.dtype if np.issubdtype(np.asarray(P).dtype, np.floating) else np.float64)


def partial_permutation_profit(
    p_matched: np.ndarray, src_idx: np.ndarray, tgt_idx: np.ndarray, sigma_x: np.ndarray, sigma_y: np.ndarray
) -> float:
    """Objective of a PPM on the augmented matrix: matched ``P`` plus ``sigma`` of every unmatched point."""
    unmatched_x = np.ones(len(sigma_x), dtype=bool)
    unmatched_y = np.ones(len(sigma_y), dtype=bool)
    unmatched_x[src_idx] = False
    unmatched_y[tgt_idx] = False
    return float(np.sum(p_matched) + sigma_x[unmatched_x].sum() + sigma_y[unmatched_y].sum())


def _to_numpy(a, dtype) -> np.ndarray:
    if isinstance(a, torch.Tensor):
        a = a.detach().cpu().numpy()
    return np.asarray(a, dtype=dtype).reshape(-1)


def _max_weight_matching(rows: np.ndarray, cols: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Exact maximum-weight (not necessarily perfect) bipartite matching, all ``w > 0``, unique edges.

    Rows and columns are relabelled to the nodes present; the side with fewer nodes becomes the
    rows, each with a private zero-profit "unmatched" column. Costs are shifted to ``c - w`` (and
    ``c`` for unmatched) with ``c > max w``: the shift is the same for every row, so the optimum is
    unchanged, and all costs stay > 0 (scipy treats explicit zeros as missing edges).
    """
    ur, r = np.unique(rows, return_inverse=True)
    uc, c = np.unique(cols, return_inverse=True)
    swap = len(uc) < len(ur)
    if swap:
        ur, uc, r, c = uc, ur, c, r
    n_r, n_c = len(ur), len(uc)
    shift = 1.0 + float(w.max())
    data = np.concatenate([shift - w, np.full(n_r, shift)])
    indices = np.concatenate([c, n_c + np.arange(n_r)])
    indptr_rows = np.concatenate([r, np.arange(n_r)])
    graph = csr_matrix((data, (indptr_rows, indices)), shape=(n_r, n_c + n_r))
    mr, mc = min_weight_full_bipartite_matching(graph)
    real = mc < n_c
    src, tgt = ur[mr[real]], uc[mc[real]]
    return (tgt, src) if swap else (src, tgt)


def sparse_partial_permutation(
    rows: np.ndarray | torch.Tensor,
    cols: np.ndarray | torch.Tensor,
    p: np.ndarray | torch.Tensor,
    n_x: int,
    n_y: int,
    sigma_x: np.ndarray | torch.Tensor,
    sigma_y: np.ndarray | torch.Tensor,
) -> tuple[np.ndarray, np.ndarray]:
    """Exact H-step on a sparse candidate support: matched ``(src_idx (K,), tgt_idx (K,))`` int64.

    ``rows``, ``cols``, ``p``: ``(E,)`` edges of ``P`` (duplicates keep their largest ``p``);
    ``sigma_x (n_x,)``, ``sigma_y (n_y,)``: outlier profits, >= 0. Every point may stay unmatched
    at its own ``sigma``; the result maximises the augmented profit over all PPMs on the support,
    so on a support that contains the dense optimum's pairs it equals the dense H-step.
    """
    rows, cols, p = _to_numpy(rows, np.int64), _to_numpy(cols, np.int64), _to_numpy(p, np.float64)
    if not (rows.shape == cols.shape == p.shape):
        raise ValueError(f"rows, cols, p must have equal length, got {rows.shape}, {cols.shape}, {p.shape}")
    if not np.isfinite(p).all():
        raise ValueError("p contains NaN or inf")
    if rows.size and (rows.min() < 0 or rows.max() >= n_x or cols.min() < 0 or cols.max() >= n_y):
        raise ValueError(f"edge indices out of range for n_x={n_x}, n_y={n_y}")
    sigma_x = _check_sigma(_to_numpy(sigma_x, np.float64), n_x, "sigma_x")
    sigma_y = _check_sigma(_to_numpy(sigma_y, np.float64), n_y, "sigma_y")
    empty = np.zeros(0, dtype=np.int64)

    # Reduction 1: a pair that cannot beat leaving both points unmatched is never in the optimum.
    w = p - sigma_x[rows] - sigma_y[cols]
    keep = w > 0
    rows, cols, w = rows[keep], cols[keep], w[keep]
    if rows.size == 0:
        return empty, empty.copy()
    # Duplicated edges: keep the best (sort by key, then by weight descending).
    key = rows * n_y + cols
    order = np.lexsort((-w, key))
    first = np.ones(order.size, dtype=bool)
    first[1:] = key[order][1:] != key[order][:-1]
    rows, cols, w = rows[order][first], cols[order][first], w[order][first]

    # Reduction 2: an edge that is the only positive edge of both its points is a component on its own.
    lone = (np.bincount(rows, minlength=n_x)[rows] == 1) & (np.bincount(cols, minlength=n_y)[cols] == 1)
    src, tgt = [rows[lone]], [cols[lone]]
    if (~lone).any():
        s, t = _max_weight_matching(rows[~lone], cols[~lone], w[~lone])
        src.append(s)
        tgt.append(t)
    src_idx, tgt_idx = np.concatenate(src), np.concatenate(tgt)
    order = np.argsort(src_idx, kind="stable")
    return src_idx[order].astype(np.int64), tgt_idx[order].astype(np.int64)
