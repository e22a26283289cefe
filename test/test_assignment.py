"""H-step: exact partial permutation from the augmented profit matrix, dense and sparse."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from s2h_ros.matching import (
    OUTLIER_RULES,
    augmented_sinkhorn,
    outlier_profits,
    partial_permutation,
    partial_permutation_profit,
    sparse_partial_permutation,
)


def _soft(rng, n_x, n_y, scale=3.0) -> np.ndarray:
    return augmented_sinkhorn(torch.tensor(scale * rng.normal(size=(n_x, n_y))), iters=10).numpy()


def _all_ppms(n_x, n_y):
    """Every partial permutation of an n_x x n_y matrix, as (rows, cols) index tuples."""
    for size in range(min(n_x, n_y) + 1):
        for rows in itertools.combinations(range(n_x), size):
            for cols in itertools.permutations(range(n_y), size):
                yield np.array(rows, dtype=int), np.array(cols, dtype=int)


def _is_ppm(M: np.ndarray) -> bool:
    return bool(np.isin(M, (0.0, 1.0)).all() and (M.sum(0) <= 1).all() and (M.sum(1) <= 1).all())


@pytest.mark.parametrize("rule", ["slack", "scaled_inverse_variance", "constant", "inverse_variance"])
def test_dense_h_step_is_optimal_against_brute_force(rng, rule):
    for _ in range(6):
        n_x, n_y = rng.integers(1, 5, size=2)
        P = _soft(rng, n_x, n_y)
        scale = 0.05 if rule == "constant" else None
        sx, sy = outlier_profits(P, rule, scale)
        best = max(partial_permutation_profit(P[r, c], r, c, sx, sy) for r, c in _all_ppms(n_x, n_y))
        M = partial_permutation(P, rule, scale)
        r, c = np.nonzero(M)
        assert _is_ppm(M)
        assert partial_permutation_profit(P[r, c], r, c, sx, sy) == pytest.approx(best, abs=1e-12)


@pytest.mark.parametrize("rule", OUTLIER_RULES)
def test_dense_h_step_returns_a_ppm_on_random_matrices(rng, rule):
    P = _soft(rng, 40, 30)
    M = partial_permutation(P, rule)
    assert M.shape == P.shape and _is_ppm(M)


def test_literal_inverse_variance_never_matches_a_one_hot_matrix_but_calibrated_rules_do():
    """The paper's gap: a one-hot row has var ~ 1/N, so sigma ~ N dwarfs every entry of P."""
    P = np.eye(6)[:, ::-1] * 0.97
    assert partial_permutation(P, "inverse_variance").sum() == 0
    expected = np.eye(6)[:, ::-1]
    for rule in ("slack", "scaled_inverse_variance", "constant"):
        np.testing.assert_array_equal(partial_permutation(P, rule), expected)


def test_constant_rows_and_columns_give_finite_profits_and_a_valid_ppm():
    P = np.full((5, 7), 0.1)
    for rule in OUTLIER_RULES:
        sx, sy = outlier_profits(P, rule)
        assert np.isfinite(sx).all() and np.isfinite(sy).all()
        assert _is_ppm(partial_permutation(P, rule))


def test_torch_in_torch_out_numpy_in_numpy_out_and_batched(rng):
    P = torch.tensor(_soft(rng, 3 * 8, 9).reshape(3, 8, 9), dtype=torch.float32)
    M = partial_permutation(P)
    assert isinstance(M, torch.Tensor) and M.dtype == torch.float32 and M.shape == (3, 8, 9)
    for b in range(3):
        np.testing.assert_array_equal(M[b].numpy(), partial_permutation(P[b].numpy()))
    assert isinstance(partial_permutation(P[0].numpy()), np.ndarray)


@pytest.mark.parametrize("rule", ["slack", "scaled_inverse_variance", "constant"])
def test_sparse_on_full_support_equals_dense(rng, rule):
    for _ in range(5):
        n_x, n_y = rng.integers(5, 40, size=2)
        P = _soft(rng, n_x, n_y)
        sx, sy = outlier_profits(P, rule, 0.01 if rule == "constant" else None)
        rows, cols = np.nonzero(np.ones_like(P))
        src, tgt = sparse_partial_permutation(rows, cols, P[rows, cols], n_x, n_y, sx, sy)
        M = np.zeros_like(P)
        M[src, tgt] = 1
        np.testing.assert_array_equal(M, partial_permutation(P, rule, 0.01 if rule == "constant" else None))


def test_sparse_on_a_support_containing_the_dense_optimum_returns_the_dense_matching(rng):
    n_x, n_y = 60, 50
    scores = 2.0 * rng.normal(size=(n_x, n_y))
    scores[np.arange(40), rng.permutation(n_y)[:40]] += rng.uniform(2.0, 10.0, size=40)  # planted, some weak
    P = augmented_sinkhorn(torch.tensor(scores), iters=10).numpy()
    M_dense = partial_permutation(P)
    assert M_dense.sum() > 10
    support = M_dense.astype(bool) | (rng.uniform(size=P.shape) < 0.1)
    rows, cols = np.nonzero(support)
    sx, sy = outlier_profits(P)  # profits of the full P: the support only limits the pairs
    src, tgt = sparse_partial_permutation(rows, cols, P[rows, cols], n_x, n_y, sx, sy)
    np.testing.assert_array_equal(np.stack(np.nonzero(M_dense)), np.stack([src, tgt]))


def test_sparse_keeps_the_best_of_duplicated_edges_and_accepts_torch():
    rows, cols = torch.tensor([0, 0, 1]), torch.tensor([1, 1, 0])
    p = torch.tensor([0.2, 0.9, 0.8])
    src, tgt = sparse_partial_permutation(rows, cols, p, 2, 2, np.full(2, 0.1), np.full(2, 0.1))
    np.testing.assert_array_equal(src, [0, 1])
    np.testing.assert_array_equal(tgt, [1, 0])
    assert src.dtype == np.int64


def test_sparse_prefers_leaving_points_unmatched_when_their_profit_is_higher():
    # one pair worth 0.5, but the two points are worth 0.3 + 0.3 unmatched
    src, tgt = sparse_partial_permutation([0], [0], [0.5], 1, 1, [0.3], [0.3])
    assert src.size == 0 and tgt.size == 0
    src, tgt = sparse_partial_permutation([0], [0], [0.7], 1, 1, [0.3], [0.3])
    assert list(src) == [0] and list(tgt) == [0]


def test_sparse_resolves_conflicts_exactly():
    # x0 likes y0 best, but giving y0 to x1 and y1 to x0 is worth more (0.6+0.9 > 0.8+0.0)
    rows, cols, p = [0, 0, 1], [0, 1, 0], [0.8, 0.6, 0.9]
    src, tgt = sparse_partial_permutation(rows, cols, p, 2, 2, np.zeros(2), np.zeros(2))
    assert dict(zip(src.tolist(), tgt.tolist())) == {0: 1, 1: 0}


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(rows=[0], cols=[0], p=[np.nan]), "NaN"),
        (dict(rows=[0], cols=[5], p=[0.5]), "out of range"),
        (dict(rows=[0, 1], cols=[0], p=[0.5]), "equal length"),
        (dict(rows=[0], cols=[0], p=[0.5], sigma_x=[-1.0, 0.0]), ">= 0"),
    ],
)
def test_sparse_rejects_bad_input(kwargs, match):
    args = dict(n_x=2, n_y=2, sigma_x=np.zeros(2), sigma_y=np.zeros(2)) | kwargs
    with pytest.raises(ValueError, match=match):
        sparse_partial_permutation(**args)


def test_dense_rejects_nan_empty_and_unknown_rule():
    with pytest.raises(ValueError, match="NaN"):
        partial_permutation(np.array([[np.nan]]))
    with pytest.raises(ValueError, match="non-empty"):
        partial_permutation(np.zeros((0, 3)))
    with pytest.raises(ValueError, match="outlier_profit"):
        partial_permutation(np.eye(2), "median")
