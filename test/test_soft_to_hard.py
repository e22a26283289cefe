"""S2H: straight-through PPM, gradients to every score, and the sparse lidar-scale entry s2h_match."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from s2h_ros.matching import (
    augmented_sinkhorn,
    candidate_support,
    inlier_count_loss,
    matching_loss,
    partial_permutation,
    s2h_match,
    soft_to_hard,
)
from s2h_ros.matching.candidates import GROUP, feature_knn, smallest_k


def _planted_features(n: int, n_inliers: int, noise: float, seed: int = 0, dim: int = 16):
    """Unit features; the first n_inliers source points have a noisy copy in the target at perm."""
    g = torch.Generator().manual_seed(seed)
    fx = torch.nn.functional.normalize(torch.randn(n, dim, generator=g), dim=1)
    fy = torch.nn.functional.normalize(torch.randn(n, dim, generator=g), dim=1)
    perm = torch.randperm(n, generator=g)[:n_inliers]
    fy[perm] = torch.nn.functional.normalize(fx[:n_inliers] + noise * torch.randn(n_inliers, dim, generator=g), dim=1)
    return fx, fy, perm


def test_forward_is_the_h_step_of_the_s_step():
    scores = torch.randn(12, 15, generator=torch.Generator().manual_seed(0)) * 4
    M, P = soft_to_hard(scores, iters=5, return_soft=True)
    assert torch.equal(M, partial_permutation(augmented_sinkhorn(scores, iters=5)))
    assert torch.equal(P, augmented_sinkhorn(scores, iters=5))
    assert set(M.unique().tolist()) <= {0.0, 1.0}


def test_backward_hands_the_gradient_to_P_unchanged():
    P = augmented_sinkhorn(torch.randn(6, 7, generator=torch.Generator().manual_seed(1)) * 5).requires_grad_()
    upstream = torch.randn(6, 7, generator=torch.Generator().manual_seed(2))
    M = soft_to_hard(P, is_soft=True)
    (M * upstream).sum().backward()
    assert torch.equal(P.grad, upstream)


def test_gradient_of_the_paper_losses_reaches_every_score_not_only_matched_ones():
    g = torch.Generator().manual_seed(3)
    scores = (3 * torch.randn(2, 10, 9, generator=g)).requires_grad_()
    M_gt = torch.zeros(2, 10, 9)
    M_gt[:, torch.arange(6), torch.arange(6)] = 1
    M = soft_to_hard(scores, iters=5)
    assert M.sum() < 18  # the hard matrix is sparse ...
    (matching_loss(M, M_gt) + inlier_count_loss(M)).backward()
    assert torch.isfinite(scores.grad).all()
    assert (scores.grad != 0).all()  # ... yet every score is supervised through Sinkhorn


def test_plain_hard_matching_would_supervise_only_matched_entries():
    """Contrast: with the gradient taken at M itself (hard matching), unmatched entries get nothing."""
    scores = (3 * torch.randn(10, 9, generator=torch.Generator().manual_seed(4))).requires_grad_()
    M = soft_to_hard(scores.detach(), is_soft=True)
    hard = scores * M  # gradient flows only where M = 1
    inlier_count_loss(hard).backward()
    assert ((scores.grad != 0) == (M == 1)).all()


def test_candidate_support_holds_both_nearest_neighbour_directions():
    fx, fy, _ = _planted_features(50, 20, 0.3, seed=5)
    rows, cols = candidate_support(fx, fy, k=3)
    edges = set(zip(rows.tolist(), cols.tolist()))
    assert len(edges) == rows.numel()  # unique
    d = torch.cdist(fx, fy)
    assert all((i, j) in edges for i, j in enumerate(d.argmin(1).tolist()))
    assert all((i, j) in edges for j, i in enumerate(d.argmin(0).tolist()))
    assert torch.all(rows[1:] >= rows[:-1])



@pytest.mark.parametrize("n_x, n_y, k", [(700, 1001, 16), (600, 13, 16), (40, GROUP * 16 + 1, 5)])
def test_candidate_support_equals_brute_force_knn_both_ways(n_x, n_y, k):
    """The grouped selection (taken for wide rows) and plain topk (narrow ones) are both exact."""
    g = torch.Generator().manual_seed(n_x)
    fx, fy = torch.randn(n_x, 8, generator=g), torch.randn(n_y, 8, generator=g)
    rows, cols = candidate_support(fx, fy, k)
    d = torch.cdist(fx.double(), fy.double())
    expected = {(i, j) for i, js in enumerate(d.topk(min(k, n_y), 1, largest=False).indices.tolist()) for j in js}
    expected |= {(i, j) for j, is_ in enumerate(d.topk(min(k, n_x), 0, largest=False).indices.T.tolist()) for i in is_}
    assert set(zip(rows.tolist(), cols.tolist())) == expected


def test_grouped_smallest_k_matches_topk_values_on_wide_rows():
    block = torch.rand(64, GROUP * 40, generator=torch.Generator().manual_seed(1))
    block[:, 5] = 0.0  # a whole column of ties at the minimum
    values, cols = smallest_k(block, 16)
    torch.testing.assert_close(values, block.topk(16, 1, largest=False).values)
    torch.testing.assert_close(torch.gather(block, 1, cols), values)
    assert feature_knn(block, block, 1)[:, 0].tolist() == list(range(64))


def test_candidate_support_rejects_bad_features():
    with pytest.raises(ValueError, match="NaN"):
        candidate_support(torch.full((3, 4), float("nan")), torch.zeros(3, 4))
    with pytest.raises(ValueError, match="dimensions"):
        candidate_support(torch.zeros(3, 4), torch.zeros(3, 5))
    with pytest.raises(ValueError, match="non-empty"):
        candidate_support(torch.zeros(0, 4), torch.zeros(3, 4))


def test_s2h_match_recovers_planted_correspondences_and_rejects_outliers():
    n, n_in = 400, 200
    fx, fy, perm = _planted_features(n, n_in, 0.05, seed=6)
    res = s2h_match(fx, fy, k=8, iters=10, temperature=0.05, slack_score=-4.0)
    src, tgt = res.src_idx.numpy(), res.tgt_idx.numpy()
    assert len(np.unique(src)) == len(src) and len(np.unique(tgt)) == len(tgt)
    correct = (src < n_in) & (tgt == perm.numpy()[np.minimum(src, n_in - 1)])
    assert correct.sum() >= 0.95 * n_in  # recall
    assert correct.mean() >= 0.9  # precision: outliers mostly left unmatched
    # p_values are P on exactly those pairs, and carry gradient to the features
    lookup = {(int(r), int(c)): float(v) for r, c, v in zip(res.rows, res.cols, res.p.detach())}
    assert all(abs(lookup[(int(s), int(t))] - float(v)) < 1e-7 for s, t, v in zip(src, tgt, res.p_values.detach()))


def test_s2h_match_is_differentiable_in_the_features():
    fx, fy, _ = _planted_features(60, 30, 0.1, seed=7)
    fx.requires_grad_()
    res = s2h_match(fx, fy, k=4, iters=5, temperature=0.1, slack_score=-3.0)
    res.p_values.sum().backward()
    assert torch.isfinite(fx.grad).all() and fx.grad.abs().sum() > 0


def _scene_with_features(n: int, seed: int):
    """Points in a 20 m box and random unit features; the target is the source moved by T with
    its features copied (plus noise), so each source point's true partner is known."""
    from scipy.spatial import cKDTree

    rng = np.random.default_rng(seed)
    src = rng.uniform(-10, 10, (n, 3))
    angle = np.radians(10.0)
    R = np.array([[np.cos(angle), -np.sin(angle), 0], [np.sin(angle), np.cos(angle), 0], [0, 0, 1]])
    T = np.eye(4)
    T[:3, :3], T[:3, 3] = R, [1.5, -0.5, 0.1]
    tgt = src @ R.T + T[:3, 3]
    g = torch.Generator().manual_seed(seed)
    fx = torch.nn.functional.normalize(torch.randn(n, 16, generator=g), dim=1)
    fy = torch.nn.functional.normalize(fx + 0.05 * torch.randn(n, 16, generator=g), dim=1)
    return src, tgt, T, fx, fy, cKDTree(tgt)


def test_prior_support_keeps_only_partners_near_the_predicted_position():
    from s2h_ros.matching import prior_support

    src, tgt, T, fx, fy, tree = _scene_with_features(2000, seed=3)
    predicted = src @ T[:3, :3].T + T[:3, 3] + np.array([0.4, 0.0, 0.0])  # a prior 0.4 m off
    rows, cols = prior_support(predicted, tree, fx, fy, radius=1.0, k=4)
    r, c = rows.numpy(), cols.numpy()
    assert np.all(np.diff(r * len(tgt) + c) > 0)  # unique, sorted by row then column
    assert np.all(np.linalg.norm(tgt[c] - predicted[r], axis=1) <= 1.0 + 1e-9)
    assert np.bincount(r, minlength=len(src)).max() <= 4
    # The true partner (same index) is within the radius, and the best in feature space there.
    assert np.mean(np.isin(np.arange(len(src)) * len(tgt) + np.arange(len(src)), r * len(tgt) + c)) > 0.99
    # A prior off by more than the radius leaves every point without candidates.
    far = prior_support(predicted + 50.0, tree, fx, fy, radius=1.0, k=4)
    assert far[0].numel() == 0


def test_prior_support_equals_brute_force_feature_ranking_of_the_spatial_candidates():
    from s2h_ros.matching import prior_support

    src, tgt, T, fx, fy, tree = _scene_with_features(500, seed=5)
    predicted = src @ T[:3, :3].T + T[:3, 3] + np.array([0.2, -0.1, 0.0])
    rows, cols = prior_support(predicted, tree, fx, fy, radius=1.2, k=3, candidates=8)
    expected = set()
    for i, p in enumerate(predicted):
        dist, near = tree.query(p, k=8, distance_upper_bound=1.2)
        near = near[np.isfinite(dist)]
        feature_d = ((fy[near] - fx[i]) ** 2).sum(1).numpy()
        expected.update((i, int(j)) for j in near[np.argsort(feature_d, kind="stable")[:3]])
    assert set(zip(rows.tolist(), cols.tolist())) == expected


def test_edge_scores_are_negative_squared_feature_distances_with_their_gradient_also_at_zero():
    from s2h_ros.matching.soft_to_hard import edge_scores

    fx, fy, _ = _planted_features(40, 10, 0.1, seed=2)
    fy[3] = fx[5]  # one edge at distance zero
    rows, cols = torch.tensor([0, 5, 7, 5]), torch.tensor([1, 3, 7, 9])
    fx.requires_grad_()
    scores = edge_scores(fx, fy, rows, cols, temperature=0.05)
    expected = -((fx.detach()[rows] - fy[cols]) ** 2).sum(1) / 0.05
    assert torch.allclose(scores.detach(), expected, atol=1e-5) and float(scores[1]) == 0.0
    (grad,) = torch.autograd.grad(scores.sum(), fx)
    by_hand = torch.zeros_like(fx).index_add_(0, rows, -2.0 * (fx.detach()[rows] - fy[cols]) / 0.05)
    assert torch.isfinite(grad).all() and torch.allclose(grad, by_hand, atol=1e-4)


def test_s2h_on_the_prior_support_recovers_the_true_partners():
    from s2h_ros.matching import prior_support

    src, tgt, T, fx, fy, tree = _scene_with_features(2000, seed=4)
    predicted = src @ T[:3, :3].T + T[:3, 3]
    support = prior_support(predicted, tree, fx, fy, radius=1.5, k=8)
    res = s2h_match(fx, fy, iters=10, temperature=0.05, slack_score=-4.0, support=support)
    src_idx, tgt_idx = res.src_idx.numpy(), res.tgt_idx.numpy()
    assert len(src_idx) >= 0.95 * len(src) and np.mean(src_idx == tgt_idx) > 0.98
    assert res.stats["edges"] == support[0].numel()


def test_s2h_match_with_no_arguments_uses_registration_config_defaults():
    import inspect

    from s2h_ros.config import RegistrationConfig
    from s2h_ros.matching import match_options

    cfg = RegistrationConfig()
    params = inspect.signature(s2h_match).parameters
    assert params["temperature"].default == cfg.temperature and params["slack_score"].default == cfg.slack_score
    assert params["k"].default == cfg.k and params["iters"].default == cfg.sinkhorn_iters
    assert params["outlier_profit"].default == cfg.outlier_profit
    assert params["scale"].default is None and cfg.outlier_scale < 0  # negative: the rule's calibrated scale
    assert match_options(cfg.replace(outlier_scale=0.25))["scale"] == 0.25
    assert match_options(cfg, "fpfh")["temperature"] == cfg.fpfh_temperature
    # and it behaves so: the same matches as the configuration spelled out, not those of another S-step
    fx, fy, _ = _planted_features(300, 150, 0.2, seed=8)
    default = s2h_match(fx, fy)
    spelled = s2h_match(fx, fy, k=cfg.k, iters=cfg.sinkhorn_iters, temperature=cfg.temperature,
                        slack_score=cfg.slack_score, outlier_profit=cfg.outlier_profit, scale=None)
    other = s2h_match(fx, fy, temperature=0.1, slack_score=-5.0)
    assert torch.equal(default.src_idx, spelled.src_idx) and torch.equal(default.tgt_idx, spelled.tgt_idx)
    torch.testing.assert_close(default.p, spelled.p)
    assert not torch.equal(default.p, other.p)


def test_match_result_edges_hard_step_and_rematch():
    from s2h_ros.matching import edge_positions, outlier_profits, sparse_outlier_profits, sparse_partial_permutation

    fx, fy, _ = _planted_features(200, 100, 0.1, seed=9)
    fx.requires_grad_()
    res = s2h_match(fx, fy, k=6, temperature=0.05, slack_score=-4.0)
    mask = res.edge_mask()
    assert int(mask.sum()) == len(res.src_idx)
    assert set(zip(res.rows[mask].tolist(), res.cols[mask].tolist())) == set(zip(res.src_idx.tolist(), res.tgt_idx.tolist()))
    hard = res.hard_edges()
    assert torch.equal(hard.detach(), mask.to(hard.dtype))
    (hard * torch.arange(hard.numel(), dtype=hard.dtype)).sum().backward()  # straight-through: reaches features
    assert fx.grad.abs().sum() > 0
    missing = next(c for c in range(len(fy)) if c not in res.cols[res.rows == 0].tolist())
    with pytest.raises(ValueError, match="not among"):
        edge_positions(res.rows, res.cols, len(fy), torch.tensor([0]), torch.tensor([missing]))
    # rematch: the H-step again on the same P, here with the authors' constant (the pipeline's safeguard)
    again = res.rematch("constant")
    p = res.p.detach()
    sx, sy = sparse_outlier_profits(res.rows, res.cols, p, len(fx), len(fy), "constant")
    src, tgt = sparse_partial_permutation(res.rows, res.cols, p, len(fx), len(fy), sx, sy)
    assert np.array_equal(again.src_idx.numpy(), src) and np.array_equal(again.tgt_idx.numpy(), tgt)
    assert len(again.src_idx) > len(res.src_idx) and again.p is res.p
    np.testing.assert_allclose(again.sigma_x, outlier_profits(np.zeros((1, 1)), "constant")[0][0])  # 5e-5 each
