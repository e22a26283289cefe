"""Markdown tables of evaluation results (JSON files: s2h_ros.outputs).

Tables use the units papers print: RE in degrees, TE in centimetres, time in seconds (pairs)
or milliseconds per frame (sequences), drift in % and deg/100 m.
"""
from __future__ import annotations

import math
from typing import Any



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
    """One row per method: recall, mean RE/TE over successes, results trusted but wrong, RANSAC
    safeguard fallbacks (methods that report them), time, peak memory."""
    header = ["method", "pairs", "recall (%)", "RE (deg)", "TE (cm)", "wrong but trusted", "RANSAC fallbacks",
              "time (s)", "peak RSS (MB)"]
    rows = [[name, str(s["pairs"]), _fmt(s["recall"], 100, 1), _fmt(s["re_mean_deg"]),
             _fmt(s["te_mean_m"], 100, 1), str(s.get("wrong_trusted", "")),
             "" if s.get("fallbacks") is None else str(s["fallbacks"]),
             _fmt(s["time_mean_s"], 1, 3), _fmt(s["peak_rss_mb_max"], 1, 0)]
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


def replay_summary(report: dict) -> str:
    """A few readable lines of a node replay report (``s2h_ros.ros.replay.evaluate_replay``)."""
    def number(value, unit: str, scale: float = 1.0, digits: int = 2) -> str:
        text = _fmt(value, scale, digits)
        return "n/a" if text == "-" else f"{text} {unit}"

    def ate_and_drift(metrics: dict) -> str:  # the short form: translational drift only
        drift = number(metrics.get("t_err_pct"), "%") if metrics.get("segments") else "n/a"
        return f"ATE RMSE {number(metrics.get('ate_rmse_m'), 'm', 1, 3)}, KITTI drift {drift}"

    m = report.get("metrics", {})
    lines = [f"{report.get('method', 's2h')}: {report['scans_published']} scans published, "
             f"{report['scans_answered']} answered, {report['scans_trusted']} trusted, "
             f"{report['scans_failed']} not trusted, {report['scans_dropped']} unanswered (dropped)"]
    if m:
        drift = (f"{number(m.get('t_err_pct'), '%')}, {number(m.get('r_err_deg_per_100m'), 'deg/100 m', 1, 3)}"
                 if m.get("segments") else "n/a (drive shorter than KITTI's 100 m segments)")
        lines.append(f"  path {number(m.get('length_m'), 'm', 1, 1)}, ATE RMSE {number(m.get('ate_rmse_m'), 'm', 1, 3)}, "
                     f"KITTI drift {drift}" + (" (untrusted and dropped scans hold the last pose)"
                                               if report.get("metrics_trusted") else ""))
    mt = report.get("metrics_trusted")
    if mt:
        lines.append(f"  the {report['scans_trusted']} trusted poses alone: {ate_and_drift(mt)}")
    rate = report.get("rate")
    if rate:
        lines.append(f"  replayed at {number(rate['rate_hz'], 'Hz', 1, 2)} (chosen: sensor {number(rate['sensor_hz'], 'Hz', 1, 1)}, "
                     f"node's lock-step answer p50 {number(rate['answer_p50_ms'], 'ms', 1, 0)} over the first "
                     f"{rate['warmup_scans'] + 1} scans)")
    lat, reg = report.get("latency_ms"), report.get("step_ms")
    if lat:
        lines.append(f"  latency publish -> odometry p50 {number(lat['p50'], 'ms', 1, 0)}, p95 {number(lat['p95'], 'ms', 1, 0)}")
    if reg:
        lines.append(f"  processing per scan (features included) p50 {number(reg['p50'], 'ms', 1, 0)}, "
                     f"p95 {number(reg['p95'], 'ms', 1, 0)}")
    for name, b in report.get("baselines", {}).items():  # offline, same scans
        if "error" in b:
            lines.append(f"{name} (same scans, offline): not run: {b['error']}")
            continue
        lines.append(f"{name} (same scans, offline): {ate_and_drift(b)}, "
                     f"{number(b.get('time_per_frame_ms'), 'ms', 1, 0)} per scan")
    if report.get("plot"):
        lines.append(f"  trajectory plot: {report['plot']}")
    return "\n".join(lines) + "\n"
