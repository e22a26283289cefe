"""The matching engine's defaults, read from ``RegistrationConfig`` (the one place for defaults).

``s2h_ros.config`` imports only the standard library, so reading it keeps the engine light and
makes no import cycle (the config names the outlier rules as strings and never imports this package).
"""
from __future__ import annotations

from typing import Any

from s2h_ros.config import RegistrationConfig

REGISTRATION = RegistrationConfig()


def match_options(cfg: RegistrationConfig | None = None, feature_kind: str = "fcgf") -> dict[str, Any]:
    """``s2h_match``'s keyword arguments from ``cfg`` (default ``RegistrationConfig()``) for features
    of ``feature_kind`` (``fcgf`` or ``fpfh``, which have their own S-step temperature and slack):
    ``k``, ``iters``, ``temperature``, ``slack_score``, ``outlier_profit`` and ``scale`` (``None``
    for a negative ``outlier_scale``, meaning the rule's calibrated default).
    """
    cfg = REGISTRATION if cfg is None else cfg
    temperature, slack_score = cfg.s_step(feature_kind)
    return {
        "k": cfg.k,
        "iters": cfg.sinkhorn_iters,
        "temperature": temperature,
        "slack_score": slack_score,
        "outlier_profit": cfg.outlier_profit,
        "scale": None if cfg.outlier_scale < 0 else cfg.outlier_scale,
    }


DEFAULT_MATCH = match_options()
