"""``s2h replay``: a KITTI-layout sequence or a rosbag2 file through registration_node over DDS.

Starts ``registration_node`` as its own process with ``config/register.yaml`` and
``config/kitti.yaml`` (plus ``--params-file``), publishes the scans from this process, and at the
end prints and writes the sequence metrics and a top-view trajectory plot: what
``ros2 launch s2h_ros kitti_replay.launch.py`` does on a full ROS 2 install.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", type=Path, help="KITTI odometry root / sequence folder, or a rosbag2 (.mcap, .db3, bag dir)")
    parser.add_argument("--sequence", default="", help="sequence id under a KITTI root (e.g. 08)")
    parser.add_argument("--topic", default="", help="PointCloud2 topic in the bag (bags only)")
    parser.add_argument("--rate", type=float, default=10.0, help="scans per second; 0 = lock-step (default 10)")
    parser.add_argument("--start", type=int, default=0, help="first frame")
    parser.add_argument("--frames", type=int, default=-1, help="number of frames (-1: all)")
    parser.add_argument("--params-file", type=Path, action="append", default=[],
                        help="extra registration_node parameter file(s), applied after config/kitti.yaml")
    parser.add_argument("-p", "--param", action="append", default=[], metavar="NAME:=VALUE",
                        help="registration_node parameter override, e.g. -p registration.device:=cuda")
    parser.add_argument("--out", type=Path, default=Path("results/replay"), help="metrics.json, trajectory.png, logs")
    parser.add_argument("--discovery-timeout", type=float, default=60.0)


def _load_sequence(args: argparse.Namespace):
    src = args.source
    is_bag = src.suffix in (".mcap", ".db3") or (src.is_dir() and (src / "metadata.yaml").exists())
    if is_bag:
        from s2h_ros.datasets.rosbag import list_topics, read_pointcloud_bag
        from s2h_ros.datasets.types import ScanList

        topic = args.topic
        if not topic:
            clouds = [t for t, ty in list_topics(src).items() if ty == "sensor_msgs/msg/PointCloud2"]
            if len(clouds) != 1:
                raise ValueError(f"{src}: pass --topic (PointCloud2 topics: {', '.join(clouds) or 'none'})")
            topic = clouds[0]
        return ScanList(list(read_pointcloud_bag(src, topic)), name=src.stem)
    from s2h_ros.datasets.kitti import KittiSequence

    return KittiSequence(src, args.sequence or None)


def node_command(params_files: list[Path], overrides: list[str]) -> list[str]:
    """registration_node with config/register.yaml, config/kitti.yaml, then ``params_files`` and
    ``-p`` ``overrides``."""
    from s2h_ros.paths import config_dir

    cmd = [sys.executable, "-m", "s2h_ros.ros.registration_node", "--ros-args"]
    for f in [config_dir() / "register.yaml", config_dir() / "kitti.yaml", *params_files]:
        cmd += ["--params-file", str(f)]
    for o in overrides:
        cmd += ["-p", o]
    return cmd


@contextmanager
def registration_node_process(log_path: Path, params_files: list[Path] = (), overrides: list[str] = (),
                              env: dict[str, str] | None = None):
    """registration_node as its own process (output to ``log_path``; environment ``env``, default
    this process's), stopped with SIGINT on exit."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(node_command(list(params_files), list(overrides)), stdout=log,
                                stderr=subprocess.STDOUT, env=dict(os.environ) if env is None else env)
        try:
            yield proc
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def run(args: argparse.Namespace) -> int:
    import rclpy

    from s2h_ros.ros.kitti_replay import run_replay
    from s2h_ros.ros.replay import SequenceReplayer

    try:
        sequence = _load_sequence(args)
    except (OSError, ValueError) as exc:
        print(f"s2h replay: {exc}", file=sys.stderr)
        return 2
    log_path = args.out / "registration_node.log"
    with registration_node_process(log_path, args.params_file, args.param) as node_proc:
        print(f"started registration_node (pid {node_proc.pid}), log: {log_path}")
        rclpy.init(args=[])
        end = -1 if args.frames < 0 else args.start + args.frames
        node = SequenceReplayer(sequence, topic="points", frame_id=getattr(sequence[0], "frame_id", "velodyne"),
                                discovery_timeout=args.discovery_timeout, end=end, start=args.start,
                                rate=args.rate, output_dir=str(args.out))
        code = run_replay(node)
    if node_proc.returncode not in (0, -signal.SIGINT):
        print(f"registration_node exited with {node_proc.returncode}; see {log_path}", file=sys.stderr)
    return code
