"""Side-by-side statistics of simulated scans and real ones: the bundled KITTI pair, and raw scans.

``compare_with_raw`` compares raw simulated scans with the raw real scans of the team's data
folder (``../shared/data``: KITTI 00 frames 0-1, HDL-64E; Newer College, OS1-64 Gen 1): range
histogram, point density by range, and the elevation (ring) structure. The rest of this module
is the older check against the bundled KITTI loop pair, described next.

The bundled KITTI scans are not raw: they were averaged on a 0.2 m grid (N x 6 with normals)
and cropped at 80 m. Only what survives that processing is compared: the simulated scan gets
the same 0.2 m grid averaging (Open3D ``voxel_down_sample``) and 80 m crop first. Raw ring
structure cannot be read from the averaged real scans; the simulated raw ring pattern is
reported on its own (beams, points per beam) next to the published KITTI figure.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import open3d as o3d

from s2h_ros import paths
from s2h_ros.datasets.synthetic.sequence import simulate_sequence

RANGE_BINS = (0.0, 5.0, 10.0, 20.0, 30.0, 40.0, 60.0, 80.0)
ELEVATION_BINS = tuple(np.arange(-26.0, 4.0, 2.0))


def load_kitti_samples() -> list[np.ndarray]:
    """The two bundled real KITTI scans as (N, 6) float32 (xyz, normal), Velodyne frame."""
    out = []
    for path in paths.KITTI_LOOP_PAIR:
        raw = np.fromfile(path, dtype=np.float32)
        if raw.size % 6:
            raise ValueError(f"{path}: size {raw.size} is not a multiple of 6 floats")
        out.append(raw.reshape(-1, 6))
    return out


def grid_average(points: np.ndarray, voxel: float = 0.2, crop: float = 80.0) -> np.ndarray:
    """(N, 3) -> (M, 6): points averaged per ``voxel`` cell, cropped at ``crop`` m, with normals."""
    pcd = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(points.astype(np.float64)))
    pcd = pcd.voxel_down_sample(voxel)
    xyz = np.asarray(pcd.points)
    pcd = pcd.select_by_index(np.flatnonzero(np.linalg.norm(xyz, axis=1) <= crop))
    pcd.estimate_normals(o3d.geometry.KDTreeSearchParamHybrid(radius=5 * voxel, max_nn=30))
    return np.column_stack([np.asarray(pcd.points), np.asarray(pcd.normals)]).astype(np.float32)


def scan_statistics(cloud: np.ndarray) -> dict:
    """Point count, range / elevation histograms (fractions), height percentiles, surface orientation."""
    xyz, normals = cloud[:, :3].astype(np.float64), cloud[:, 3:6]
    r = np.linalg.norm(xyz, axis=1)
    elev = np.degrees(np.arctan2(xyz[:, 2], np.linalg.norm(xyz[:, :2], axis=1)))
    nz = np.abs(normals[:, 2])
    return {
        "points": int(len(xyz)),
        "range_percentiles_m": dict(zip(("p5", "p25", "p50", "p75", "p95"),
                                        np.percentile(r, [5, 25, 50, 75, 95]).round(2).tolist())),
        "range_histogram": (np.histogram(r, RANGE_BINS)[0] / len(r)).round(4).tolist(),
        "elevation_histogram": (np.histogram(elev, ELEVATION_BINS)[0] / len(r)).round(4).tolist(),
        "z_percentiles_m": dict(zip(("p5", "p50", "p95"), np.percentile(xyz[:, 2], [5, 50, 95]).round(2).tolist())),
        "horizontal_fraction": round(float(np.mean(nz > 0.9)), 4),  # ground, roofs, table tops
        "vertical_fraction": round(float(np.mean(nz < 0.3)), 4),  # facades, poles, car sides
        "translation_constraint": translation_constraint(normals),
    }


def translation_constraint(normals: np.ndarray) -> list[float]:
    """Eigenvalues (ascending, summing to 1) of mean(n n^T) over (N, 3) unit normals.

    Point-to-plane alignment pins a translation direction d in proportion to d^T mean(n n^T) d:
    a smallest eigenvalue near 0 means a degenerate scene (a featureless corridor or open plane).
    """
    n = normals.astype(np.float64)
    return np.linalg.eigvalsh(n.T @ n / max(len(n), 1)).round(4).tolist()


def _mean_stats(stats: list[dict]) -> dict:
    """Average a list of scan_statistics dicts key by key."""
    out = {}
    for key, value in stats[0].items():
        if isinstance(value, dict):
            out[key] = {k: round(float(np.mean([s[key][k] for s in stats])), 2) for k in value}
        elif isinstance(value, list):
            out[key] = np.mean([s[key] for s in stats], axis=0).round(4).tolist()
        else:
            out[key] = round(float(np.mean([s[key] for s in stats])), 4)
    return out


def compare_with_kitti(seed: int = 0, n_scans: int = 4, voxel: float = 0.2, crop: float = 80.0) -> dict:
    """Statistics of the real KITTI samples and of ``n_scans`` simulated HDL-64E scans (same processing).

    Also times scan generation against the bare Open3D ``cast_rays`` of the same rays on the same
    scene (the floor any ray-casting simulator pays), measured in the same run.
    """
    real = [scan_statistics(c) for c in load_kitti_samples()]
    seq = simulate_sequence(n_frames=n_scans * 20, seed=seed)
    frames = list(range(0, len(seq), 20))
    seq[frames[0]]  # build the first tiles outside the timing
    sim, raw_counts, per_ring, t_scan = [], [], [], []
    for i in frames:
        t0 = time.perf_counter()
        scan = seq[i]
        t_scan.append(time.perf_counter() - t0)
        raw_counts.append(len(scan.points))
        per_ring.append(np.bincount(scan.ring, minlength=seq.sensor.n_rings))
        sim.append(scan_statistics(grid_average(scan.points, voxel, crop)))
    # Baseline: the bare ray cast of the same rays against the already built scene.
    pose = seq.world_poses[frames[-1]]
    dirs = seq.sensor.ray_directions().reshape(-1, 3) @ pose[:3, :3].T
    rays = np.column_stack([np.broadcast_to(pose[:3, 3], dirs.shape), dirs]).astype(np.float32)
    scene = seq.world._scene
    t_cast = []
    for _ in range(len(frames)):
        t0 = time.perf_counter()
        scene.cast_rays(o3d.core.Tensor(rays))
        t_cast.append(time.perf_counter() - t0)
    per_ring = np.mean(per_ring, axis=0)
    return {
        "caveat": ("real KITTI samples are 0.2 m-grid-averaged and cropped at 80 m (3DFeatNet example data); "
                   "simulated scans get the same averaging and crop before comparison"),
        "kitti_real": _mean_stats(real),
        "simulated": _mean_stats(sim),
        "simulated_raw": {
            "sensor": seq.sensor.name, "seed": seed, "scans": len(frames),
            "points_per_scan": float(np.mean(raw_counts)),
            "beams": int(seq.sensor.n_rings), "columns": int(seq.sensor.n_columns),
            "points_per_beam_min_median_max": [float(per_ring.min()), float(np.median(per_ring)),
                                               float(per_ring.max())],
            "kitti_published_points_per_scan": "about 120k (raw HDL-64E at 10 Hz)",
        },
        "timing": {
            "ms_per_scan_median": round(1e3 * float(np.median(t_scan)), 1),
            "ms_bare_cast_rays_median": round(1e3 * float(np.median(t_cast)), 1),
            "ratio_scan_to_cast": round(float(np.median(t_scan) / np.median(t_cast)), 2),
            "rays_per_scan": int(len(rays)),
            "load_average_1min": round(os.getloadavg()[0], 2),
        },
    }


def comparison_markdown(result: dict) -> str:
    """The comparison as a markdown table (what docs/simulator.md shows)."""
    real, sim = result["kitti_real"], result["simulated"]
    rows = [("points after 0.2 m grid + 80 m crop", real["points"], sim["points"])]
    for k in real["range_percentiles_m"]:
        rows.append((f"range {k} (m)", real["range_percentiles_m"][k], sim["range_percentiles_m"][k]))
    for a, b, fr, fs in zip(RANGE_BINS[:-1], RANGE_BINS[1:], real["range_histogram"], sim["range_histogram"]):
        rows.append((f"fraction with range {a:g}-{b:g} m", fr, fs))
    for k in real["z_percentiles_m"]:
        rows.append((f"height z {k} (m, sensor frame)", real["z_percentiles_m"][k], sim["z_percentiles_m"][k]))
    rows.append(("horizontal-surface fraction (abs nz > 0.9)", real["horizontal_fraction"], sim["horizontal_fraction"]))
    rows.append(("vertical-surface fraction (abs nz < 0.3)", real["vertical_fraction"], sim["vertical_fraction"]))
    rows.append(("translation constraint: eigenvalues of mean(n n^T)", real["translation_constraint"],
                 sim["translation_constraint"]))
    for a, b, fr, fs in zip(ELEVATION_BINS[:-1], ELEVATION_BINS[1:], real["elevation_histogram"],
                            sim["elevation_histogram"]):
        rows.append((f"fraction with elevation {a:g} to {b:g} deg", fr, fs))
    lines = ["| statistic | real KITTI (2 scans) | simulated hdl64 |", "|---|---|---|"]
    lines += [f"| {name} | {r} | {s} |" for name, r, s in rows]
    raw, tm = result["simulated_raw"], result["timing"]
    lines += [
        "",
        f"Raw simulated scans ({raw['scans']} scans, seed {raw['seed']}): {raw['points_per_scan']:.0f} points per scan "
        f"over {raw['beams']} beams x {raw['columns']} columns; points per beam min / median / max "
        f"{raw['points_per_beam_min_median_max'][0]:.0f} / {raw['points_per_beam_min_median_max'][1]:.0f} / "
        f"{raw['points_per_beam_min_median_max'][2]:.0f} (KITTI: {raw['kitti_published_points_per_scan']}).",
        f"Time per scan: {tm['ms_per_scan_median']} ms median, against {tm['ms_bare_cast_rays_median']} ms for the "
        f"bare Open3D cast_rays of the same {tm['rays_per_scan']} rays in the same run "
        f"(ratio {tm['ratio_scan_to_cast']}; machine load average {tm['load_average_1min']}).",
        "",
        f"Caveat: {result['caveat']}.",
    ]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ raw scans (../shared/data)
SHARED_DATA = paths.PACKAGE_DIR.parent.parent / "shared" / "data"  # the team's real-data folder
RAW_RANGE_BINS = (0.0, 2.0, 5.0, 10.0, 20.0, 30.0, 40.0, 60.0, 80.0, 120.0)
RAW_ELEVATION_STEP = 2.0  # degrees


def raw_statistics(points: np.ndarray) -> dict:
    """Statistics of one raw (not downsampled) scan in its sensor frame.

    Range histogram (fractions), point density by range (returns per square metre of the
    horizontal annulus of each range bin), and the ring structure as seen in elevation: the span
    of elevations and the fraction of returns in each 2-degree band.
    """
    xyz = np.asarray(points, np.float64)[:, :3]
    r = np.linalg.norm(xyz, axis=1)
    d = np.linalg.norm(xyz[:, :2], axis=1)
    elev = np.degrees(np.arctan2(xyz[:, 2], d))
    edges = np.asarray(RAW_RANGE_BINS)
    annulus = np.pi * np.diff(edges ** 2)
    bins = np.arange(-46.0, 46.0 + RAW_ELEVATION_STEP, RAW_ELEVATION_STEP)
    return {
        "points": int(len(xyz)),
        "range_percentiles_m": dict(zip(("p5", "p50", "p95"), np.percentile(r, [5, 50, 95]).round(2).tolist())),
        "range_histogram": (np.histogram(r, edges)[0] / len(r)).round(4).tolist(),
        "density_per_m2": (np.histogram(d, edges)[0] / annulus).round(3).tolist(),
        "elevation_span_deg": np.percentile(elev, [0.5, 99.5]).round(2).tolist(),
        "elevation_histogram": (np.histogram(elev, bins)[0] / len(r)).round(4).tolist(),
        "elevation_bins_deg": bins.tolist(),
    }


def _real_raw(data_dir: Path, names: tuple[str, ...]) -> list[np.ndarray]:
    out = []
    for name in names:
        raw = np.fromfile(data_dir / name, dtype=np.float32)
        if raw.size % 3:
            raise ValueError(f"{data_dir / name}: {raw.size} floats is not N x 3")
        out.append(raw.reshape(-1, 3))
    return out


# (label, real files under the data folder, matching preset, families, mount height (None: vehicle))
RAW_CASES = (
    ("KITTI 00 raw, HDL-64E on a car", ("kitti/raw_00/000000.bin", "kitti/raw_00/000001.bin"), "hdl64",
     ("town", "suburban"), None),
    ("Newer College, OS1-64 Gen 1 handheld", tuple(f"newer_college_os1_64/raw_0{k}.bin" for k in range(3)),
     "os1_64_gen1", ("suburban", "town"), 1.2),
)


def compare_with_raw(data_dir: str | Path | None = None, seed: int = 0, n_scans: int = 4) -> dict:
    """Raw real scans (RAW_CASES) against simulated scans of the matching preset, side by side.

    Each case: the real scans' mean statistics and, per family, the mean over ``n_scans``
    simulated scans 2 s apart (seed ``seed``, the preset's noise and dropout, no extra filtering).
    """
    data_dir = Path(data_dir) if data_dir is not None else SHARED_DATA
    cases = []
    for label, names, sensor, families, height in RAW_CASES:
        real = [raw_statistics(p) for p in _real_raw(data_dir, names)]
        sim = {}
        for family in families:
            seq = simulate_sequence(n_frames=(n_scans - 1) * 20 + 1, seed=seed, sensor=sensor, family=family,
                                    mount_height=height)
            sim[family] = _mean_stats([raw_statistics(seq[i].points) for i in range(0, len(seq), 20)])
        cases.append({"label": label, "sensor": sensor, "real_files": list(names), "mount_height": height,
                      "real": _mean_stats(real), "simulated": sim})
    return {"data_dir": str(data_dir), "seed": seed, "simulated_scans": n_scans, "cases": cases}


def raw_comparison_markdown(result: dict) -> str:
    """One markdown table per case: statistic | real | simulated family ..."""
    lines = []
    for case in result["cases"]:
        real, sims = case["real"], case["simulated"]
        fams = list(sims)
        height = "vehicle height" if case["mount_height"] is None else f"{case['mount_height']} m mount"
        lines += [f"**{case['label']}** (real: {len(case['real_files'])} scans; simulated: `{case['sensor']}`, "
                  f"{result['simulated_scans']} scans per family, seed {result['seed']}, {height})", "",
                  "| statistic | real | " + " | ".join(f"sim {f}" for f in fams) + " |",
                  "|---|---|" + "---|" * len(fams)]

        def row(name, key, idx=None):
            vals = [real[key] if idx is None else real[key][idx]] + [
                s[key] if idx is None else s[key][idx] for s in sims.values()]
            lines.append(f"| {name} | " + " | ".join(str(v) for v in vals) + " |")

        row("points per scan", "points")
        for k in real["range_percentiles_m"]:
            vals = [real["range_percentiles_m"][k]] + [s["range_percentiles_m"][k] for s in sims.values()]
            lines.append(f"| range {k} (m) | " + " | ".join(str(v) for v in vals) + " |")
        for i, (a, b) in enumerate(zip(RAW_RANGE_BINS[:-1], RAW_RANGE_BINS[1:])):
            row(f"fraction at range {a:g}-{b:g} m", "range_histogram", i)
        for i, (a, b) in enumerate(zip(RAW_RANGE_BINS[:-1], RAW_RANGE_BINS[1:])):
            row(f"returns per m^2 at horizontal distance {a:g}-{b:g} m", "density_per_m2", i)
        row("elevation p0.5 (deg)", "elevation_span_deg", 0)
        row("elevation p99.5 (deg)", "elevation_span_deg", 1)
        bins = real["elevation_bins_deg"]
        for i in range(len(bins) - 1):
            if max([real["elevation_histogram"][i]] + [s["elevation_histogram"][i] for s in sims.values()]) > 0.001:
                row(f"fraction at elevation {bins[i]:g} to {bins[i + 1]:g} deg", "elevation_histogram", i)
        lines.append("")
    return "\n".join(lines)


def raw_comparison_png(result: dict, path: str | Path) -> Path:
    """Range histograms, densities and elevation histograms of every case, real against simulated."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = result["cases"]
    fig, axes = plt.subplots(len(cases), 3, figsize=(15, 4 * len(cases)), squeeze=False)
    mid = np.asarray(RAW_RANGE_BINS)
    centres = (mid[:-1] + mid[1:]) / 2
    for row, case in zip(axes, cases):
        series = {"real": case["real"], **{f"sim {k}": v for k, v in case["simulated"].items()}}
        bins = np.asarray(case["real"]["elevation_bins_deg"])
        for name, st in series.items():
            style = {"lw": 2.5, "color": "k"} if name == "real" else {"lw": 1.2}
            row[0].plot(centres, st["range_histogram"], marker="o", label=name, **style)
            row[1].semilogy(centres, np.maximum(st["density_per_m2"], 1e-4), marker="o", label=name, **style)
            row[2].plot((bins[:-1] + bins[1:]) / 2, st["elevation_histogram"], label=name, **style)
        row[0].set(title=f"{case['label']}: range", xlabel="range (m)", ylabel="fraction of returns")
        row[1].set(title="density by range", xlabel="horizontal distance (m)", ylabel="returns per m^2")
        row[2].set(title="elevation (ring structure)", xlabel="elevation (deg)", ylabel="fraction of returns")
        for ax in row:
            ax.legend(fontsize=8)
            ax.grid(alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
