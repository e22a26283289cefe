"""``s2h replay``: a KITTI-layout sequence or a rosbag2 file through registration_node over DDS.

Starts ``registration_node`` as its own process with ``config/register.yaml`` and
``config/kitti.yaml`` (plus ``--params-file``), publishes the scans from this process, and at the
end prints and writes the sequence metrics and a top-view trajectory plot: what
``ros2 launch s2h_ros kitti_replay.launch.py`` does on a full ROS 2 install.

Exit status: 0 done; 1 registration_node never appeared; 2 bad input (an unreadable source, an
output folder that cannot be written: one stderr line names it; results are still printed when
only the final files fail); 130 / 143 stopped by SIGINT / SIGTERM, with the metrics of the scans
answered so far written (s2h_ros.ros.kitti_replay).

The node process dies with this one, whatever ends it (``kill -9`` included): see
:func:`registration_node_process`.
"""
from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import math
import os
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

EXIT_BAD_INPUT = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", type=Path, help="KITTI odometry root / sequence folder, or a rosbag2 (.mcap, .db3, bag dir)")
    parser.add_argument("--sequence", default="", help="sequence id under a KITTI root (e.g. 08)")
    parser.add_argument("--topic", default="", help="PointCloud2 topic in the bag (bags only)")
    parser.add_argument("--rate", type=_rate, default=10.0,
                        help="scans per second; 0 = lock-step; auto = the rate this machine sustains, measured on a "
                             "lock-step warm-up (slowed real time on a slow CPU; default 10)")
    parser.add_argument("--start", type=int, default=0, help="first frame")
    parser.add_argument("--frames", type=int, default=-1, help="number of frames (-1: all)")
    parser.add_argument("--params-file", type=Path, action="append", default=[],
                        help="extra registration_node parameter file(s), applied after config/kitti.yaml")
    parser.add_argument("-p", "--param", action="append", default=[], metavar="NAME:=VALUE",
                        help="registration_node parameter override, e.g. -p registration.device:=cuda")
    parser.add_argument("--out", type=Path, default=Path("results/replay"), help="metrics.json, trajectory.png, logs")
    parser.add_argument("--discovery-timeout", type=float, default=60.0)
    parser.add_argument("--baseline", action="append", default=[], metavar="METHOD",
                        help="also run this odometry offline on the same scans and report it beside the node "
                             "(e.g. kiss_icp; repeatable)")


def _rate(text: str) -> float:
    """``--rate``: scans per second >= 0, or ``auto`` (the replayer's AUTO_RATE)."""
    if text.strip().lower() == "auto":
        from s2h_ros.ros.replay import AUTO_RATE

        return AUTO_RATE
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a rate: {text!r} (scans per second, 0 or auto)") from None
    if not (math.isfinite(value) and value >= 0.0):
        raise argparse.ArgumentTypeError(f"rate must be a finite number >= 0 or auto, got {text!r}")
    return value


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


PR_SET_PDEATHSIG = 1  # linux/prctl.h
# What the kernel sends the node when its parent dies. SIGTERM, not SIGKILL: the node's rclpy
# handler shuts it down as `kill <pid>` would (DDS participant and shared-memory segments released,
# the scan in flight abandoned within a second or two), and before rclpy is up Python's default
# action for SIGTERM ends the process at once.
PARENT_DEATH_SIGNAL = signal.SIGTERM


def _prctl():
    """libc's prctl, looked up before any fork (Linux; None elsewhere)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def die_with_parent_preexec():
    """A ``preexec_fn`` (or None where unsupported) that makes the child die with this process.

    Linux ``prctl(PR_SET_PDEATHSIG)``: the kernel signals the child when the parent dies, however
    it dies (``kill -9`` included, which no handler or ``finally`` here can see). It is set between
    fork and exec, so the node itself stays an ordinary program that runs standalone. Two caveats
    handled or documented: a parent that died before the call left the child orphaned already
    (checked with getppid, then the child exits); and the signal follows the *thread* that forked,
    so start the node from a thread that lives as long as it should (the main thread, as ``s2h
    replay``, the benchmarks and the tests do)."""
    prctl = _prctl()
    if prctl is None:
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(PARENT_DEATH_SIGNAL), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the prctl
            os._exit(1)

    return preexec


@contextmanager
def node_process(command: list[str], log_path: Path, env: dict[str, str] | None = None, cwd: str | None = None):
    """A ROS node ``command`` as its own process (output to ``log_path``; environment ``env``,
    default this process's), stopped with SIGINT on exit (killed if it does not stop within 30 s),
    and signalled by the kernel if this process dies first (:func:`die_with_parent_preexec`)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=cwd,
                                env=dict(os.environ) if env is None else env, preexec_fn=die_with_parent_preexec())
        try:
            yield proc
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def registration_node_process(log_path: Path, params_files: list[Path] = (), overrides: list[str] = (),
                              env: dict[str, str] | None = None):
    """registration_node (:func:`node_command`) as its own process: :func:`node_process`."""
    return node_process(node_command(list(params_files), list(overrides)), log_path, env)


def run(args: argparse.Namespace) -> int:
    import rclpy
    from rclpy.signals import SignalHandlerOptions

    from s2h_ros.outputs import check_writable
    from s2h_ros.ros.kitti_replay import run_replay
    from s2h_ros.ros.replay import SequenceReplayer

    from s2h_ros.evaluation.methods import METHODS, split_variant

    odometry_methods = [n for n, spec in METHODS.items() if "sequence" in spec.kinds]
    for name in args.baseline:
        if split_variant(name)[0] not in odometry_methods:
            print(f"s2h replay: --baseline {name}: not an odometry method (choose from {', '.join(odometry_methods)})",
                  file=sys.stderr)
            return EXIT_BAD_INPUT
    try:
        sequence = _load_sequence(args)
    except (OSError, ValueError) as exc:
        print(f"s2h replay: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        check_writable(args.out)
    except OSError as exc:
        print(f"s2h replay: cannot write --out {exc.filename}: {exc.strerror}", file=sys.stderr)
        return EXIT_BAD_INPUT
    log_path = args.out / "registration_node.log"
    with registration_node_process(log_path, args.params_file, args.param) as node_proc:
        print(f"started registration_node (pid {node_proc.pid}), log: {log_path}", flush=True)
        # No rclpy signal handlers: SIGINT/SIGTERM stop the replay, which then writes its metrics.
        rclpy.init(args=[], signal_handler_options=SignalHandlerOptions.NO)
        end = -1 if args.frames < 0 else args.start + args.frames
        node = SequenceReplayer(sequence, topic="points", frame_id=getattr(sequence[0], "frame_id", "velodyne"),
                                discovery_timeout=args.discovery_timeout, end=end, start=args.start,
                                rate=args.rate, output_dir=str(args.out))
        code = run_replay(node, prog="s2h replay", baselines=tuple(args.baseline))
    if node_proc.returncode not in (0, -signal.SIGINT):
        print(f"registration_node exited with {node_proc.returncode}; see {log_path}", file=sys.stderr)
    return code
