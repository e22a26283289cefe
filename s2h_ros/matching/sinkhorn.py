"""S-step: Augmented-Sinkhorn (RPMNet) in the log domain, dense and on a sparse candidate support.

A slack ("trash bin") row and column of constant score are added to the ``Nx x Ny`` score matrix;
rows of the real part and the slack column are normalised, then columns of the real part and
the slack row, alternately. The slack row/column themselves are never normalised, so mass of
points without a partner flows into them. Written as dual potentials ``u`` (rows) and ``v``
(columns), ``log P_ij = s_ij + u_i + v_j``, which is the same iteration without materialising
the padded matrix. Written here because torch has no Sinkhorn, and the sparse form (scores only
on candidate edges, one ``scatter``-based logsumexp per step) exists in no maintained library.

Both forms end with one exact projection: rows whose real mass exceeds 1 (possible after the
last column step when the iteration has not converged) are scaled down to 1. That keeps every
row and column sum <= 1 for any ``iters`` and is the identity once Sinkhorn has converged.
"""
from __future__ import annotations

import torch

from s2h_ros.matching.defaults import REGISTRATION


def _check_scores(scores: torch.Tensor) -> None:
    if not isinstance(scores, torch.Tensor):
        raise TypeError(f"scores must be a torch.Tensor, got {type(scores).__name__}")
    if scores.ndim not in (2, 3):
        raise ValueError(f"scores must have shape (Nx, Ny) or (B, Nx, Ny), got {tuple(scores.shape)}")
    if scores.shape[-1] == 0 or scores.shape[-2] == 0:
        raise ValueError(f"scores is empty: shape {tuple(scores.shape)}")
    if bool(torch.isnan(scores).any()) or bool(torch.isposinf(scores).any()):
        raise ValueError("scores contain NaN or +inf")


def augmented_sinkhorn(scores: torch.Tensor, iters: int = REGISTRATION.sinkhorn_iters, slack_score: float = 0.0) -> torch.Tensor:
    """Partial doubly stochastic ``P`` from ``scores`` ``(Nx, Ny)`` or ``(B, Nx, Ny)``, same shape.

    ``P`` is the ``Nx x Ny`` crop of the ``(Nx+1) x (Ny+1)`` slack-augmented Sinkhorn matrix:
    entries in [0, 1], every row and column sum <= 1. ``-inf`` scores mean "never match".
    Differentiable, runs on the device of ``scores``.
    """
    _check_scores(scores)
    if iters < 1:
        raise ValueError(f"iters must be >= 1, got {iters}")
    s = scores.float() if not scores.is_floating_point() else scores
    slack_col = torch.full(s.shape[:-1] + (1,), float(slack_score), dtype=s.dtype, device=s.device)  # (…, Nx, 1)
    slack_row = torch.full(s.shape[:-2] + (1, s.shape[-1]), float(slack_score), dtype=s.dtype, device=s.device)
    u = torch.zeros(s.shape[:-1], dtype=s.dtype, device=s.device)  # (…, Nx)
    v = torch.zeros(s.shape[:-2] + s.shape[-1:], dtype=s.dtype, device=s.device)  # (…, Ny)
    for _ in range(iters):
        # rows: sum_j exp(s_ij + u_i + v_j) + exp(slack + u_i) = 1
        u = -torch.logsumexp(torch.cat([s + v[..., None, :], slack_col], -1), -1)
        # columns: sum_i exp(s_ij + u_i + v_j) + exp(slack + v_j) = 1
        v = -torch.logsumexp(torch.cat([s + u[..., :, None], slack_row], -2), -2)
    P = torch.exp(s + u[..., :, None] + v[..., None, :])
    return P / P.sum(-1, keepdim=True).clamp(min=1.0)


def _segment_logsumexp(x: torch.Tensor, seg: torch.Tensor, n: int, extra: float) -> torch.Tensor:
    """``log(sum_{e: seg[e]=k} exp(x_e) + exp(extra))`` for k in [0, n): ``(E,)`` -> ``(n,)``.

    The shift is the (detached) per-segment max, so very large or very negative scores are safe;
    the result is differentiable in ``x``.
    """
    m = torch.full((n,), float(extra), dtype=x.dtype, device=x.device)
    m = m.scatter_reduce(0, seg, x.detach(), reduce="amax", include_self=True)
    total = torch.exp(x.new_tensor(float(extra)) - m)
    total = total.index_add(0, seg, torch.exp(x - m.index_select(0, seg)))
    return m + torch.log(total)


def sparse_augmented_sinkhorn(
    rows: torch.Tensor,
    cols: torch.Tensor,
    scores: torch.Tensor,
    n_x: int,
    n_y: int,
    iters: int = REGISTRATION.sinkhorn_iters,
    slack_score: float = 0.0,
) -> torch.Tensor:
    """Augmented Sinkhorn on a sparse support: ``P`` values ``(E,)`` on edges ``(rows[e], cols[e])``.

    Entries off the support are treated as score ``-inf`` (probability 0); every point keeps its
    slack entry, so a point with no candidate is simply unmatched. Row and column sums of the
    returned values are <= 1. Differentiable in ``scores``; runs on their device.
    """
    if not (rows.shape == cols.shape == scores.shape) or rows.ndim != 1:
        raise ValueError(
            f"rows, cols, scores must be 1-D of equal length, got {tuple(rows.shape)}, {tuple(cols.shape)}, {tuple(scores.shape)}"
        )
    if n_x <= 0 or n_y <= 0:
        raise ValueError(f"n_x and n_y must be positive, got {n_x}, {n_y}")
    if bool(torch.isnan(scores).any()) or bool(torch.isposinf(scores).any()):
        raise ValueError("scores contain NaN or +inf")
    if iters < 1:
        raise ValueError(f"iters must be >= 1, got {iters}")
    u = scores.new_zeros(n_x)
    v = scores.new_zeros(n_y)
    # index_select, not u[rows]: the same gather, several times faster on the CPU (torch 2.13)
    for _ in range(iters):
        u = -_segment_logsumexp(scores + v.index_select(0, cols), rows, n_x, slack_score)
        v = -_segment_logsumexp(scores + u.index_select(0, rows), cols, n_y, slack_score)
    p = torch.exp(scores + u.index_select(0, rows) + v.index_select(0, cols))
    row_mass = p.new_zeros(n_x).index_add(0, rows, p)
    return p / row_mass.clamp(min=1.0).index_select(0, rows)
