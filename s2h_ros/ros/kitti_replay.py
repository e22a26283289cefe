"""kitti_replay: publish a KITTI-layout sequence (real or from `s2h simulate`) into
registration_node and write the sequence metrics and a trajectory plot when it ends.

    ros2 run s2h_ros kitti_replay --ros-args --params-file config/kitti.yaml -p sequence_dir:=DIR [-p sequence:=00]

Its parameters (s2h_ros.ros.parameters.REPLAY_PARAMETERS) are declared on this node, named
``kitti_replay``, so a parameter file's ``kitti_replay:`` section and ``ros2 param`` reach them.
"""
from __future__ import annotations

import sys
import threading

import rclpy
from rclpy.executors import ExternalShutdownException, MultiThreadedExecutor

from s2h_ros.config import ConfigError
from s2h_ros.ros.replay import SequenceReplayer, evaluate_replay


def main(argv: list[str] | None = None) -> int:
    rclpy.init(args=argv if argv is not None else sys.argv)
    try:
        node = SequenceReplayer()
    except ConfigError as exc:
        print(f"kitti_replay: {exc}", file=sys.stderr)
        rclpy.try_shutdown()
        return 2
    return run_replay(node)


def run_replay(node: SequenceReplayer) -> int:
    """Spin ``node`` in the background, replay, evaluate, print a summary; shuts rclpy down."""
    from s2h_ros.evaluation.report import replay_summary

    settings = node.settings
    executor = MultiThreadedExecutor(num_threads=2)
    executor.add_node(node)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    try:
        if not node.wait_for_subscriber(settings["discovery_timeout"]):
            node.get_logger().error(f"no {settings['node_name']} subscribed to {settings['topic']}")
            return 1
        end = None if settings["end"] < 0 else settings["end"]
        n = (end if end is not None else len(node.sequence)) - settings["start"]
        node.get_logger().info(f"replaying {n} scans at {settings['rate'] or 'lock-step'} Hz")
        node.run(rate=settings["rate"], start=settings["start"], end=end)
        report = evaluate_replay(node.sequence, node.record, settings["output_dir"], node.sensor_to_base)
        print(replay_summary(report), end="")
        print(f"metrics: {settings['output_dir']}/metrics.json")
        return 0
    except (KeyboardInterrupt, ExternalShutdownException):
        return 130
    finally:
        executor.shutdown()
        node.destroy_node()
        rclpy.try_shutdown()


if __name__ == "__main__":
    sys.exit(main())
