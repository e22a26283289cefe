"""The paper's S2H losses: L1 (matching), L2 (inlier count), L3 (motion); total = L1 + L2 + L3.

Each works on one sample ``(Nx, Ny)`` / ``(3, 3)`` or a batch ``(B, …)`` (mean over the batch).
"""
from __future__ import annotations

import torch


def matching_loss(M_pred: torch.Tensor, M_gt: torch.Tensor) -> torch.Tensor:
    """``L1 = -sum(M_pred * M_gt) / sum(M_gt)``: fraction of ground-truth pairs recovered, negated."""
    if M_pred.shape != M_gt.shape or M_pred.ndim not in (2, 3):
        raise ValueError(f"M_pred and M_gt must share shape (Nx, Ny) or (B, Nx, Ny), got {tuple(M_pred.shape)}, {tuple(M_gt.shape)}")
    n_gt = M_gt.sum((-1, -2))
    if bool((n_gt <= 0).any()):
        raise ValueError("M_gt has no ground-truth correspondence: L1 is undefined")
    return (-(M_pred * M_gt).sum((-1, -2)) / n_gt).mean()


def inlier_count_loss(M_pred: torch.Tensor) -> torch.Tensor:
    """``L2 = -sum(M_pred) / (Nx + Ny)``: rewards matching, against the all-outlier collapse."""
    if M_pred.ndim not in (2, 3):
        raise ValueError(f"M_pred must be (Nx, Ny) or (B, Nx, Ny), got {tuple(M_pred.shape)}")
    return (-M_pred.sum((-1, -2)) / (M_pred.shape[-1] + M_pred.shape[-2])).mean()


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


def s2h_loss(M_pred, M_gt, R_pred, t_pred, R_gt, t_gt, weights=(1.0, 1.0, 1.0)) -> torch.Tensor:
    """``lambda1 L1 + lambda2 L2 + lambda3 L3`` (the paper sets all lambdas to 1)."""
    l1, l2, l3 = weights
    return l1 * matching_loss(M_pred, M_gt) + l2 * inlier_count_loss(M_pred) + l3 * motion_loss(R_pred, t_pred, R_gt, t_gt)
