"""Soft-to-hard (S2H) matching: S-step (augmented Sinkhorn) then H-step (exact PPM), straight-through.

Forward returns the hard partial permutation ``M``; backward hands the incoming gradient to the
soft matrix ``P`` unchanged and never into the discrete solver, so every score receives a
gradient through Sinkhorn, not only the matched ones (the paper's argument against plain hard
matching). ``s2h_match`` is the same procedure at lidar scale, on a sparse candidate support.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from s2h_ros.matching.assignment import (
    DEFAULT_OUTLIER_PROFIT,
    outlier_profit_from_moments,
    partial_permutation,
    sparse_partial_permutation,
)
from s2h_ros.matching.candidates import candidate_support
from s2h_ros.matching.sinkhorn import augmented_sinkhorn, sparse_augmented_sinkhorn


class StraightThroughPPM(torch.autograd.Function):
    """``M = H(P)`` forward, ``dL/dP = dL/dM`` backward (the paper's "deceptive operation")."""

    @staticmethod
    def forward(ctx, P: torch.Tensor, outlier_profit: str | float, scale: float | None) -> torch.Tensor:
        return partial_permutation(P.detach(), outlier_profit, scale)

    @staticmethod
    def backward(ctx, grad_M: torch.Tensor):
        return grad_M, None, None


def soft_to_hard(
    x: torch.Tensor,
    *,
    is_soft: bool = False,
    iters: int = 5,
    slack_score: float = 0.0,
    outlier_profit: str | float = DEFAULT_OUTLIER_PROFIT,
    scale: float | None = None,
    return_soft: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """PPM ``M`` ``(Nx, Ny)`` or ``(B, Nx, Ny)`` from scores (S-step first) or from ``P`` (``is_soft=True``).

    ``M`` is 0/1 in value; its gradient flows to ``P`` and through Sinkhorn to the scores.
    With ``return_soft`` also returns ``P``.
    """
    P = x if is_soft else augmented_sinkhorn(x, iters=iters, slack_score=slack_score)
    M = StraightThroughPPM.apply(P, outlier_profit, scale)
    return (M, P) if return_soft else M


@dataclass
class MatchResult:
    """Output of ``s2h_match``: the PPM as index pairs plus the soft support it came from."""

    src_idx: torch.Tensor  # (K,) int64 rows of feat_x that are matched
    tgt_idx: torch.Tensor  # (K,) int64 their partners in feat_y
    p_values: torch.Tensor  # (K,) P on the matched pairs (differentiable in the features)
    rows: torch.Tensor  # (E,) int64 candidate edges (x index)
    cols: torch.Tensor  # (E,) int64 candidate edges (y index)
    p: torch.Tensor  # (E,) P on every candidate edge
    sigma_x: np.ndarray  # (Nx,) outlier profit per source point
    sigma_y: np.ndarray  # (Ny,) outlier profit per target point
    stats: dict = field(default_factory=dict)  # edge counts


def edge_scores(feat_x: torch.Tensor, feat_y: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor,
                temperature: float) -> torch.Tensor:
    """``s_e = -||f_x[rows] - f_y[cols]||^2 / temperature`` ``(E,)`` (differentiable)."""
    diff = feat_x[rows] - feat_y[cols]
    return -(diff * diff).sum(1) / temperature


def sparse_outlier_profits(
    rows: torch.Tensor, cols: torch.Tensor, p: torch.Tensor, n_x: int, n_y: int,
    outlier_profit: str | float = DEFAULT_OUTLIER_PROFIT, scale: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``(sigma_x (n_x,), sigma_y (n_y,))`` of a sparse ``P`` (entries off the support are 0)."""
    r, c = rows.detach().cpu().numpy(), cols.detach().cpu().numpy()
    v = p.detach().cpu().double().numpy()
    moments = lambda idx, n, length: outlier_profit_from_moments(  # noqa: E731
        np.bincount(idx, v, n), np.bincount(idx, v * v, n), length, outlier_profit, scale
    )
    return moments(r, n_x, n_y), moments(c, n_y, n_x)


def s2h_match(
    feat_x: torch.Tensor,
    feat_y: torch.Tensor,
    k: int = 16,
    iters: int = 5,
    temperature: float = 0.1,
    slack_score: float = -5.0,
    outlier_profit: str | float = DEFAULT_OUTLIER_PROFIT,
    scale: float | None = None,
    support: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> MatchResult:
    """S2H on features ``(Nx, C)``, ``(Ny, C)``: k-NN support both ways (or the given ``support``
    edges ``(rows, cols)``, unique and sorted, e.g. ``prior_support``), sparse S-step, exact sparse H-step.

    Scores are ``-||f_x - f_y||^2 / temperature``; ``slack_score`` is the score of "no partner"
    (a pair with squared feature distance above ``-slack_score * temperature`` loses to the slack;
    the defaults put that at 0.5, i.e. feature distance 0.7 for unit-norm features such as FCGF).
    Every tensor in the result lives on the features' device; the H-step itself runs on the CPU.
    """
    n_x, n_y = feat_x.shape[0], feat_y.shape[0]
    rows, cols = candidate_support(feat_x, feat_y, k) if support is None else support
    scores = edge_scores(feat_x, feat_y, rows, cols, temperature)
    p = sparse_augmented_sinkhorn(rows, cols, scores, n_x, n_y, iters=iters, slack_score=slack_score)
    sigma_x, sigma_y = sparse_outlier_profits(rows, cols, p, n_x, n_y, outlier_profit, scale)
    src, tgt = sparse_partial_permutation(rows, cols, p.detach(), n_x, n_y, sigma_x, sigma_y)
    src_idx = torch.as_tensor(src, device=feat_x.device)
    tgt_idx = torch.as_tensor(tgt, device=feat_x.device)
    # P on the matched pairs: look the pairs up among the (row-major sorted, unique) edges.
    keys = rows * n_y + cols
    pos = torch.searchsorted(keys, src_idx * n_y + tgt_idx)
    return MatchResult(
        src_idx=src_idx, tgt_idx=tgt_idx, p_values=p[pos], rows=rows, cols=cols, p=p,
        sigma_x=sigma_x, sigma_y=sigma_y, stats={"edges": int(rows.numel()), "matches": int(src.size)},
    )
