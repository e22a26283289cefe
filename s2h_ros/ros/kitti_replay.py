"""kitti_replay: publish a KITTI-layout sequence (real or from `s2h simulate`) into
registration_node and write the sequence metrics and a trajectory plot when it ends."""
from __future__ import annotations

import sys
import threading

import rclpy
from rclpy.executors import MultiThreadedExecutor
from rcl_interfaces.msg import ParameterDescriptor

from s2h_ros.ros import messages
from s2h_ros.ros.replay import SequenceReplayer, evaluate_replay

PARAMETERS = {
    "sequence_dir": ("", "KITTI odometry root (with sequence) or one sequence folder (velodyne/, poses.txt, calib.txt)"),
    "sequence": ("", "sequence id under sequence_dir/sequences (empty: sequence_dir is one sequence)"),
    "rate": (10.0, "scans per second; 0: lock-step (next scan when the node has answered)"),
    "start": (0, "first frame"),
    "end": (-1, "one past the last frame (-1: all)"),
    "topic": ("points", "PointCloud2 topic to publish"),
    "frame_id": ("velodyne", "frame of the published clouds"),
    "reliable": (True, "publish with reliable QoS (else sensor-data QoS)"),
    "node_name": ("registration_node", "name of the registration node to listen to"),
    "output_dir": ("results/replay", "where metrics.json, trajectory.png and poses go"),
    "sensor_to_base": ([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0], "same as registration_node's: [x, y, z, qx, qy, qz, qw]"),
    "discovery_timeout": (60.0, "seconds to wait for registration_node to appear"),
}


def main(argv: list[str] | None = None) -> int:
    from s2h_ros.datasets.kitti import KittiSequence

    rclpy.init(args=argv if argv is not None else sys.argv)
    probe = rclpy.create_node("kitti_replay_params")
    values = {}
    for name, (default, text) in PARAMETERS.items():
        values[name] = probe.declare_parameter(name, default, ParameterDescriptor(description=text)).value
    probe.destroy_node()
    if not values["sequence_dir"]:
        print("kitti_replay: parameter sequence_dir is required", file=sys.stderr)
        rclpy.try_shutdown()
        return 2
    try:
        sequence = KittiSequence(values["sequence_dir"], values["sequence"] or None)
    except (OSError, ValueError) as exc:
        print(f"kitti_replay: cannot read {values['sequence_dir']}: {exc}", file=sys.stderr)
        rclpy.try_shutdown()
        return 2
    node = SequenceReplayer(sequence, topic=values["topic"], frame_id=values["frame_id"],
                            node_name=values["node_name"], reliable=values["reliable"])
    return run_replay(node, sequence, values)


def run_replay(node: SequenceReplayer, sequence, values: dict) -> int:
    """Spin ``node`` in the background, replay, evaluate, print the metrics; shuts rclpy down."""
    executor = MultiThreadedExecutor(num_threads=2)
    executor.add_node(node)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    try:
        if not node.wait_for_subscriber(values["discovery_timeout"]):
            node.get_logger().error(f"no {values['node_name']} subscribed to {values['topic']}")
            return 1
        end = None if values["end"] < 0 else values["end"]
        n = (end if end is not None else len(sequence)) - values["start"]
        node.get_logger().info(f"replaying {n} scans at {values['rate'] or 'lock-step'} Hz")
        node.run(rate=values["rate"], start=values["start"], end=end)
        report = evaluate_replay(sequence, node.record, values["output_dir"],
                                 messages.xyzquat_to_matrix(values["sensor_to_base"]))
        import json

        print(json.dumps(report, indent=2, default=float))
        return 0
    finally:
        executor.shutdown()
        node.destroy_node()
        rclpy.try_shutdown()


if __name__ == "__main__":
    sys.exit(main())
