"""``s2h bench pipeline``: time per pair of register() (features of both scans included)
against Open3D FPFH + RANSAC on the same synthetic KITTI-like pairs, in the same run."""
from __future__ import annotations

import argparse
import time
from typing import Callable

import numpy as np


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pairs", type=int, default=5, help="synthetic pairs >= 10 m apart (default 5)")
    parser.add_argument("--seed", type=int, default=0, help="world seed (0-999 are never trained on)")
    parser.add_argument("--sensor", default="hdl64")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads of torch, BLAS and scipy (config.use_cpu_threads)")
    parser.add_argument("--features", default="auto", help="pipeline features: auto, fcgf, fpfh")
    parser.add_argument("--weights", default="", help="checkpoint (default: the shipped weights)")
    parser.add_argument("--baseline", default="fpfh_ransac", help="harness method to compare with ('' for none)")


def _timed(register: Callable, pairs: list) -> list[dict]:
    """Wall time and RE/TE of ``register(source, target)`` on each pair."""
    from s2h_ros import geometry

    rows = []
    for pair in pairs:
        t0 = time.perf_counter()
        result = register(pair.source, pair.target)
        wall = time.perf_counter() - t0
        re, te = geometry.transform_errors(result.transform, pair.T_gt)
        rows.append({"name": pair.name, "wall_s": wall, "re_deg": float(re), "te_m": float(te),
                     "success": bool(result.success), "stages": dict(result.timings)})
    return rows


def run(args: argparse.Namespace) -> dict:
    from s2h_ros.config import RegistrationConfig, use_cpu_threads
    from s2h_ros.datasets.synthetic import synthetic_pairs
    from s2h_ros.evaluation.methods import make_method
    from s2h_ros.pipeline import Registrar

    use_cpu_threads(args.threads)
    pairs = synthetic_pairs(args.pairs, seed=args.seed, sensor=args.sensor)
    registrar = Registrar(RegistrationConfig(device=args.device, features=args.features, weights=args.weights))
    registrar.register(pairs[0].source, pairs[0].target)  # warm-up: model load, allocator, kernels
    rows = _timed(registrar.register, pairs)
    out = {"device": args.device, "threads": args.threads, "pairs": len(pairs), "sensor": args.sensor,
           "features": registrar.feature_kind(), "s2h": _summary(rows), "s2h_rows": rows}
    if args.baseline:
        base = _timed(make_method(args.baseline, scale="outdoor").register, pairs)
        out[args.baseline] = _summary(base)
        out["speedup_vs_baseline"] = out[args.baseline]["median_s"] / out["s2h"]["median_s"]
    return out


def _summary(rows: list[dict]) -> dict:
    wall = np.array([r["wall_s"] for r in rows])
    ok = np.array([r["re_deg"] < 5.0 and r["te_m"] < 0.6 for r in rows])  # DGR KITTI thresholds
    return {"median_s": float(np.median(wall)), "mean_s": float(wall.mean()), "recall": float(ok.mean()),
            "mean_re_deg": float(np.mean([r["re_deg"] for r, o in zip(rows, ok) if o])) if ok.any() else None,
            "mean_te_m": float(np.mean([r["te_m"] for r, o in zip(rows, ok) if o])) if ok.any() else None}
