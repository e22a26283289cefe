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


def test_sparse_losses_of_the_straight_through_ppm_equal_the_dense_ones_in_value_and_gradient():
    """On an edge list L1 and L2 equal the dense losses (entries off the support are zero), and the
    straight-through step gives the soft P the same gradient either way."""
    from s2h_ros.matching import sparse_inlier_count_loss, sparse_matching_loss, straight_through

    g = torch.Generator().manual_seed(0)
    n_x, n_y = 6, 5
    P = (0.3 * torch.rand(n_x, n_y, generator=g, dtype=torch.float64)).requires_grad_()
    M = torch.zeros(n_x, n_y, dtype=torch.bool)
    M[[0, 2, 3], [1, 0, 4]] = True
    G = torch.zeros(n_x, n_y)
    G[[0, 1, 3, 5], [1, 2, 3, 0]] = 1.0
    # a support of 12 edges that holds every matched pair but misses the ground truth (5, 0)
    keep = torch.zeros(n_x * n_y, dtype=torch.bool)
    keep[torch.randperm(n_x * n_y, generator=g)[:12]] = True
    keep[M.reshape(-1)] = True
    keep[5 * n_y + 0] = False
    edges = torch.nonzero(keep)[:, 0]
    p_e = P.reshape(-1)[edges]
    m_e = straight_through(M.reshape(-1)[edges], p_e)
    assert m_e.dtype == P.dtype and torch.equal(m_e, M.reshape(-1)[edges].double())
    l1 = sparse_matching_loss(m_e, G.reshape(-1)[edges], int(G.sum()))
    l2 = sparse_inlier_count_loss(m_e, n_x, n_y)
    M_off = torch.where(keep.reshape(n_x, n_y), M.double(), 0.0)  # M lies on the support
    P_on = torch.where(keep.reshape(n_x, n_y), P, 0.0)
    M_st = straight_through(M_off, P_on)
    assert torch.isclose(l1, matching_loss(M_st, G.double())) and torch.isclose(l2, inlier_count_loss(M_st))
    assert l1.item() == pytest.approx(-1 / 4)  # only (0, 1) is both matched and true; |G| = 4 counts (5, 0) too
    g_sparse = torch.autograd.grad(l1 + l2, P)[0]
    g_dense = torch.autograd.grad(matching_loss(M_st, G.double()) + inlier_count_loss(M_st), P)[0]
    torch.testing.assert_close(g_sparse, g_dense)
    assert (g_sparse[~keep.reshape(n_x, n_y)] == 0).all() and (g_sparse[keep.reshape(n_x, n_y)] != 0).all()
    # the S-step-only ablation scores P itself with the same functions
    s1 = sparse_matching_loss(p_e, G.reshape(-1)[edges], int(G.sum()))
    assert torch.isclose(s1, matching_loss(P_on, G.double()))


def test_sparse_matching_loss_refuses_an_empty_ground_truth_and_mismatched_shapes():
    from s2h_ros.matching import sparse_matching_loss

    with pytest.raises(ValueError, match="no ground-truth"):
        sparse_matching_loss(torch.ones(4), torch.zeros(4), 0)
    with pytest.raises(ValueError, match="shape"):
        sparse_matching_loss(torch.ones(4), torch.zeros(3), 1)
