"""kitti_replay: publish a KITTI-layout sequence (real or from `s2h simulate`) into
registration_node and write the sequence metrics and a trajectory plot when it ends.

    ros2 run s2h_ros kitti_replay --ros-args --params-file config/kitti.yaml -p sequence_dir:=DIR [-p sequence:=00]

Its parameters (s2h_ros.ros.parameters.REPLAY_PARAMETERS) are declared on this node, named
``kitti_replay``, so a parameter file's ``kitti_replay:`` section and ``ros2 param`` reach them.

Exit status: 0 done; 1 no registration_node appeared; 2 bad parameters, an ``output_dir`` that
cannot be written (checked first), or an output file that cannot be written at the end (a full
disk: the summary still goes to stdout, the error names the file); 130 / 143 stopped by SIGINT /
SIGTERM, after writing the metrics of the scans answered until then (s2h_ros.interrupts).
rclpy's own SIGINT/SIGTERM handlers are not installed: they would shut the context down under
the replay's feet.
"""
from __future__ import annotations

import sys
import threading

import rclpy
from rclpy.executors import MultiThreadedExecutor
from rclpy.signals import SignalHandlerOptions

from s2h_ros.config import ConfigError
from s2h_ros.interrupts import exit_status, on_stop_signals, signal_name
from s2h_ros.outputs import check_writable
from s2h_ros.ros.replay import AUTO_RATE, SequenceReplayer, baseline_odometry, replay_report, write_replay_outputs

EXIT_OK, EXIT_NO_NODE, EXIT_BAD_INPUT = 0, 1, 2


def main(argv: list[str] | None = None) -> int:
    rclpy.init(args=argv if argv is not None else sys.argv, signal_handler_options=SignalHandlerOptions.NO)
    try:
        node = SequenceReplayer()
    except ConfigError as exc:
        print(f"kitti_replay: {exc}", file=sys.stderr)
        rclpy.try_shutdown()
        return EXIT_BAD_INPUT
    try:  # before the replay, not after it
        check_writable(node.settings["output_dir"])
    except OSError as exc:
        print(f"kitti_replay: cannot write output_dir {exc.filename}: {exc.strerror}", file=sys.stderr)
        node.destroy_node()
        rclpy.try_shutdown()
        return EXIT_BAD_INPUT
    return run_replay(node)


def run_replay(node: SequenceReplayer, prog: str = "kitti_replay", baselines: tuple[str, ...] = ()) -> int:
    """Spin ``node`` in the background, replay, evaluate (``baselines``: other odometry methods,
    e.g. ``kiss_icp``, run offline on the same scans), print a summary, write the outputs; the
    exit status (see the module text). Shuts rclpy down."""
    executor = MultiThreadedExecutor(num_threads=2)
    executor.add_node(node)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    stopped_by: list[int] = []

    def stop(signum: int) -> None:
        stopped_by.append(signum)
        node.request_stop()

    try:
        with on_stop_signals(stop):
            if not _replay(node) and not stopped_by:
                return EXIT_NO_NODE
            status = _report(node, prog, signal_name(stopped_by[0]) if stopped_by else None, baselines)
        return exit_status(stopped_by[0]) if stopped_by else status
    finally:
        executor.shutdown()
        # spin() returns once the executor is shut down; a daemon thread still inside rcl's wait
        # when the interpreter exits aborts the process ("terminate called without an active
        # exception", seen once in CI after all outputs were written)
        spinner.join(timeout=10.0)
        node.destroy_node()
        rclpy.try_shutdown()


def _replay(node: SequenceReplayer) -> bool:
    """Wait for registration_node and publish the scans; False if it never appeared."""
    settings = node.settings
    if not node.wait_for_subscriber(settings["discovery_timeout"]):
        if not node.stop_requested:
            node.get_logger().error(f"no {settings['node_name']} subscribed to {settings['topic']}")
        return False
    end = None if settings["end"] < 0 else settings["end"]
    n = (end if end is not None else len(node.sequence)) - settings["start"]
    how = {0.0: "lock-step", AUTO_RATE: "the rate this machine sustains"}.get(settings["rate"], f"{settings['rate']} Hz")
    node.get_logger().info(f"replaying {n} scans at {how}")
    node.run(rate=settings["rate"], start=settings["start"], end=end)
    return True


def _report(node: SequenceReplayer, prog: str, interrupted: str | None, baselines: tuple[str, ...] = ()) -> int:
    """Metrics of what was answered: written to ``output_dir`` and summarised on stdout (also when
    the files cannot be written: then one stderr line names the file and the status is 2)."""
    from s2h_ros.evaluation.report import replay_summary

    out_dir = node.settings["output_dir"]
    report, est, gt = replay_report(node.sequence, node.record, node.sensor_to_base, interrupted=interrupted)
    others = {}
    if baselines and len(node.record.indices) >= 2 and gt is not None:
        report["baselines"], others = baseline_odometry(node.sequence, node.record, list(baselines))
    error = None
    try:
        write_replay_outputs(out_dir, report, est, gt, f"{getattr(node.sequence, 'name', 'sequence')}: top view",
                             others)
    except OSError as exc:
        error = f"{prog}: cannot write {exc.filename or out_dir}: {exc.strerror or exc}"
    print(replay_summary(report), end="", flush=True)
    if interrupted:
        print(f"{prog}: stopped by {interrupted} after {report['scans_published']} scans published; "
              f"metrics of the {report['scans_answered']} answered", file=sys.stderr)
    if error:
        print(error, file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"metrics: {out_dir}/metrics.json")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
