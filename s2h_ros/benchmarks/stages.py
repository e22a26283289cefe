"""``s2h bench stages``: per-scan time of each registration stage on every device, same run.

The node's latency per scan is the sum of stages that run where ``device`` says (voxelise +
FCGF features, the S2H search with the global feature k-NN or the tracking support from the
motion prior, the extra features of each heading hypothesis, the RANSAC safeguard on the global
matches: s2h_ros.ransac) and stages that always run on the
CPU (Open3D normals of a new keyframe, verification, and Open3D's
point-to-plane ICP: with a GPU the odometry runs ICP on the device instead, ``s2h_ros.icp``,
``icp_backend: auto``; ``s2h bench stream`` times the whole step there).
This bench times the first group on each device in ``--devices`` (default: cpu, and cuda when
available) on consecutive scans of a drive, so that the speed-up of a GPU is a ratio measured
in one run, and the second group on the CPU when Open3D imports (it does not on every GPU
machine: then those stages are reported as missing, never as zero).

Scans: ``--scans`` files in any format ``s2h_ros.datasets.io`` reads (KITTI .bin, .npy, PLY,
PCD), registered in the order given; without it, a simulated drive of ``--sensor`` (needs
Open3D). ``--init gt`` with ``--poses`` (KITTI poses, one row per scan) gives the tracking
search its prior; otherwise the prior is identity (scans 0.1 s apart barely move).
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Callable

import numpy as np
import torch

from s2h_ros.benchmarks.common import synchronize


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scans", nargs="*", default=[], help="scan files in drive order (default: simulated)")
    parser.add_argument("--columns", type=int, default=None, help=".bin columns (KITTI 4; raw x, y, z files 3)")
    parser.add_argument("--sensor", default="hdl64", help="simulated drive's sensor preset (no --scans)")
    parser.add_argument("--seed", type=int, default=5, help="simulated world seed (0-999 are never trained on)")
    parser.add_argument("--frames", type=int, default=6, help="simulated scans (no --scans)")
    parser.add_argument("--devices", nargs="+", default=None, help="default: cpu, and cuda when available")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: every core)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per stage and pair (median)")
    parser.add_argument("--voxel", type=float, default=0.3)


def _median_ms(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median wall time of ``fn`` in ms over ``repeats`` runs after one warm-up run."""
    fn()
    times = []
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def _scans(args: argparse.Namespace) -> tuple[str, list[np.ndarray]]:
    if args.scans:
        from s2h_ros.datasets.io import read_points

        return "files: " + ", ".join(os.path.basename(s) for s in args.scans), \
            [read_points(s, columns=args.columns)[:, :3].astype(np.float32) for s in args.scans]
    from s2h_ros.datasets.synthetic import simulate_sequence

    seq = simulate_sequence(n_frames=args.frames, seed=args.seed, sensor=args.sensor, speed=10.0)
    return f"simulated {args.sensor} drive, world seed {args.seed}", \
        [seq[i].points[:, :3].astype(np.float32) for i in range(args.frames)]


def _device_stages(device: str, scans: list[np.ndarray], voxel: float, repeats: int) -> dict:
    """Median ms per consecutive pair of the stages that run on ``device``."""
    from s2h_ros.config import RegistrationConfig
    from s2h_ros.correspondences import match_features, ransac_on_correspondences
    from s2h_ros.matching import prior_support
    from s2h_ros.pipeline import Registrar

    cfg = RegistrationConfig(device=device, voxel_size=voxel, features="fcgf")
    reg = Registrar(cfg)
    dev = reg.device
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    prepared = [reg.prepare(s) for s in scans]
    rows = []
    for i in range(len(scans) - 1):
        src, tgt = prepared[i + 1], prepared[i]
        predicted = src.xyz.astype(np.float64)  # identity prior: consecutive scans
        tree = tgt.spatial_index()
        pairs, _, _ = match_features(src.features, tgt.features, cfg, "fcgf")
        rows.append({
            "voxels": int(len(src.xyz)),
            "features": _median_ms(lambda: reg.prepare(scans[i + 1]), dev, repeats),
            "match_global": _median_ms(lambda: match_features(src.features, tgt.features, cfg, "fcgf"), dev, repeats),
            "support_prior": _median_ms(lambda: prior_support(predicted, tree, src.features, tgt.features,
                                                              cfg.prior_radius, cfg.k), dev, repeats),
            "match_prior": _median_ms(lambda: match_features(
                src.features, tgt.features, cfg, "fcgf",
                prior_support(predicted, tree, src.features, tgt.features, cfg.prior_radius, cfg.k)), dev, repeats),
            "heading_features": _median_ms(lambda: reg.turned_features(src, 90.0), dev, repeats),
            "ransac": _median_ms(lambda: ransac_on_correspondences(src.xyz, tgt.xyz, pairs, cfg), dev, repeats),
        })
    keys = [k for k in rows[0] if k != "voxels"]
    out = {k: statistics.median(r[k] for r in rows) for k in keys}
    out["match_prior"] = max(out["match_prior"] - out["support_prior"], 0.0)  # timed with its support
    out["voxels"] = statistics.median(r["voxels"] for r in rows)
    out["tracking_path"] = out["features"] + out["support_prior"] + out["match_prior"]
    out["global_path"] = out["features"] + out["match_global"]
    if dev.type == "cuda":
        out["peak_gpu_mib"] = torch.cuda.max_memory_allocated(dev) / 2**20
    return out


def _cpu_stages(scans: list[np.ndarray], voxel: float, repeats: int) -> dict | None:
    """Median ms of the Open3D stages (CPU whatever the device), or None without Open3D; the ICP's
    start is the RANSAC safeguard's transform."""
    try:
        import open3d  # noqa: F401
    except ImportError:
        return None
    from s2h_ros.config import RegistrationConfig
    from s2h_ros.correspondences import match_features, ransac_on_correspondences
    from s2h_ros.pipeline import Registrar
    from s2h_ros.refinement import refine_icp
    from s2h_ros.surface import estimate_normals, estimate_surface, planar_surface
    from s2h_ros.verification import verify

    cfg = RegistrationConfig(voxel_size=voxel, features="fcgf")
    reg = Registrar(cfg)
    rows = []
    for i in range(len(scans) - 1):
        src, tgt = reg.prepare(scans[i + 1]), reg.prepare(scans[i])
        pairs, _, _ = match_features(src.features, tgt.features, cfg, "fcgf")
        T = ransac_on_correspondences(src.xyz, tgt.xyz, pairs, cfg)
        target, axis = tgt.icp_target(cfg), tgt.pattern_axis()

        def keyframe_surface() -> None:  # what a new keyframe computes for its ICP target
            planar_surface(tgt.xyz, estimate_surface(tgt.xyz, voxel), voxel, cfg.icp_min_planarity, axis)

        rows.append({
            "keyframe_normals": _median_ms(lambda: estimate_normals(tgt.xyz, voxel), torch.device("cpu"), repeats),
            "keyframe_surface": _median_ms(keyframe_surface, torch.device("cpu"), repeats),
            "icp": _median_ms(lambda: refine_icp(src.xyz, target.xyz, T, cfg, target.normals), torch.device("cpu"),
                              repeats),
            "verify": _median_ms(lambda: verify(src.xyz, tgt.xyz, pairs, T, cfg.inlier_distance, tgt.spatial_index()),
                                 torch.device("cpu"), repeats),
        })
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]}


def run(args: argparse.Namespace) -> dict:
    threads = args.threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
    devices = args.devices or (["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"])
    source, scans = _scans(args)
    if len(scans) < 2:
        raise SystemExit("s2h bench stages: needs at least 2 scans")
    out: dict = {"scans": source, "num_scans": len(scans), "threads": threads, "voxel": args.voxel,
                 "cpu": os.cpu_count(), "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                 "devices": {}}
    for device in devices:
        out["devices"][device] = _device_stages(device, scans, args.voxel, args.repeats)
    cpu_only = _cpu_stages(scans, args.voxel, args.repeats)
    out["cpu_only_stages_ms"] = cpu_only if cpu_only is not None else "Open3D missing on this machine: not measured"
    if "cpu" in out["devices"]:
        base = out["devices"]["cpu"]
        for device, stages in out["devices"].items():
            if device != "cpu":
                stages["speedup_vs_cpu"] = {k: base[k] / v for k, v in stages.items()
                                            if k in base and isinstance(v, float) and v > 0 and k != "voxels"}
    return out
