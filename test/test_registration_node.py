"""registration_node as a separate process over real DDS, with its default configuration (shipped
FCGF features + S2H): a curved drive replayed into it comes back as a trajectory close to ground
truth, with results, odometry (covariance, twist), a bounded path, markers, the keyframe cloud,
diagnostics and /tf; malformed and empty clouds are answered with failures and do not stop it;
parameters behave as ROS users expect; a sensor extrinsic that arrives late does not move odom.

Faults, each with one outcome: zero, duplicate and backwards stamps and a scan in the odom frame
are refused with a failed result naming the problem and no TF; time going back by a lot (a
looping bag) is a ``time_reset``: tracked again from there, TF on the new timeline, an ERROR in
the diagnostics and the log; start-up failures (device, weights, topic) exit 2 with one stderr
line naming the parameter."""
from __future__ import annotations

import os
import re
import subprocess
import threading
import time

import numpy as np
import pytest
import rclpy
import torch
from conftest import CURVED_DRIVE_FRAMES
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
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
from s2h_ros.benchmarks.robustness import poll_until
from s2h_ros.commands.replay import node_command, registration_node_process
from s2h_ros.evaluation.metrics import sequence_metrics
from s2h_ros.msg import RegistrationResult as RegistrationResultMsg
from s2h_ros.ros import messages
from s2h_ros.ros.pointcloud2 import from_msg, to_msg
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
        self.results: list[RegistrationResultMsg] = []
        node.create_subscription(MarkerArray, "/registration_node/correspondences", self.markers.append, RELIABLE)
        node.create_subscription(DiagnosticArray, "/diagnostics", self.diagnostics.append, 10)
        node.create_subscription(TFMessage, "/tf", self.tf.append, 100)
        node.create_subscription(Odometry, "/registration_node/odometry", self.odometry.append, RELIABLE)
        node.create_subscription(Path, "/registration_node/path", self.paths.append, RELIABLE)
        node.create_subscription(PointCloud2, "/registration_node/keyframe_cloud", self.keyframes.append, TF_STATIC_QOS)
        node.create_subscription(RegistrationResultMsg, "/registration_node/result", self.results.append, RELIABLE)

    def tf_stamps(self) -> list[float]:
        return [messages.stamp_to_sec(t.header.stamp) for m in self.tf for t in m.transforms]


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
        assert "room's scale" not in log_path.read_text()  # a street at 0.3 m voxels: no scale hint
        assert "local map: helper process" in log_path.read_text()  # the node spawned its map's helper

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

        # Still alive and registering: the next real scan (after the bad ones in time) is trusted.
        result = _send(replayer, listener, CURVED_DRIVE_FRAMES - 1, 1002.0)
        assert result.success, result.message
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


def _send(replayer: SequenceReplayer, listener: Listener, i: int, stamp: float, frame_id: str = "velodyne",
          timeout: float = 120.0, extra: dict | None = None) -> RegistrationResultMsg:
    """Scan ``i`` of the replayer's sequence with a stamp and frame (and ``extra`` fields) of the
    test's choosing, and the node's answer to it (one scan in flight at a time, so the next result
    is this one's)."""
    n = len(listener.results)
    replayer.pub_cloud.publish(to_msg(replayer.sequence[i].points, frame_id=frame_id, stamp=messages.stamp_msg(stamp),
                                      extra=extra))
    assert replayer.wait_for(lambda: len(listener.results) > n, timeout), f"no answer to scan {i} at {stamp} s"
    return listener.results[n]


# The module's node sees one timeline: the drive test ends at 1002 s, and each later test starts
# its own track further back in time (EPOCHS), so that its first scan is a time reset, a clean
# start whatever came before (or "initialised" when the test runs alone).
EPOCHS = {"stamps": 900.0, "odom_frame": 800.0, "time_reset": 700.0, "deskew": 500.0}


def _restart(replayer: SequenceReplayer, listener: Listener, epoch: float) -> RegistrationResultMsg:
    """A clean track from scan 0 at ``epoch`` (see EPOCHS)."""
    first = _send(replayer, listener, 0, epoch)
    assert first.success and first.event in ("time_reset", "initialised"), (first.event, first.message)
    return first


@pytest.fixture
def probe(curved_drive, node_process, request):
    """A replayer of the curved drive (for its clouds and pub_cloud) with a Listener, spinning."""
    proc, log_path = node_process
    replayer = SequenceReplayer(curved_drive, name=f"probe_{request.node.name.split('[')[0][-40:]}", topic="points")
    listener = Listener(replayer)
    executor = _spin(replayer)
    assert replayer.wait_for_subscriber(60.0), f"node never subscribed; log:\n{log_path.read_text()}"
    yield replayer, listener
    executor.shutdown()
    replayer.destroy_node()


def _wait_for_file_text(path, pattern: str, timeout: float) -> bool:
    """Poll the node's log (another process writes it) until ``pattern`` matches."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if re.search(pattern, path.read_text()):
            return True
        threading.Event().wait(0.05)
    return re.search(pattern, path.read_text()) is not None


def test_zero_duplicate_and_backwards_stamps_are_refused_without_tf(curved_drive, probe):
    replayer, listener = probe
    t = [float(s.stamp) for s in curved_drive]  # 0.4 s apart
    e = EPOCHS["stamps"]
    _restart(replayer, listener, e)
    ok = _send(replayer, listener, 1, e + t[1])
    assert ok.success, ok.message
    duplicate = _send(replayer, listener, 2, e + t[1])
    backwards = _send(replayer, listener, 2, e + t[1] - 0.2)
    zero = _send(replayer, listener, 2, 0.0)
    for refused in (duplicate, backwards):
        assert not refused.success and "not after the last scan" in refused.message, refused.message
    assert "duplicate" in duplicate.message
    assert not zero.success and zero.message.startswith("stamp is zero"), zero.message
    # Tracking goes on; its TF arrives after any the refused scans could have caused (one /tf
    # publisher: in order), so their absence below is not a matter of waiting longer.
    after = _send(replayer, listener, 2, e + t[2])
    assert after.success, after.message
    assert replayer.wait_for(lambda: e + t[2] in listener.tf_stamps(), 30.0)
    tf_stamps = listener.tf_stamps()
    assert tf_stamps.count(e + t[1]) == 1  # the trusted scan's, not the duplicate's
    assert e + t[1] - 0.2 not in tf_stamps and 0.0 not in tf_stamps


def test_a_scan_in_the_odom_frame_is_refused_and_never_gives_odom_to_odom(curved_drive, probe):
    replayer, listener = probe
    e = EPOCHS["odom_frame"]
    _restart(replayer, listener, e)
    in_odom = _send(replayer, listener, 1, e + 0.4, frame_id="odom")
    assert not in_odom.success and "is the odometry frame" in in_odom.message, in_odom.message
    after = _send(replayer, listener, 1, e + 0.5)
    assert after.success, after.message
    assert replayer.wait_for(lambda: e + 0.5 in listener.tf_stamps(), 30.0)
    assert e + 0.4 not in listener.tf_stamps()
    assert all(t.header.frame_id != t.child_frame_id for m in listener.tf for t in m.transforms)


def test_time_going_back_restarts_tracking_as_a_time_reset(curved_drive, node_process, probe):
    """A bag that loops: the same scans again, 50 s earlier. The first is a time_reset (a new
    segment, trusted as the first of a track), the next are tracked again, and TF follows the new
    timeline; diagnostics turn to ERROR naming it and count the reset; the log has the error."""
    _, log_path = node_process
    replayer, listener = probe
    t = [float(s.stamp) for s in curved_drive]
    e = EPOCHS["time_reset"]
    start = _restart(replayer, listener, e)
    first_loop = [start] + [_send(replayer, listener, k, e + t[k]) for k in (1, 2, 3)]
    assert all(r.success for r in first_loop), [r.message for r in first_loop]
    n_odometry = len(listener.odometry)
    second_loop = [_send(replayer, listener, k, e - 50.0 + t[k]) for k in (0, 1, 2, 3)]

    reset = second_loop[0]
    assert reset.success and reset.event == "time_reset", (reset.event, reset.message)
    assert reset.segment == start.segment + 1 and reset.keyframe_id > first_loop[-1].keyframe_id
    assert all(r.success and r.event == "" and r.segment == reset.segment for r in second_loop[1:]), \
        [(r.event, r.message) for r in second_loop]
    # TF and odometry on the new timeline: odom restarts at the base pose of the reset scan, and
    # the loop's poses are the first loop's again.
    assert replayer.wait_for(lambda: e - 50.0 + t[3] in listener.tf_stamps(), 30.0)
    assert replayer.wait_for(lambda: len(listener.odometry) >= n_odometry + 4, 30.0)
    by_stamp = {messages.stamp_to_sec(m.header.stamp): m.pose.pose.position for m in listener.odometry}
    first, last, last_before = by_stamp[e - 50.0], by_stamp[e - 50.0 + t[3]], by_stamp[e + t[3]]
    assert np.hypot(first.x, first.y) < 1e-6
    assert np.hypot(last.x - last_before.x, last.y - last_before.y) < 0.1, (last, last_before)
    assert np.hypot(last.x, last.y) > 5.0  # it did move: three steps of about 3 m

    def reset_reported() -> bool:
        for d in listener.diagnostics:
            for st in d.status:
                values = {kv.key: kv.value for kv in st.values}
                if (st.level == DiagnosticStatus.ERROR and f"scan {reset.scan_id}: time_reset" in st.message
                        and int(values["resets"]) >= 1):
                    return True
        return False

    assert replayer.wait_for(reset_reported, 10.0), [s.message for d in listener.diagnostics[-5:] for s in d.status]
    assert _wait_for_file_text(log_path, rf"\[ERROR\].*scan {reset.scan_id}: time_reset", 10.0), log_path.read_text()


def test_per_point_times_deskew_a_scan_once_motion_is_known_and_bad_ones_are_not_used(curved_drive, node_process,
                                                                                       probe):
    """Scans with an Ouster time field (``t``, UINT32 ns since the stamp; here within 1 ms, so the
    motion barely moves them): the first two are registered as given (no trusted motion yet), the
    next deskewed; a Velodyne ``time`` field 5 s wide is not one sweep's: registered as given,
    still trusted, and the log says once why."""
    _, log_path = node_process
    replayer, listener = probe
    t = [float(s.stamp) for s in curved_drive]
    e = EPOCHS["deskew"]

    def ouster(k: int) -> dict:
        n = len(curved_drive[k].points)
        return {"t": np.linspace(0, 1_000_000, n).astype(np.uint32)}

    first = _send(replayer, listener, 0, e, extra=ouster(0))
    assert first.success and first.event in ("time_reset", "initialised"), (first.event, first.message)
    results = [first] + [_send(replayer, listener, k, e + t[k], extra=ouster(k)) for k in (1, 2, 3)]
    assert all(r.success for r in results), [r.message for r in results]
    assert [r.deskewed for r in results] == [False, False, True, True]
    assert _wait_for_file_text(log_path, r"per-point times in field 't': scans are deskewed", 10.0)
    n = len(curved_drive[4].points)
    bad = _send(replayer, listener, 4, e + t[4], extra={"time": np.linspace(0.0, 5.0, n).astype(np.float32)})
    assert bad.success and not bad.deskewed, bad.message
    assert _wait_for_file_text(log_path, r"per-point times in field 'time': not used \(per-point times span", 10.0), \
        log_path.read_text()


@pytest.mark.parametrize("override, parameter, why", [
    ("registration.device:=cuda", "registration.device", "CUDA is not available"),
    ("registration.weights:=/nonexistent/weights.pt", "registration.weights", "checkpoint not found"),
    ("registration.weights:={garbage}", "registration.weights", "cannot read checkpoint"),
    ("cloud_topic:=bad topic!", "cloud_topic", "is not a valid topic name"),
    ("base_frame:=odom", "base_frame", "is odom_frame too"),
], ids=["device", "missing-weights", "garbage-weights", "topic", "base-is-odom"])
def test_start_up_failures_exit_2_with_one_line_naming_the_parameter(ros_domain, tmp_path, override, parameter, why):
    if "cuda" in override and torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(np.random.default_rng(0).bytes(4096))
    out = subprocess.run(node_command([], [override.format(garbage=garbage)]), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith(f"registration_node: invalid configuration: parameter {parameter}"), lines[0]
    assert why in lines[0], lines[0]


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
            # The node's /tf_static reader must have discovered this publisher (seconds on a loaded
            # machine), or the transform reaches it scans later than it is sent.
            assert poll_until(lambda: static.get_subscription_count() > 0, 60.0)
            replayer.run(rate=0.0, end=3, answer_timeout=120.0)
            static.publish(TFMessage(transforms=[messages.transform_stamped(
                extrinsic, messages.stamp_msg(0.0), "base_link", "velodyne")]))
            # The transform reaches the node's TF reader some time after it is sent (later still on
            # a loaded machine): scans go on, four at least, until the node has used it.
            end = 3
            while end < 7 or ("extrinsic base_link <- velodyne from TF" not in (tmp_path / "node.log").read_text()
                              and end < len(curved_drive)):
                replayer.run(rate=0.0, start=end, end=end + 1, answer_timeout=120.0)
                end += 1
        finally:
            executor.shutdown()
            replayer.destroy_node()
            rclpy.try_shutdown(context=context)
        log = (tmp_path / "node.log").read_text()
    assert "extrinsic base_link <- velodyne from TF" in log, log
    record = replayer.record
    poses = [record.poses[k] for k in record.stamps_ns]
    assert len(poses) == end, record.results
    gt = curved_drive.poses[record.indices]
    E, Einv = extrinsic, geometry.invert_transform(extrinsic)
    errors = {"sensor": [], "through extrinsic": []}
    for k in range(1, end):
        step = geometry.invert_transform(poses[k - 1]) @ poses[k]
        sensor_step = geometry.invert_transform(gt[k - 1]) @ gt[k]
        errors["sensor"].append(np.linalg.norm(step[:3, 3] - sensor_step[:3, 3]))
        errors["through extrinsic"].append(np.linalg.norm(step[:3, 3] - (E @ sensor_step @ Einv)[:3, 3]))
    # Before the extrinsic is known the base moves as the sensor; from the scan it is first used on
    # as the sensor seen through it, with no jump at the switch: every step is one of the two, to
    # centimetres. /tf_static and the scans travel on different topics (and the node's executor
    # and worker are different threads), so which scan first uses it depends on timing: 3 at the
    # earliest, and some scan of the run.
    matches = [("sensor" if a < 0.05 else "") + ("extrinsic" if b < 0.05 else "")
               for a, b in zip(errors["sensor"], errors["through extrinsic"])]
    assert matches[:2] == ["sensor", "sensor"], errors
    assert "extrinsic" in matches, errors
    switch = matches.index("extrinsic") + 1
    assert switch >= 3 and all(m == "sensor" for m in matches[:switch - 1]), errors
    assert all(m == "extrinsic" for m in matches[switch - 1:]), errors


def test_wrong_parameter_type_fails_at_start_up_with_a_clear_message(ros_domain):
    cmd = node_command([], ["registration.voxel_size:=fast"])
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "registration.voxel_size" in out.stderr


def test_out_of_range_parameter_fails_at_start_up(ros_domain):
    out = subprocess.run(node_command([], ["registration.k:=0"]), capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "registration.k" in out.stderr
