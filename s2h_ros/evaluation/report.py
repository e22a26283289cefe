"""Markdown tables and JSON-ready dicts of evaluation results.

Tables use the units papers print: RE in degrees, TE in centimetres, time in seconds (pairs)
or milliseconds per frame (sequences), drift in % and deg/100 m.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np


def jsonable(obj: Any) -> Any:
    """Plain JSON types: numpy to lists/scalars, NaN/inf to None (JSON has no NaN)."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def _fmt(value: Any, scale: float = 1.0, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value * scale:.{digits}f}"


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A GitHub Markdown table; the first column left-aligned, the rest right-aligned."""
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join([":---"] + ["---:"] * (len(header) - 1)) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def pairs_table(summary: dict[str, dict]) -> str:
    """One row per method: recall, mean RE/TE over successes, time, peak memory."""
    header = ["method", "pairs", "recall (%)", "RE (deg)", "TE (cm)", "time (s)", "peak RSS (MB)"]
    rows = [[name, str(s["pairs"]), _fmt(s["recall"], 100, 1), _fmt(s["re_mean_deg"]),
             _fmt(s["te_mean_m"], 100, 1), _fmt(s["time_mean_s"], 1, 3), _fmt(s["peak_rss_mb_max"], 1, 0)]
            for name, s in summary.items()]
    return markdown_table(header, rows)


def sequence_table(summary: dict[str, dict]) -> str:
    """One row per method: KITTI drift, ATE, time per frame, peak memory."""
    header = ["method", "frames", "length (m)", "t_err (%)", "r_err (deg/100 m)", "ATE RMSE (m)",
              "time (ms/frame)", "peak RSS (MB)"]
    rows = [[name, str(s["frames"]), _fmt(s["length_m"], 1, 0), _fmt(s["t_err_pct"]),
             _fmt(s["r_err_deg_per_100m"], 1, 3), _fmt(s["ate_rmse_m"]), _fmt(s["time_per_frame_ms"], 1, 1),
             _fmt(s["peak_rss_mb"], 1, 0)]
            for name, s in summary.items()]
    return markdown_table(header, rows)
