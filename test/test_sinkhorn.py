"""S-step: augmented Sinkhorn (dense and sparse), log domain, PDSM output, differentiable."""
from __future__ import annotations

import pytest
import torch

from s2h_ros.matching import augmented_sinkhorn, sparse_augmented_sinkhorn

TOL = 1e-4


def _sums_ok(P: torch.Tensor) -> bool:
    return bool((P.sum(-1) <= 1 + TOL).all() and (P.sum(-2) <= 1 + TOL).all() and (P >= 0).all())


@pytest.mark.parametrize("iters", [1, 3, 5, 50])
@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_output_is_partial_doubly_stochastic_for_any_iteration_count(iters, scale):
    g = torch.Generator().manual_seed(iters)
    scores = scale * torch.randn(3, 40, 55, generator=g)
    P = augmented_sinkhorn(scores, iters=iters)
    assert P.shape == (3, 40, 55)
    assert _sums_ok(P)


@pytest.mark.parametrize("scores", [1e4 * torch.randn(20, 30), -1e4 + torch.randn(20, 30), torch.full((5, 6), -1e30)])
def test_huge_and_very_negative_scores_stay_finite(scores):
    P = augmented_sinkhorn(scores, iters=10)
    assert torch.isfinite(P).all() and _sums_ok(P)


def test_masked_minus_inf_entries_get_zero_probability():
    scores = torch.randn(6, 6)
    scores[0, :] = float("-inf")
    scores[:, 2] = float("-inf")
    P = augmented_sinkhorn(scores, iters=10)
    assert torch.isfinite(P).all()
    assert P[0].abs().max() == 0 and P[:, 2].abs().max() == 0


def test_a_clear_permutation_dominates_and_rows_without_partner_go_to_slack():
    perm = torch.randperm(8, generator=torch.Generator().manual_seed(0))
    scores = torch.full((10, 8), -20.0)
    scores[torch.arange(8), perm] = 20.0  # rows 8 and 9 have no partner
    P = augmented_sinkhorn(scores, iters=20)
    # the slack row/column are unnormalised, so mass reaches the planted pairs slowly (k/(k+1))
    assert (P[torch.arange(8), perm] > 0.95).all()
    assert P[8:].sum() < 1e-4


def test_batched_equals_one_by_one():
    scores = torch.randn(4, 12, 9, generator=torch.Generator().manual_seed(1))
    batched = augmented_sinkhorn(scores, iters=7, slack_score=-1.0)
    for b in range(4):
        assert torch.allclose(batched[b], augmented_sinkhorn(scores[b], iters=7, slack_score=-1.0), atol=1e-6)


def test_gradient_matches_finite_differences():
    scores = torch.randn(4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(2), requires_grad=True)
    assert torch.autograd.gradcheck(lambda s: augmented_sinkhorn(s, iters=4), (scores,))


def test_sparse_on_full_support_equals_dense():
    scores = 3 * torch.randn(15, 11, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    rows, cols = torch.nonzero(torch.ones(15, 11), as_tuple=True)
    p = sparse_augmented_sinkhorn(rows, cols, scores[rows, cols], 15, 11, iters=6, slack_score=-0.5)
    assert torch.allclose(p, augmented_sinkhorn(scores, iters=6, slack_score=-0.5)[rows, cols], atol=1e-12)


def test_sparse_on_a_partial_support_equals_dense_with_minus_inf_elsewhere():
    g = torch.Generator().manual_seed(4)
    scores = 2 * torch.randn(20, 25, dtype=torch.float64, generator=g)
    mask = torch.rand(20, 25, generator=g) < 0.3
    rows, cols = torch.nonzero(mask, as_tuple=True)
    p = sparse_augmented_sinkhorn(rows, cols, scores[rows, cols], 20, 25, iters=8)
    dense = augmented_sinkhorn(scores.masked_fill(~mask, float("-inf")), iters=8)
    assert torch.allclose(p, dense[rows, cols], atol=1e-12)
    row_sums = torch.zeros(20, dtype=p.dtype).index_add(0, rows, p)
    col_sums = torch.zeros(25, dtype=p.dtype).index_add(0, cols, p)
    assert (row_sums <= 1 + TOL).all() and (col_sums <= 1 + TOL).all()


def test_sparse_gradient_reaches_every_edge_score():
    g = torch.Generator().manual_seed(5)
    rows, cols = torch.nonzero(torch.rand(10, 10, generator=g) < 0.4, as_tuple=True)
    s = torch.randn(rows.numel(), generator=g, requires_grad=True)
    p = sparse_augmented_sinkhorn(rows, cols, s, 10, 10, iters=5)
    (p * torch.randn(p.shape, generator=g)).sum().backward()
    assert torch.isfinite(s.grad).all() and (s.grad != 0).all()


@pytest.mark.parametrize(
    "scores, match",
    [
        (torch.tensor([[0.0, float("nan")]]), "NaN"),
        (torch.zeros(0, 3), "empty"),
        (torch.zeros(2, 3, 4, 5), "shape"),
        (torch.tensor([[float("inf"), 0.0]]), r"\+inf"),
    ],
)
def test_bad_scores_raise_a_clear_error(scores, match):
    with pytest.raises(ValueError, match=match):
        augmented_sinkhorn(scores)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_runs_on_cuda_and_matches_cpu():
    scores = torch.randn(2, 64, 80, generator=torch.Generator().manual_seed(6))
    P_gpu = augmented_sinkhorn(scores.cuda(), iters=5)
    assert P_gpu.device.type == "cuda"
    assert torch.allclose(P_gpu.cpu(), augmented_sinkhorn(scores, iters=5), atol=1e-5)
    rows, cols = torch.nonzero(torch.ones(64, 80), as_tuple=True)
    p = sparse_augmented_sinkhorn(rows.cuda(), cols.cuda(), scores[0][rows, cols].cuda(), 64, 80, iters=5)
    assert torch.allclose(p.cpu(), augmented_sinkhorn(scores[0], iters=5)[rows, cols], atol=1e-5)
