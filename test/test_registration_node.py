"""registration_node as a separate process over real DDS, with its default configuration (shipped
FCGF features + S2H): a curved drive replayed into it comes back as a trajectory close to ground
truth, with results, odometry (covariance, twist), a bounded path, markers, the keyframe cloud,
diagnostics and /tf; malformed and empty clouds are answered with failures and do not stop it;
parameters behave as ROS users expect; a sensor extrinsic that arrives late does not move odom."""
from __future__ import annotations

import os
import subprocess
import threading

import numpy as np
import pytest
import rclpy
from conftest import CURVED_DRIVE_FRAMES
from diagnostic_msgs.msg import DiagnosticArray
from nav_msgs.msg import Odometry, Path
from rcl_interfaces.srv import ListParameters, SetParameters
from rclpy.context import Context
from rclpy.executors import SingleThreadedExecutor
from rclpy.parameter import Parameter
from sensor_msgs.msg import PointCloud2, PointField
from std_msgs.msg import Header
from tf2_msgs.msg import TFMessage
from visualization_msgs.msg import Marker, MarkerArray

from s2h_ros import geometry
from s2h_ros.commands.replay import node_command, registration_node_process
from s2h_ros.evaluation.metrics import sequence_metrics
from s2h_ros.ros import messages
from s2h_ros.ros.pointcloud2 import from_msg
from s2h_ros.ros.replay import RELIABLE, SequenceReplayer, evaluate_replay
from s2h_ros.ros.tf import TF_STATIC_QOS

ATE_BOUND_M = 0.25
# Not method settings: diagnostics often, a short path, and a double given as an integer.
NODE_PARAMS = ["diagnostics_period:=0.2", "path_max_length:=5", "odometry.keyframe_distance:=5"]


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
    """Collects what the node publishes besides odometry poses/results (the replayer records those)."""

    def __init__(self, node) -> None:
        self.markers: list[MarkerArray] = []
        self.diagnostics: list[DiagnosticArray] = []
        self.tf: list[TFMessage] = []
        self.odometry: list[Odometry] = []
        self.paths: list[Path] = []
        self.keyframes: list[PointCloud2] = []
        node.create_subscription(MarkerArray, "/registration_node/correspondences", self.markers.append, RELIABLE)
        node.create_subscription(DiagnosticArray, "/diagnostics", self.diagnostics.append, 10)
        node.create_subscription(TFMessage, "/tf", self.tf.append, 100)
        node.create_subscription(Odometry, "/registration_node/odometry", self.odometry.append, RELIABLE)
        node.create_subscription(Path, "/registration_node/path", self.paths.append, RELIABLE)
        node.create_subscription(PointCloud2, "/registration_node/keyframe_cloud", self.keyframes.append, TF_STATIC_QOS)


def _spin(node, context=None):
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    threading.Thread(target=executor.spin, daemon=True).start()
    return executor


def _cloud(fields: list[PointField], n: int, point_step: int, stamp: float) -> PointCloud2:
    msg = PointCloud2(header=Header(stamp=messages.stamp_msg(stamp), frame_id="velodyne"), height=1, width=n,
                      fields=fields, point_step=point_step, row_step=n * point_step, is_dense=True)
    msg.data = bytes(n * point_step)
    return msg


def _baseline_ates(drive) -> tuple[float, float]:
    """ATE of a node that publishes identity, and of one that extrapolates the first step."""
    gt = drive.poses
    gt = np.einsum("ij,njk->nik", geometry.invert_transform(gt[0]), gt)
    identity = np.repeat(np.eye(4)[None], len(gt), axis=0)
    step = geometry.invert_transform(gt[0]) @ gt[1]
    cv = [gt[0]]
    for _ in range(1, len(gt)):
        cv.append(cv[-1] @ step)
    return sequence_metrics(gt, identity)["ate_rmse_m"], sequence_metrics(gt, np.stack(cv))["ate_rmse_m"]


def test_replayed_curved_drive_tracks_ground_truth_and_survives_bad_clouds(curved_drive, node_process, tmp_path):
    proc, log_path = node_process
    drive = curved_drive
    identity_ate, cv_ate = _baseline_ates(drive)
    assert min(identity_ate, cv_ate) > 10 * ATE_BOUND_M  # the bound means something on this drive
    replayer = SequenceReplayer(drive, name="test_replay", topic="points")
    listener = Listener(replayer)
    executor = _spin(replayer)
    try:
        assert replayer.wait_for_subscriber(60.0), f"node never subscribed; log:\n{log_path.read_text()}"
        replayer.run(rate=0.0, answer_timeout=120.0)
        report = evaluate_replay(drive, replayer.record, tmp_path)

        # Every scan answered, the drive tracked through the turn.
        assert report["scans_answered"] == CURVED_DRIVE_FRAMES, log_path.read_text()
        assert report["scans_trusted"] >= CURVED_DRIVE_FRAMES - 1, report
        assert report["metrics"]["ate_rmse_m"] < ATE_BOUND_M, report
        assert (tmp_path / "trajectory.png").stat().st_size > 1000

        # Odometry: a pose covariance from the registration (not zeros), and the twist.
        assert replayer.wait_for(lambda: len(listener.odometry) >= report["scans_trusted"], 10.0)
        gt = drive.poses
        stamps_s = [messages.stamp_to_sec(m.header.stamp) for m in listener.odometry]
        for k in range(2, len(listener.odometry)):
            msg = listener.odometry[k]
            cov = np.array(msg.pose.covariance).reshape(6, 6)
            np.testing.assert_allclose(cov, cov.T, atol=1e-12)
            assert np.linalg.eigvalsh(cov).min() > 0
            assert 0 < np.sqrt(cov[0, 0]) < 0.5, cov.diagonal()
            twist_cov = np.array(msg.twist.covariance).reshape(6, 6)
            assert np.linalg.eigvalsh(twist_cov).min() > 0
        k = 5  # on the straight before the turn: |v| = step length / time step
        i = replayer.record.indices[k]
        gt_speed = np.linalg.norm(gt[i, :3, 3] - gt[i - 1, :3, 3]) / (stamps_s[k] - stamps_s[k - 1])
        v = listener.odometry[k].twist.twist.linear
        assert np.hypot(np.hypot(v.x, v.y), v.z) == pytest.approx(gt_speed, rel=0.1)
        assert v.x > 0.9 * gt_speed  # forward, in the base frame

        # The path is bounded (path_max_length:=5) and ends at the latest pose.
        assert replayer.wait_for(lambda: len(listener.paths) >= report["scans_trusted"], 10.0)
        assert max(len(p.poses) for p in listener.paths) == 5
        assert listener.paths[-1].poses[-1].header.stamp == listener.odometry[-1].header.stamp

        # Markers: correspondence lines; the keyframe as one PointCloud2 in odom, once per keyframe.
        assert replayer.wait_for(lambda: any(
            m.type == Marker.LINE_LIST and len(m.points) > 0 for a in listener.markers for m in a.markers), 10.0)
        assert replayer.wait_for(lambda: len(listener.keyframes) >= 2, 10.0)
        assert all(k.header.frame_id == "odom" for k in listener.keyframes)
        assert len(from_msg(listener.keyframes[-1])[0]) > 1000
        keyframes_used = {r["keyframe_id"] for r in replayer.record.results.values() if r["success"]}
        assert len(listener.keyframes) == len(keyframes_used)

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
        key = replayer.publish_scan(CURVED_DRIVE_FRAMES - 1)
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


def _call(node, client, request, timeout: float = 30.0):
    assert client.wait_for_service(timeout_sec=timeout), f"{client.srv_name} not available"
    future = client.call_async(request)
    done = threading.Event()
    future.add_done_callback(lambda _: done.set())
    assert done.wait(timeout), f"{client.srv_name}: no answer"
    return future.result()


def test_parameters_over_dds_are_listed_typed_and_read_only_where_fixed(node_process):
    """What `ros2 param list / get / set` see: every parameter, the typed override, and a
    rejected set that says why."""
    probe = rclpy.create_node("param_probe")
    executor = _spin(probe)
    try:
        listed = _call(probe, probe.create_client(ListParameters, "/registration_node/list_parameters"),
                       ListParameters.Request()).result.names
        assert {"registration.voxel_size", "odometry.keyframe_distance", "max_markers", "sensor_to_base"} <= set(listed)
        setter = probe.create_client(SetParameters, "/registration_node/set_parameters")
        fixed = _call(probe, setter, SetParameters.Request(
            parameters=[Parameter("registration.voxel_size", value=1.0).to_parameter_msg()])).results[0]
        assert not fixed.successful and "read-only" in fixed.reason
        live = _call(probe, setter, SetParameters.Request(
            parameters=[Parameter("max_markers", value=50).to_parameter_msg()])).results[0]
        assert live.successful, live.reason
        wrong = _call(probe, setter, SetParameters.Request(
            parameters=[Parameter("max_markers", value="lots").to_parameter_msg()])).results[0]
        assert not wrong.successful and wrong.reason
    finally:
        executor.shutdown()
        probe.destroy_node()


def test_a_late_extrinsic_on_tf_static_does_not_move_odom(curved_drive, ros_domain, tmp_path):
    """/tf_static gives base_link <- velodyne only after three scans (the parameter said identity):
    the published base poses stay continuous and later base motion is seen through the new
    extrinsic (REP-105: odom never jumps)."""
    extrinsic = geometry.pose_matrix([1.2, 0.0, 1.7], [0.0, 0.0, np.sin(np.pi / 4), np.cos(np.pi / 4)])
    # A DDS domain of its own: the module's node neither sees these scans nor answers them.
    domain = (int(os.environ["ROS_DOMAIN_ID"]) + 1) % 232
    env = dict(os.environ, ROS_DOMAIN_ID=str(domain))
    context = Context()
    rclpy.init(context=context, domain_id=domain)
    with registration_node_process(tmp_path / "node.log", overrides=NODE_PARAMS, env=env):
        replayer = SequenceReplayer(curved_drive, name="late_tf_replay", context=context, base_frame="")
        static = replayer.create_publisher(TFMessage, "/tf_static", TF_STATIC_QOS)
        executor = _spin(replayer, context)
        try:
            assert replayer.wait_for_subscriber(60.0), (tmp_path / "node.log").read_text()
            replayer.run(rate=0.0, end=3, answer_timeout=120.0)
            static.publish(TFMessage(transforms=[messages.transform_stamped(
                extrinsic, messages.stamp_msg(0.0), "base_link", "velodyne")]))
            replayer.run(rate=0.0, start=3, end=7, answer_timeout=120.0)
        finally:
            executor.shutdown()
            replayer.destroy_node()
            rclpy.try_shutdown(context=context)
        log = (tmp_path / "node.log").read_text()
    assert "extrinsic base_link <- velodyne from TF" in log, log
    record = replayer.record
    poses = [record.poses[k] for k in record.stamps_ns]
    assert len(poses) == 7, record.results
    gt = curved_drive.poses[record.indices]
    E, Einv = extrinsic, geometry.invert_transform(extrinsic)
    errors = {"sensor": [], "through extrinsic": []}
    for k in range(1, 7):
        step = geometry.invert_transform(poses[k - 1]) @ poses[k]
        sensor_step = geometry.invert_transform(gt[k - 1]) @ gt[k]
        errors["sensor"].append(np.linalg.norm(step[:3, 3] - sensor_step[:3, 3]))
        errors["through extrinsic"].append(np.linalg.norm(step[:3, 3] - (E @ sensor_step @ Einv)[:3, 3]))
    # Before the extrinsic is known the base moves as the sensor; from the scan it is first used on
    # as the sensor seen through it (/tf_static and the scans travel on different topics, so that
    # is scan 3 or 4), with no jump at the switch: every step is one of the two, to centimetres.
    matches = [("sensor" if a < 0.05 else "") + ("extrinsic" if b < 0.05 else "")
               for a, b in zip(errors["sensor"], errors["through extrinsic"])]
    assert matches[:2] == ["sensor", "sensor"], errors
    switch = matches.index("extrinsic") + 1
    assert switch in (3, 4) and all(m == "extrinsic" for m in matches[switch - 1:]), errors


def test_wrong_parameter_type_fails_at_start_up_with_a_clear_message(ros_domain):
    cmd = node_command([], ["registration.voxel_size:=fast"])
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "registration.voxel_size" in out.stderr


def test_out_of_range_parameter_fails_at_start_up(ros_domain):
    out = subprocess.run(node_command([], ["registration.k:=0"]), capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "registration.k" in out.stderr
