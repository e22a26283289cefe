"""``s2h bench features``: FCGF forward time and peak memory per preset.

Inputs: a synthetic spinning-lidar scan (64 beams x 2048 azimuths cast analytically against a
street of ground, facades, cars, poles and trees; about 20k voxels at 0.3 m, like a raw KITTI
scan) and the bundled real KITTI scan (pre-averaged on 0.2 m, so fewer voxels). Times are
medians over ``--repeats`` interleaved runs of the whole extraction (quantise + kernel maps +
network), of the network alone on cached kernel maps, and, where MinkowskiEngine imports, of
MinkowskiEngine on the same weights (reported as a ratio from the same run). Peak CPU memory is
the peak-RSS growth of a fresh process during one forward; on CUDA, ``max_memory_allocated``.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import statistics
import time

import numpy as np
import torch

from s2h_ros import paths
from s2h_ros.benchmarks.common import synchronize
from s2h_ros.models.fcgf import build_fcgf
from s2h_ros.sparse import SparseTensor, minkowski


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--presets", nargs="+", default=["kitti", "compact"])
    parser.add_argument("--voxel", type=float, default=0.3)
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads on CPU")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--devices", nargs="+", default=None, help="default: cpu, and cuda when available")
    parser.add_argument("--no-memory", action="store_true", help="skip the per-preset CPU memory processes")
    parser.add_argument("--seed", type=int, default=0)


def lidar_scan(seed: int = 0, beams: int = 64, columns: int = 2048) -> np.ndarray:
    """(N, 3) float32 returns of a spinning lidar in a street (ground, facades, cars, poles, tree crowns)."""
    rng = np.random.default_rng(seed)
    elev = np.deg2rad(np.linspace(-24.8, 2.0, beams))
    azim = np.linspace(-np.pi, np.pi, columns, endpoint=False)
    e, a = np.meshgrid(elev, azim, indexing="ij")
    d = np.stack([np.cos(e) * np.cos(a), np.cos(e) * np.sin(a), np.sin(e)], -1).reshape(-1, 3)
    origin = np.array([0.0, 0.0, 1.73])
    t = np.full(len(d), np.inf)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(d[:, 2] < 0, np.minimum(t, -origin[2] / d[:, 2]), t)  # ground z = 0
        for wall in (-20.0, 24.0):  # facades y = const, with gaps between buildings
            s = (wall - origin[1]) / d[:, 1]
            x = origin[0] + s * d[:, 0]
            gap = np.cos(x / 9.0) > 0.6
            t = np.where((s > 0) & ~gap & (origin[2] + s * d[:, 2] < 12), np.minimum(t, s), t)
        boxes = _off_road(rng, 100, 0.0, 0.0)
        for cx, cy, _ in boxes:  # parked cars: axis-aligned boxes 4.5 x 1.8 x 1.5 m
            lo, hi = np.array([cx - 2.25, cy - 0.9, 0.0]), np.array([cx + 2.25, cy + 0.9, 1.5])
            t1, t2 = (lo - origin) / d, (hi - origin) / d
            near, far = np.minimum(t1, t2).max(1), np.maximum(t1, t2).min(1)
            t = np.where((near < far) & (near > 0), np.minimum(t, near), t)
        for px, py, _ in _off_road(rng, 100, 0.0, 0.0):  # poles and trunks, radius 0.2 m
            oc = origin[:2] - (px, py)
            a2 = (d[:, :2] ** 2).sum(1)
            b = (oc * d[:, :2]).sum(1)
            disc = b * b - a2 * ((oc**2).sum() - 0.04)
            s = (-b - np.sqrt(np.maximum(disc, 0))) / a2
            t = np.where((disc > 0) & (s > 0) & (origin[2] + s * d[:, 2] < 6), np.minimum(t, s), t)
        foliage = rng.uniform(0.0, 1.0, len(d))  # rays enter leafy crowns before they return
        for centre in _off_road(rng, 150, 2.5, 6.0):  # tree crowns, radius 2 m
            oc = origin - centre
            b = (oc * d).sum(1)
            disc = b * b - ((oc**2).sum() - 4.0)
            s = -b - np.sqrt(np.maximum(disc, 0)) + foliage
            t = np.where((disc > 0) & (s > 0), np.minimum(t, s), t)
    hit = t < 32.0  # the range where a 64-beam scan keeps most returns per 0.3 m voxel
    pts = origin + t[hit, None] * d[hit] + rng.normal(0, 0.02, (hit.sum(), 3))
    return pts.astype(np.float32)


def _off_road(rng: np.random.Generator, n: int, z_lo: float, z_hi: float) -> np.ndarray:
    """(n, 3) positions within 70 m, off a 10 m wide road along x."""
    xyz = rng.uniform([-70, 5, z_lo], [70, 70, z_hi], (n, 3))
    xyz[:, 1] *= rng.choice([-1.0, 1.0], n)
    return xyz


def kitti_scan() -> np.ndarray:
    return np.fromfile(paths.KITTI_LOOP_PAIR[0], dtype=np.float32).reshape(-1, 6)[:, :3]


def _medians_ms(fns: dict, device: str, repeats: int) -> dict[str, float]:
    """Median time of each function, run interleaved (one of each per round) so that a change of
    machine load hits all of them alike and their ratios stay fair."""
    for fn in fns.values():
        fn()  # warm-up (allocator, kernels, lazy imports)
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            synchronize(device)
            t0 = time.perf_counter()
            fn()
            synchronize(device)
            times[name].append((time.perf_counter() - t0) * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def _measure(preset: str, xyz: np.ndarray, voxel: float, device: str, repeats: int, seed: int) -> dict:
    torch.manual_seed(seed)
    model = build_fcgf(preset).to(device).eval()
    pts = torch.from_numpy(xyz).to(device)
    out: dict = {}
    with torch.no_grad():
        x = SparseTensor.from_points(pts, voxel)
        out["voxels"] = len(x)
        fns = {"forward_ms": lambda: model(SparseTensor.from_points(pts, voxel)),
               "forward_cached_maps_ms": lambda: model(x)}
        if minkowski.available() and (device == "cpu" or torch.cuda.is_available()):
            ours = model(x)
            theirs = model(minkowski.from_points(pts, voxel))
            out["minkowski_max_abs_diff"] = float((minkowski.to_rows(theirs, ours.coords) - ours.feats).abs().max())
            fns["minkowski_forward_ms"] = lambda: model(minkowski.from_points(pts, voxel))
        if device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        out.update(_medians_ms(fns, device, repeats))
        if device.startswith("cuda"):
            out["peak_mem_mb"] = torch.cuda.max_memory_allocated() / 2**20
        if "minkowski_forward_ms" in out:
            out["ours_over_minkowski"] = out["forward_ms"] / out["minkowski_forward_ms"]
    return out


def _peak_rss_child(preset: str, xyz: np.ndarray, voxel: float, threads: int, queue) -> None:
    """In a fresh process: peak-RSS growth (MB) of one forward after the model and input exist."""
    torch.set_num_threads(threads)
    model = build_fcgf(preset).eval()
    pts = torch.from_numpy(xyz)
    with torch.no_grad():
        base = _current_rss_mb()
        model(SparseTensor.from_points(pts, voxel))
    queue.put(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base)


def _current_rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def _cpu_peak_mb(preset: str, xyz: np.ndarray, voxel: float, threads: int) -> float:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_peak_rss_child, args=(preset, xyz, voxel, threads, queue))
    proc.start()
    value = queue.get(timeout=600)
    proc.join()
    return value


def run(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    devices = args.devices or (["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
    inputs = {"synthetic_lidar": lidar_scan(args.seed), "kitti_sample": kitti_scan()}
    result: dict = {
        "torch": torch.__version__, "threads": args.threads, "voxel": args.voxel,
        "minkowski_available": minkowski.available(),
        "load_avg_start": list(np.round(np.array(__import__("os").getloadavg()), 2)),
        "cuda_device": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "runs": [],
    }
    for device in devices:
        for name, xyz in inputs.items():
            for preset in args.presets:
                row = {"device": device, "input": name, "preset": preset, "points": len(xyz)}
                row.update(_measure(preset, xyz, args.voxel, device, args.repeats, args.seed))
                if device == "cpu" and not args.no_memory:
                    row["peak_mem_mb"] = _cpu_peak_mb(preset, xyz, args.voxel, args.threads)
                result["runs"].append(row)
    result["load_avg_end"] = list(np.round(np.array(__import__("os").getloadavg()), 2))
    return result
