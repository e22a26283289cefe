"""The paper's losses L1 (matching), L2 (inlier count), L3 (motion)."""
from __future__ import annotations

import math

import pytest
import torch

from s2h_ros.matching import inlier_count_loss, matching_loss, motion_loss, s2h_loss


def _rz(deg: float) -> torch.Tensor:
    a = math.radians(deg)
    return torch.tensor([[math.cos(a), -math.sin(a), 0.0], [math.sin(a), math.cos(a), 0.0], [0.0, 0.0, 1.0]])


def test_matching_loss_is_minus_the_fraction_of_ground_truth_pairs_found():
    M_gt = torch.zeros(5, 6)
    M_gt[[0, 1, 2, 3], [1, 2, 3, 4]] = 1
    assert matching_loss(M_gt, M_gt).item() == pytest.approx(-1.0)
    M_pred = torch.zeros(5, 6)
    M_pred[[0, 1, 4], [1, 0, 5]] = 1  # one of four right, two wrong
    assert matching_loss(M_pred, M_gt).item() == pytest.approx(-0.25)
    assert matching_loss(torch.zeros(5, 6), M_gt).item() == 0.0


def test_matching_loss_averages_a_batch_and_rejects_empty_ground_truth():
    M_gt = torch.zeros(2, 3, 3)
    M_gt[0, 0, 0] = M_gt[1, 1, 1] = M_gt[1, 2, 2] = 1
    M_pred = torch.zeros(2, 3, 3)
    M_pred[0, 0, 0] = M_pred[1, 1, 1] = 1
    assert matching_loss(M_pred, M_gt).item() == pytest.approx(-(1.0 + 0.5) / 2)
    with pytest.raises(ValueError, match="no ground-truth"):
        matching_loss(M_pred, torch.zeros(2, 3, 3))
    with pytest.raises(ValueError, match="shape"):
        matching_loss(torch.zeros(3, 3), torch.zeros(3, 4))


def test_inlier_count_loss_is_minus_matches_over_total_points():
    M = torch.zeros(4, 6)
    M[[0, 1, 2], [0, 1, 2]] = 1
    assert inlier_count_loss(M).item() == pytest.approx(-3 / 10)
    assert inlier_count_loss(torch.zeros(4, 6)).item() == 0.0


def test_motion_loss_is_zero_at_the_truth_and_known_off_it():
    R, t = _rz(30.0), torch.tensor([1.0, 2.0, 3.0])
    assert motion_loss(R, t, R, t).item() == pytest.approx(0.0, abs=1e-6)
    # R_gt^T R_pred = Rz(90): ||Rz(90) - I||_F = 2 ; its spectral norm is sqrt(2); translation off by 0.5
    loss_fro = motion_loss(_rz(90.0), torch.tensor([0.3, 0.4, 0.0]), torch.eye(3), torch.zeros(3))
    loss_spec = motion_loss(_rz(90.0), torch.tensor([0.3, 0.4, 0.0]), torch.eye(3), torch.zeros(3), "spectral")
    assert loss_fro.item() == pytest.approx(2.0 + 0.5, abs=1e-6)
    assert loss_spec.item() == pytest.approx(math.sqrt(2.0) + 0.5, abs=1e-6)


def test_motion_loss_is_differentiable_and_batched():
    R_pred = torch.stack([_rz(10.0), _rz(-20.0)]).requires_grad_()
    t_pred = torch.zeros(2, 3, requires_grad=True)
    loss = motion_loss(R_pred, t_pred, torch.eye(3).expand(2, 3, 3), torch.ones(2, 3))
    loss.backward()
    assert torch.isfinite(R_pred.grad).all() and (R_pred.grad.abs() > 0).any()
    with pytest.raises(ValueError):
        motion_loss(torch.eye(3), torch.zeros(2), torch.eye(3), torch.zeros(2))


def test_total_loss_is_the_unit_weighted_sum():
    M_gt = torch.eye(4)
    M = torch.eye(4)
    M[3, 3] = 0
    R, t = _rz(5.0), torch.zeros(3)
    total = s2h_loss(M, M_gt, R, t, torch.eye(3), t)
    expected = matching_loss(M, M_gt) + inlier_count_loss(M) + motion_loss(R, t, torch.eye(3), t)
    assert total.item() == pytest.approx(expected.item())
