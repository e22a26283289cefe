"""``s2h bench replay``: registration_node under a live 10 Hz stream, and KISS-ICP on the same scans.

A synthetic drive (64-beam by default, ~120k points a scan) is published at ``--rate`` into
registration_node (its own process, real DDS). Reported: processed rate, scans dropped by the
node's one-slot buffer, latency from publishing a scan to its odometry arriving (p50/p95),
the node's resident memory sampled through the run, and drift against ground truth; then
KISS-ICP's odometry on the same scans (offline, every scan) with its frames per second.
"""
from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path

import numpy as np


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sequence", type=Path, help="KITTI-layout sequence to replay (default: simulate one)")
    parser.add_argument("--frames", type=int, default=300, help="frames to simulate when --sequence is not given")
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--sensor", default="hdl64")
    parser.add_argument("--rate", type=float, default=10.0)
    parser.add_argument("--cache", type=Path, default=Path("results/bench_replay"), help="sequence and logs go here")
    parser.add_argument("-p", "--param", action="append", default=[], metavar="NAME:=VALUE",
                        help="registration_node parameter override (e.g. registration.device:=cuda)")
    parser.add_argument("--no-kiss-icp", action="store_true")


def _rss_mb(pid: int) -> float | None:
    """MB resident of process ``pid`` and its descendants (the node's helper process,
    ``s2h_ros.handover.in_low_priority_process``), summed: a page that several of them map counts in each."""
    from s2h_ros.evaluation.harness import proc_status_kb

    sizes = [kb for p in _process_tree(pid) if (kb := proc_status_kb("VmRSS", p)) is not None]
    return sum(sizes) / 1024.0 if sizes else None


def _process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (Linux's /proc/PID/task/TID/children)."""
    tree, i = [pid], 0
    while i < len(tree):
        for children in Path(f"/proc/{tree[i]}/task").glob("*/children"):
            try:
                tree += [int(c) for c in children.read_text().split()]
            except OSError:
                pass
        i += 1
    return tree


def run(args: argparse.Namespace) -> dict:
    import rclpy
    from rclpy.executors import MultiThreadedExecutor

    from s2h_ros.commands.replay import registration_node_process
    from s2h_ros.datasets.kitti import KittiSequence
    from s2h_ros.ros.replay import SequenceReplayer, evaluate_replay

    seq_dir = args.sequence
    if seq_dir is None:
        from s2h_ros.datasets.synthetic import simulate_sequence

        seq_dir = args.cache / f"seq_{args.sensor}_{args.seed}_{args.frames}"
        if not (seq_dir / "poses.txt").exists():
            simulate_sequence(n_frames=args.frames, seed=args.seed, sensor=args.sensor, out_dir=seq_dir, progress=True)
    sequence = KittiSequence(seq_dir)
    rss: list[tuple[float, float]] = []
    stop = threading.Event()
    with registration_node_process(args.cache / "registration_node.log", overrides=args.param) as proc:

        def sample() -> None:
            t0 = time.monotonic()
            while not stop.wait(1.0):
                mb = _rss_mb(proc.pid)
                if mb is not None:
                    rss.append((time.monotonic() - t0, mb))

        threading.Thread(target=sample, daemon=True).start()
        rclpy.init(args=[])
        node = SequenceReplayer(sequence, name="bench_replay", topic="points")
        executor = MultiThreadedExecutor(num_threads=2)
        executor.add_node(node)
        threading.Thread(target=executor.spin, daemon=True).start()
        try:
            if not node.wait_for_subscriber(120.0):
                raise RuntimeError(f"registration_node did not come up; see {args.cache / 'registration_node.log'}")
            t0 = time.monotonic()
            node.run(rate=args.rate, settle_timeout=60.0)
            duration = time.monotonic() - t0
            report = evaluate_replay(sequence, node.record, args.cache / "replay")
        finally:
            stop.set()
            executor.shutdown()
            node.destroy_node()
            rclpy.try_shutdown()
    points = [len(sequence[i].points) for i in range(0, len(sequence), max(1, len(sequence) // 10))]
    out = {
        "sequence": str(seq_dir), "frames": len(sequence), "points_per_scan_mean": float(np.mean(points)),
        "rate_hz": args.rate, "duration_s": duration,
        "processed_rate_hz": report["scans_answered"] / duration,
        "node": report,
        "rss_mb": {"start": rss[0][1] if rss else None, "end": rss[-1][1] if rss else None,
                   "max": max(m for _, m in rss) if rss else None,
                   "samples": [(round(t, 1), round(m, 1)) for t, m in rss[:: max(1, len(rss) // 30)]]},
    }
    if not args.no_kiss_icp:
        from s2h_ros.benchmarks.common import kiss_icp_baseline

        out["kiss_icp"] = kiss_icp_baseline(sequence)
    return out
