"""``s2h bench pointcloud2``: PointCloud2 <-> numpy time for a lidar-sized cloud.

A Velodyne-style layout (x, y, z, intensity float32, ring uint16, time float32; 22-byte points)
in a rosbags-deserialisable PointCloud2. The baseline, run in the same process on the same
bytes, is the per-point ``struct`` loop that hand-written converters (and early versions of ROS's
own Python read_points) use; the ratio is baseline time / codec time.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import struct
import time
from typing import Any, Callable

import numpy as np

from s2h_ros.datasets.rosbag import rosbags_cloud
from s2h_ros.pointcloud2 import create_cloud_fields, read_points, read_xyz


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--points", type=int, default=120_000, help="points per cloud")
    parser.add_argument("--repeats", type=int, default=30, help="timed runs of the codec")
    parser.add_argument("--baseline-repeats", type=int, default=3, help="timed runs of the per-point loop")
    parser.add_argument("--nan-fraction", type=float, default=0.1, help="NaN returns in the 'with NaNs' case")
    parser.add_argument("--seed", type=int, default=0)


def lidar_cloud(n: int, rng: np.random.Generator) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(n, 3) float32 points in an 80 m box plus intensity, ring and per-point time."""
    xyz = rng.uniform(-80, 80, size=(n, 3)).astype(np.float32)
    return xyz, {"intensity": rng.random(n, dtype=np.float32),
                 "ring": (np.arange(n) % 64).astype(np.uint16),
                 "time": np.linspace(0.0, 0.1, n, dtype=np.float32)}


def loop_read_xyz(msg: Any) -> np.ndarray:
    """Baseline decode: one struct.unpack_from per point, finite points kept."""
    offsets = {f.name: f.offset for f in msg.fields}
    unpack = struct.Struct("<f").unpack_from
    data, step = bytes(msg.data), msg.point_step
    ox, oy, oz = offsets["x"], offsets["y"], offsets["z"]
    out = []
    for i in range(msg.width * msg.height):
        base = i * step
        p = (unpack(data, base + ox)[0], unpack(data, base + oy)[0], unpack(data, base + oz)[0])
        if all(v == v and abs(v) != float("inf") for v in p):
            out.append(p)
    return np.array(out, dtype=np.float32).reshape(-1, 3)


def loop_create(xyz: np.ndarray, extra: dict[str, np.ndarray]) -> bytes:
    """Baseline encode: one struct.pack_into per point (same 22-byte layout)."""
    packer = struct.Struct("<ffffHf")
    buf = bytearray(packer.size * len(xyz))
    rows = zip(xyz.tolist(), extra["intensity"].tolist(), extra["ring"].tolist(), extra["time"].tolist())
    for i, ((x, y, z), intensity, ring, t) in enumerate(rows):
        packer.pack_into(buf, i * packer.size, x, y, z, intensity, ring, t)
    return bytes(buf)


def median_ms(fn: Callable[[], Any], repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def run(args: argparse.Namespace) -> dict:
    rng = np.random.default_rng(args.seed)
    xyz, extra = lidar_cloud(args.points, rng)
    msg = rosbags_cloud(xyz, extra)
    with_nans = xyz.copy()
    with_nans[rng.random(len(xyz)) < args.nan_fraction] = np.nan
    msg_nans = rosbags_cloud(with_nans, extra)
    load_before = os.getloadavg()

    # Same answers before timing anything.
    ours, _ = read_xyz(msg_nans)
    if not np.array_equal(ours, loop_read_xyz(msg_nans)):
        raise RuntimeError("read_xyz and the per-point baseline disagree")
    if create_cloud_fields(xyz, extra)[2] != loop_create(xyz, extra):
        raise RuntimeError("create_cloud_fields and the per-point baseline disagree")

    codec = {
        "read_xyz_ms": median_ms(lambda: read_xyz(msg), args.repeats),
        "read_xyz_with_nans_ms": median_ms(lambda: read_xyz(msg_nans), args.repeats),
        "read_points_all_fields_ms": median_ms(lambda: read_points(msg), args.repeats),
        "create_cloud_fields_ms": median_ms(lambda: create_cloud_fields(xyz, extra), args.repeats),
    }
    baseline = {
        "loop_read_xyz_ms": median_ms(lambda: loop_read_xyz(msg), args.baseline_repeats),
        "loop_create_ms": median_ms(lambda: loop_create(xyz, extra), args.baseline_repeats),
    }
    return {
        "points": args.points,
        "layout": "x,y,z,intensity float32; ring uint16; time float32 (point_step 22)",
        "bytes": len(msg.data),
        "nan_fraction": args.nan_fraction,
        "dropped_in_nan_case": int(len(xyz) - len(ours)),
        **codec,
        **baseline,
        "decode_speedup_vs_loop": baseline["loop_read_xyz_ms"] / codec["read_xyz_ms"],
        "encode_speedup_vs_loop": baseline["loop_create_ms"] / codec["create_cloud_fields_ms"],
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__,
                    "loadavg_before": load_before, "loadavg_after": os.getloadavg()},
    }
