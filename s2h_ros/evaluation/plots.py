"""PNG figures of evaluation results: error CDFs per method, top-view trajectories and the
evaluation matrix's recall heat map.

Figures are built on ``matplotlib.figure.Figure`` directly (no pyplot, no global backend
switch), so they render on headless machines and leave a user's interactive session alone.
"""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from s2h_ros.outputs import write_bytes


def error_cdfs(records: list[dict], path: Path, re_thresh: float | None = None,
               te_thresh: float | None = None) -> Path:
    """Cumulative fraction of pairs below each RE (deg) and TE (m), one curve per method.

    Failed calls (infinite errors) never reach the curve's top, so the plateau shows recall
    at large thresholds.
    """
    methods = list(dict.fromkeys(r["method"] for r in records))
    if not methods:
        raise ValueError("no pair records to plot")
    fig = Figure(figsize=(10, 4))
    axes = fig.subplots(1, 2)
    for ax, key, label, thresh in ((axes[0], "re_deg", "rotation error (deg)", re_thresh),
                                   (axes[1], "te_m", "translation error (m)", te_thresh)):
        errors = {name: np.sort([r[key] for r in records if r["method"] == name]) for name in methods}
        finite = np.concatenate([e[np.isfinite(e)] for e in errors.values()] + [[thresh or 0.0]])
        right = max(float(finite.max()) * 1.1, 1e-3)
        for name, err in errors.items():
            frac = np.arange(1, len(err) + 1) / len(err)
            keep = np.isfinite(err)
            # start at (0, 0) and run flat to the right edge, so one pair still draws a step
            x = np.concatenate([[0.0], err[keep], [right]])
            y = np.concatenate([[0.0], frac[keep], [frac[keep][-1] if keep.any() else 0.0]])
            ax.step(x, y, where="post", label=name)
        if thresh is not None:
            ax.axvline(thresh, color="grey", linestyle="--", linewidth=1)
        ax.set_xscale("symlog", linthresh=0.1 if key == "re_deg" else 0.01)
        ax.set_xlim(0.0, right)
        ax.set_xlabel(label)
        ax.set_ylabel("fraction of pairs")
        ax.set_ylim(0, 1.02)
        ax.grid(True, alpha=0.3)
    axes[0].legend()
    return _save(fig, path)


def trajectories_top_view(gt: np.ndarray, estimates: dict[str, np.ndarray], path: Path,
                          title: str = "") -> Path:
    """x-y view of ``(N, 4, 4)`` estimated trajectories against the ground truth."""
    fig = Figure(figsize=(6, 6))
    ax = fig.subplots()
    ax.plot(gt[:, 0, 3], gt[:, 1, 3], "k-", linewidth=2, label="ground truth")
    for name, poses in estimates.items():
        ax.plot(poses[:, 0, 3], poses[:, 1, 3], linewidth=1, label=name)
    ax.set_aspect("equal", adjustable="datalim")
    ax.set_xlabel("x (m)")
    ax.set_ylabel("y (m)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    return _save(fig, path)


def recall_heatmap(rows: list[str], methods: list[str], recall_pct: np.ndarray, path: Path,
                   title: str = "") -> Path:
    """Recall (%) per row (matrix cell) and column (method) as coloured, annotated squares; NaN
    (no result) is left blank."""
    grid = np.asarray(recall_pct, dtype=np.float64).reshape(len(rows), len(methods))
    if grid.size == 0:
        raise ValueError("no cells to plot")
    fig = Figure(figsize=(2.0 + 1.6 * len(methods), 1.2 + 0.32 * len(rows)))
    ax = fig.subplots()
    image = ax.imshow(np.ma.masked_invalid(grid), cmap="RdYlGn", vmin=0.0, vmax=100.0, aspect="auto")
    for i in range(grid.shape[0]):
        for j in range(grid.shape[1]):
            if np.isfinite(grid[i, j]):
                ax.text(j, i, f"{grid[i, j]:.0f}", ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(methods)), methods, rotation=20, ha="right")
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.set_title(title or "recall (%)")
    fig.colorbar(image, ax=ax, label="recall (%)")
    return _save(fig, path)


def _save(fig: Figure, path: Path) -> Path:
    """PNG of ``fig`` in ``path``, written atomically (s2h_ros.outputs)."""
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=120)
    return write_bytes(path, png.getvalue())
