"""S2H matching: augmented Sinkhorn (S-step), exact partial permutation (H-step), straight-through
``soft_to_hard``, the sparse lidar-scale entry ``s2h_match``, and the paper's losses."""
from __future__ import annotations

from s2h_ros.matching import losses
from s2h_ros.matching.assignment import (
    DEFAULT_OUTLIER_PROFIT,
    OUTLIER_RULES,
    augmented_profit_matrix,
    outlier_profits,
    partial_permutation,
    partial_permutation_profit,
    sparse_partial_permutation,
)
from s2h_ros.matching.candidates import candidate_support, feature_knn, prior_support
from s2h_ros.matching.losses import inlier_count_loss, matching_loss, motion_loss, s2h_loss
from s2h_ros.matching.sinkhorn import augmented_sinkhorn, sparse_augmented_sinkhorn
from s2h_ros.matching.soft_to_hard import (
    MatchResult,
    StraightThroughPPM,
    edge_scores,
    s2h_match,
    soft_to_hard,
    sparse_outlier_profits,
)

__all__ = [
    "DEFAULT_OUTLIER_PROFIT",
    "OUTLIER_RULES",
    "MatchResult",
    "StraightThroughPPM",
    "augmented_profit_matrix",
    "augmented_sinkhorn",
    "candidate_support",
    "edge_scores",
    "feature_knn",
    "inlier_count_loss",
    "losses",
    "matching_loss",
    "motion_loss",
    "outlier_profits",
    "partial_permutation",
    "partial_permutation_profit",
    "prior_support",
    "s2h_loss",
    "s2h_match",
    "soft_to_hard",
    "sparse_augmented_sinkhorn",
    "sparse_outlier_profits",
    "sparse_partial_permutation",
]
