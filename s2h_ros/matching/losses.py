"""The paper's S2H losses: L1 (matching), L2 (inlier count), L3 (motion); total = L1 + L2 + L3;
and DGR's class-balanced inlier classification loss (``balanced_bce``), which the inlier trainers add.

Dense forms work on one sample ``(Nx, Ny)`` / ``(3, 3)`` or a batch ``(B, …)`` (mean over the batch).
The ``sparse_`` forms take the matrices' entries on a candidate edge list ``(…, E)`` (the support of
``s2h_match``; every entry off it is zero). Each equation is written once, in the sparse form: the
dense one is the sparse one on the edge list of all ``Nx * Ny`` entries.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def sparse_matching_loss(m: torch.Tensor, gt: torch.Tensor, n_gt: int | float | torch.Tensor) -> torch.Tensor:
    """``L1 = -sum(M_pred * M_gt) / sum(M_gt)`` from ``M_pred``'s and ``M_gt``'s entries on the edges.

    ``m`` ``(…, E)``: ``M_pred`` (or ``P``); ``gt`` ``(…, E)``, 0/1 or bool: ground-truth pairs among
    the edges; ``n_gt`` (int or ``(…,)``): *all* ground-truth pairs, those off the support included,
    so the loss equals the dense one however well the support covers the truth.
    """
    n_gt = torch.as_tensor(n_gt, dtype=m.dtype, device=m.device)
    if m.shape != gt.shape or m.ndim < 1:
        raise ValueError(f"m and gt must share shape (…, E), got {tuple(m.shape)}, {tuple(gt.shape)}")
    if bool((n_gt <= 0).any()):
        raise ValueError("M_gt has no ground-truth correspondence: L1 is undefined")
    return (-(m * gt.to(m.dtype)).sum(-1) / n_gt).mean()


def matching_loss(M_pred: torch.Tensor, M_gt: torch.Tensor) -> torch.Tensor:
    """``L1 = -sum(M_pred * M_gt) / sum(M_gt)``: fraction of ground-truth pairs recovered, negated."""
    if M_pred.shape != M_gt.shape or M_pred.ndim not in (2, 3):
        raise ValueError(f"M_pred and M_gt must share shape (Nx, Ny) or (B, Nx, Ny), got {tuple(M_pred.shape)}, {tuple(M_gt.shape)}")
    return sparse_matching_loss(M_pred.flatten(-2), M_gt.flatten(-2), M_gt.sum((-1, -2)))


def sparse_inlier_count_loss(m: torch.Tensor, n_x: int, n_y: int) -> torch.Tensor:
    """``L2 = -sum(M_pred) / (Nx + Ny)`` from ``M_pred``'s entries ``(…, E)`` on the edges."""
    if m.ndim < 1 or n_x + n_y <= 0:
        raise ValueError(f"m must be (…, E) and n_x + n_y > 0, got {tuple(m.shape)}, {n_x} + {n_y}")
    return (-m.sum(-1) / (n_x + n_y)).mean()


def inlier_count_loss(M_pred: torch.Tensor) -> torch.Tensor:
    """``L2 = -sum(M_pred) / (Nx + Ny)``: rewards matching, against the all-outlier collapse."""
    if M_pred.ndim not in (2, 3):
        raise ValueError(f"M_pred must be (Nx, Ny) or (B, Nx, Ny), got {tuple(M_pred.shape)}")
    return sparse_inlier_count_loss(M_pred.flatten(-2), M_pred.shape[-2], M_pred.shape[-1])


def motion_loss(
    R_pred: torch.Tensor, t_pred: torch.Tensor, R_gt: torch.Tensor, t_gt: torch.Tensor, matrix_norm: str = "fro"
) -> torch.Tensor:
    """``L3 = ||R_gt^T R_pred - I||_2 + ||t_gt - t_pred||_2``.

    The paper's matrix norm is written ``||.||_2``; ``matrix_norm="fro"`` (default, smooth gradient)
    or ``"spectral"`` (the operator 2-norm) chooses its reading.
    """
    if R_pred.shape[-2:] != (3, 3) or R_gt.shape != R_pred.shape or t_pred.shape[-1] != 3 or t_gt.shape != t_pred.shape:
        raise ValueError("R must be (…, 3, 3) and t (…, 3), predictions and ground truth alike")
    eye = torch.eye(3, dtype=R_pred.dtype, device=R_pred.device)
    ord_ = {"fro": "fro", "spectral": 2}.get(matrix_norm)
    if ord_ is None:
        raise ValueError(f"matrix_norm must be 'fro' or 'spectral', got {matrix_norm!r}")
    rot = torch.linalg.matrix_norm(R_gt.transpose(-1, -2) @ R_pred - eye, ord=ord_)
    return (rot + torch.linalg.vector_norm(t_gt - t_pred, dim=-1)).mean()


def total_loss(l1: torch.Tensor, l2: torch.Tensor, l3: torch.Tensor, weights=(1.0, 1.0, 1.0)) -> torch.Tensor:
    """``lambda1 L1 + lambda2 L2 + lambda3 L3`` (the paper sets all lambdas to 1)."""
    w1, w2, w3 = weights
    return w1 * l1 + w2 * l2 + w3 * l3


def s2h_loss(M_pred, M_gt, R_pred, t_pred, R_gt, t_gt, weights=(1.0, 1.0, 1.0)) -> torch.Tensor:
    """``total_loss`` of the dense matrices and the motion."""
    return total_loss(matching_loss(M_pred, M_gt), inlier_count_loss(M_pred), motion_loss(R_pred, t_pred, R_gt, t_gt),
                      weights)


def balanced_bce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """DGR's inlier classification loss: binary cross-entropy of ``(K,)`` logits against 0/1
    labels, positives weighted by (negatives / positives) so both classes count alike."""
    labels = labels.to(logits.dtype)
    n_pos = labels.sum()
    pos_weight = (len(labels) - n_pos) / n_pos.clamp_min(1.0)
    return F.binary_cross_entropy_with_logits(logits, labels, pos_weight=pos_weight)
