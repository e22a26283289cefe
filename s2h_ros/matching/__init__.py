"""S2H matching: augmented Sinkhorn (S-step), exact partial permutation (H-step), straight-through
``soft_to_hard``, the sparse lidar-scale entry ``s2h_match``, and the paper's losses (dense and on the
sparse support). Defaults come from ``RegistrationConfig`` (``match_options``)."""
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
from s2h_ros.matching.defaults import match_options
from s2h_ros.matching.losses import (
    balanced_bce,
    inlier_count_loss,
    matching_loss,
    motion_loss,
    s2h_loss,
    sparse_inlier_count_loss,
    sparse_matching_loss,
    total_loss,
)
from s2h_ros.matching.sinkhorn import augmented_sinkhorn, sparse_augmented_sinkhorn
from s2h_ros.matching.soft_to_hard import (
    MatchResult,
    StraightThrough,
    edge_positions,
    edge_scores,
    s2h_match,
    soft_to_hard,
    sparse_outlier_profits,
    straight_through,
)

__all__ = [
    "DEFAULT_OUTLIER_PROFIT",
    "OUTLIER_RULES",
    "MatchResult",
    "StraightThrough",
    "augmented_profit_matrix",
    "augmented_sinkhorn",
    "balanced_bce",
    "candidate_support",
    "edge_positions",
    "edge_scores",
    "feature_knn",
    "inlier_count_loss",
    "losses",
    "match_options",
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
    "sparse_inlier_count_loss",
    "sparse_matching_loss",
    "sparse_outlier_profits",
    "sparse_partial_permutation",
    "straight_through",
    "total_loss",
]
