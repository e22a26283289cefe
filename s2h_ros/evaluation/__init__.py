"""Evaluation: metrics (RE, TE, recall, KITTI drift, ATE), the side-by-side harness, baselines,
Markdown reports and plots. Baselines and plotting libraries load only when used."""
from __future__ import annotations

from s2h_ros.evaluation.harness import (
    PairEvaluation,
    SequenceEvaluation,
    chain_odometry,
    evaluate_pairs,
    evaluate_sequence,
    measure,
)
from s2h_ros.evaluation.methods import METHODS, MethodResult, MethodUnavailable, make_method
from s2h_ros.evaluation.metrics import (
    THRESHOLDS,
    RecallThreshold,
    absolute_trajectory_error,
    kitti_drift,
    pair_errors,
    sequence_metrics,
    summarize_pairs,
)

__all__ = [
    "METHODS", "THRESHOLDS", "MethodResult", "MethodUnavailable", "PairEvaluation", "RecallThreshold",
    "SequenceEvaluation", "absolute_trajectory_error", "chain_odometry", "evaluate_pairs",
    "evaluate_sequence", "kitti_drift", "make_method", "measure", "pair_errors", "sequence_metrics",
    "summarize_pairs",
]
