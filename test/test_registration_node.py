"""registration_node as a separate process over real DDS: a synthetic drive replayed into it
comes back as a trajectory close to ground truth, with results, markers, diagnostics and /tf;
malformed and empty clouds are answered with failures and do not stop it."""
from __future__ import annotations

import os
import subprocess
import threading

import pytest
import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.executors import SingleThreadedExecutor
from sensor_msgs.msg import PointCloud2, PointField
from std_msgs.msg import Header
from tf2_msgs.msg import TFMessage
from visualization_msgs.msg import Marker, MarkerArray

from s2h_ros.commands.replay import node_command, registration_node_process
from s2h_ros.ros import messages
from s2h_ros.ros.replay import RELIABLE, SequenceReplayer, evaluate_replay

N_FRAMES = 8
# A 16-beam sensor and 0.5 m voxels keep each registration well under a second on 2 cores.
NODE_PARAMS = [
    "registration.voxel_size:=0.5",
    "registration.inlier_distance:=1.0",
    "registration.matcher:=mutual_nn",
    "diagnostics_period:=0.2",
]


@pytest.fixture(scope="module")
def drive(vlp16_drive):
    assert len(vlp16_drive) == N_FRAMES
    return vlp16_drive


@pytest.fixture(scope="module")
def ros_domain():
    # Own domain id per test module; scripts/test.sh also isolates the network namespace.
    os.environ["ROS_DOMAIN_ID"] = str(150 + os.getpid() % 80)
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    rclpy.init()
    yield
    rclpy.try_shutdown()


@pytest.fixture(scope="module")
def node_process(ros_domain, tmp_path_factory):
    log_path = tmp_path_factory.mktemp("node") / "registration_node.log"
    with registration_node_process(log_path, overrides=NODE_PARAMS) as proc:
        yield proc, log_path


class Listener:
    """Collects what the node publishes besides odometry/results (those the replayer records)."""

    def __init__(self, node) -> None:
        self.markers: list[MarkerArray] = []
        self.diagnostics: list[DiagnosticArray] = []
        self.tf: list[TFMessage] = []
        node.create_subscription(MarkerArray, "/registration_node/correspondences", self.markers.append, RELIABLE)
        node.create_subscription(DiagnosticArray, "/diagnostics", self.diagnostics.append, 10)
        node.create_subscription(TFMessage, "/tf", self.tf.append, 100)


def _cloud(fields: list[PointField], n: int, point_step: int, stamp: float, data: bytes | None = None) -> PointCloud2:
    msg = PointCloud2(header=Header(stamp=messages.sec_to_stamp(stamp), frame_id="velodyne"), height=1, width=n,
                      fields=fields, point_step=point_step, row_step=n * point_step, is_dense=True)
    msg.data = data if data is not None else bytes(n * point_step)
    return msg


def test_replayed_drive_tracks_ground_truth_and_survives_bad_clouds(drive, node_process, tmp_path):
    proc, log_path = node_process
    replayer = SequenceReplayer(drive, topic="points", name="test_replay")
    listener = Listener(replayer)
    executor = SingleThreadedExecutor()
    executor.add_node(replayer)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    try:
        assert replayer.wait_for_subscriber(60.0), f"node never subscribed; log:\n{log_path.read_text()}"
        replayer.run(rate=0.0, answer_timeout=120.0)
        report = evaluate_replay(drive, replayer.record, tmp_path)

        # Every scan answered, the drive tracked: ATE well under the 0.5 m voxel.
        assert report["scans_answered"] == N_FRAMES, log_path.read_text()
        assert report["scans_trusted"] >= N_FRAMES - 1
        assert report["metrics"]["ate_rmse_m"] < 0.25, report
        assert (tmp_path / "trajectory.png").stat().st_size > 1000

        # Markers: correspondence lines and the keyframe cloud for trusted scans.
        assert replayer.wait_for(lambda: any(
            m.type == Marker.LINE_LIST and len(m.points) > 0 for a in listener.markers for m in a.markers), 10.0)
        # TF: odom -> base_link for trusted scans only.
        assert replayer.wait_for(lambda: len(listener.tf) >= report["scans_trusted"], 10.0)
        assert {(t.header.frame_id, t.child_frame_id) for m in listener.tf for t in m.transforms} == {("odom", "base_link")}
        tf_stamps = {messages.stamp_to_sec(t.header.stamp) for m in listener.tf for t in m.transforms}

        # A cloud without z and an empty cloud: failures, no TF, node keeps going.
        xy_only = [PointField(name="x", offset=0, datatype=PointField.FLOAT32, count=1),
                   PointField(name="y", offset=4, datatype=PointField.FLOAT32, count=1)]
        xyz = xy_only + [PointField(name="z", offset=8, datatype=PointField.FLOAT32, count=1)]
        bad_stamps = (1000.0, 1001.0)
        n_results = len(replayer.record.results)
        replayer.pub_cloud.publish(_cloud(xy_only, 100, 8, bad_stamps[0]))
        assert replayer.wait_for(lambda: len(replayer.record.results) >= n_results + 1, 30.0)
        replayer.pub_cloud.publish(_cloud(xyz, 0, 12, bad_stamps[1]))
        assert replayer.wait_for(lambda: len(replayer.record.results) >= n_results + 2, 30.0)
        bad = [r for k, r in replayer.record.results.items() if k / 1e9 in bad_stamps]
        assert len(bad) == 2 and not any(r["success"] for r in bad)
        assert any("z" in r["message"] for r in bad), bad

        # Still alive and registering: the next real scan is answered.
        key = replayer.publish_scan(N_FRAMES - 1)
        assert replayer.wait_for(lambda: key in replayer.record.results, 60.0)
        assert proc.poll() is None, log_path.read_text()
        tf_stamps_after = {messages.stamp_to_sec(t.header.stamp) for m in listener.tf for t in m.transforms}
        assert not (tf_stamps_after - tf_stamps) & set(bad_stamps)

        # Diagnostics report the counters.
        assert replayer.wait_for(lambda: any(
            int({kv.key: kv.value for kv in s.values}.get("bad_input", 0)) >= 1
            for d in listener.diagnostics for s in d.status), 10.0), listener.diagnostics[-1:]
    finally:
        executor.shutdown()
        replayer.destroy_node()


def test_wrong_parameter_type_fails_at_start_up_with_a_clear_message(ros_domain):
    cmd = node_command([], ["registration.voxel_size:=fast"])
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "registration.voxel_size" in out.stderr + out.stdout


def test_out_of_range_parameter_fails_at_start_up(ros_domain):
    out = subprocess.run(node_command([], ["registration.k:=0"]), capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "registration.k" in out.stderr + out.stdout
