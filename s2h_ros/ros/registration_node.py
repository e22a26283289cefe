"""registration_node: online scan-to-keyframe alignment with SHM_DGR.

The subscription callback only offers the newest scan to a one-slot buffer (a scan still waiting
there when a newer one arrives is dropped and counted), so the executor never blocks on
registration; a preparer thread converts the next scan and computes its voxels and features
(``KeyframeOdometry.prepare``) while a worker thread registers the scan before it and publishes
(s2h_ros.handover). Trusted scans publish TF
(odom -> base_link, or odom -> sensor frame without a base frame), nav_msgs/Odometry with the
registration's pose covariance and the twist, and a bounded nav_msgs/Path; every scan publishes
s2h_ros/RegistrationResult and correspondence markers; each new keyframe goes out once as a
latched PointCloud2 (``~/keyframe_cloud``); diagnostics report rate, latency, drops and failures.
A scan with per-point times (a field ``t``, ``time``, ``timestamp``, ``time_stamp`` or
``offset_time``: s2h_ros.deskew) is motion-compensated to its stamp with the odometry's motion
prior before it is registered (``odometry.deskew``); its result says whether it was.
The base <- sensor extrinsic comes from the static TF tree when it has one (tf2, or /tf_static
here), else from the ``sensor_to_base`` parameter; odom stays continuous when it changes
(s2h_ros.ros.frames).

Start-up: every failure is one stderr line naming the parameter and exit status 2 (a bad value,
type or unknown name; ``registration.device`` naming a device that is not there;
``registration.weights`` missing or not a checkpoint, loaded at start-up for that reason;
``cloud_topic`` not a topic name; an empty ``odom_frame`` or a ``base_frame`` equal to it).

Scans refused before registration, each answered by a failed RegistrationResult naming the
problem and counted as ``bad_input`` (no TF, no odometry): a zero stamp (sec 0, nanosec 0: a
driver that sets no time), a ``frame_id`` equal to the odom frame (a cloud already in odom; it
would publish odom -> odom), a malformed PointCloud2. Stamp order is the odometry's
(s2h_ros.odometry): a stamp not after the last scan's (a duplicate, a reordering) is refused
there, and one more than ``odometry.max_gap`` seconds earlier (a looping bag) restarts it, event
``time_reset``. The node then starts a new timeline: odom is again the base frame at that scan,
the path is cleared, and TF, which otherwise never goes out with a stamp not after the last one
published, follows the new stamps.

Continuity: every result carries the odometry's ``segment`` and ``event``. ``new_segment`` and
``time_reset`` (continuity lost) are logged as errors naming the scan, counted as ``resets`` in
the diagnostics and turn its status to ERROR for the period in which they happened;
``relocalised`` is a warning.
"""
from __future__ import annotations

import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np
import rclpy
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from nav_msgs.msg import Odometry, Path
from rclpy.clock import Clock, ClockType
from rclpy.exceptions import InvalidTopicNameException
from rclpy.executors import ExternalShutdownException
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from sensor_msgs.msg import PointCloud2
from std_msgs.msg import Header
from visualization_msgs.msg import MarkerArray

from s2h_ros import geometry, stamps
from s2h_ros.cloud import RegistrationError
from s2h_ros.config import ConfigError, cpu_threads, use_cpu_threads
from s2h_ros.handover import Failed, Handover, limit_malloc_arenas
from s2h_ros.msg import RegistrationResult as RegistrationResultMsg
from s2h_ros.odometry import KeyframeOdometry, OdometryStep, PreparedScan
from s2h_ros.pipeline import Registrar
from s2h_ros.pointcloud2 import PointCloud2Error, read_xyz_times
from s2h_ros.ros import messages
from s2h_ros.ros.frames import OdomFrame
from s2h_ros.ros.parameters import declare_and_read, pose_parameter
from s2h_ros.ros.pointcloud2 import from_msg, to_msg
from s2h_ros.ros.tf import ExtrinsicLookup, TfPublisher
from s2h_ros.scene_scale import ScaleCheck

LATCHED = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL,
                     history=HistoryPolicy.KEEP_LAST)


@dataclass(eq=False)
class _Scan:
    """One received scan on its way from the preparer to the worker."""

    msg: PointCloud2
    received: float  # monotonic receipt time
    scan_id: int
    refusal: str | None = None  # why it is not registered (header, malformed message)
    prepared: PreparedScan | None = None
    error: BaseException | None = None  # a bug while preparing it


# Odometry events after which the published poses are not continuous with the ones before.
CONTINUITY_LOST = ("new_segment", "time_reset")


class RegistrationNode(Node):
    def __init__(self, **kwargs) -> None:
        super().__init__("registration_node", **kwargs)
        self.settings = declare_and_read(self)
        p = self.settings.node
        self.odom_frame, self.base_frame = _frame_parameters(p)
        self.frames = OdomFrame(pose_parameter("sensor_to_base", p["sensor_to_base"]), has_base=bool(self.base_frame))
        use_cpu_threads(cpu_threads(int(p["cpu_threads"]), self.settings.registration.device))
        self.registrar, features = _start_registrar(self.settings.registration)
        self.odometry = KeyframeOdometry(self.settings.registration, self.settings.odometry, self.registrar)
        self._create_interfaces(p)
        self.path_poses: deque = deque(maxlen=int(p["path_max_length"]))  # bounded: O(1) per scan
        self._last_tf_ns: int | None = None  # stamp of the last TF sent (TF only goes forward in time)
        self._segment = 0  # the odometry's segment at the last scan it saw

        self.stats = {"received": 0, "processed": 0, "dropped": 0, "failed": 0, "bad_input": 0, "keyframes": 0,
                      "resets": 0}
        self._lost_lock = threading.Lock()
        self._lost_since_diagnostics: list[str] = []  # "scan N: event" since the last diagnostics
        self._latencies = deque(maxlen=200)
        self._done_times = deque(maxlen=50)
        self._scan_id = 0  # the preparer's: scans are numbered in the order they are taken
        self._time_fields: set[tuple[str, bool]] = set()  # (field, unusable) already logged: once each
        self._scale = ScaleCheck(self.odometry.registrar.config.voxel_size)  # the preparer's: a hint, once
        # The newest scan, prepared on one thread while the one before it is registered on another.
        self.handover = Handover(self._prepare, self._answer, name="s2h_registration", ahead=bool(p["prepare_ahead"]),
                                 overlap=float(p["prepare_overlap"]))
        # Wall-clock timer: diagnostics keep coming when a paused bag stops /clock.
        self.create_timer(float(p["diagnostics_period"]), self._publish_diagnostics,
                          clock=Clock(clock_type=ClockType.STEADY_TIME))
        self.get_logger().info(
            f"registering {p['cloud_topic']} ({p['qos']} QoS) on {self.settings.registration.device}, "
            f"features={features}, matcher={self.settings.registration.matcher}, local map: "
            f"{self.odometry.local_map.where() if self.odometry.local_map is not None else 'none'}"
        )

    def _create_interfaces(self, p: dict[str, Any]) -> None:
        """Subscription, publishers, TF; ConfigError naming ``cloud_topic`` when it is not a topic name."""
        reliable = QoSProfile(depth=5, reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_LAST)
        qos = qos_profile_sensor_data if p["qos"] == "sensor_data" else reliable
        try:
            self.sub = self.create_subscription(PointCloud2, p["cloud_topic"], self._on_cloud, qos)
        except InvalidTopicNameException as exc:  # rclpy's text: "Invalid topic name: why:\n  'name'\n  ^"
            why = str(exc).splitlines()[0].rstrip(":").split(": ", 1)[-1]
            raise ConfigError(f"parameter cloud_topic: {p['cloud_topic']!r} is not a valid topic name: {why}") from None
        self.pub_result = self.create_publisher(RegistrationResultMsg, "~/result", 10)
        self.pub_odom = self.create_publisher(Odometry, "~/odometry", 10)
        self.pub_path = self.create_publisher(Path, "~/path", 1)
        self.pub_markers = self.create_publisher(MarkerArray, "~/correspondences", 1)
        self.pub_keyframe = self.create_publisher(PointCloud2, "~/keyframe_cloud", LATCHED)
        self._published_keyframe = -1
        self.pub_diag = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self.tf = TfPublisher(self) if p["publish_tf"] else None
        self.extrinsics = ExtrinsicLookup(self)
        self._extrinsic_from_tf = False

    # ------------------------------------------------------------------ callback side
    def _on_cloud(self, msg: PointCloud2) -> None:
        self.stats["received"] += 1
        # Every scan, also one dropped below: the odometry tells its own gaps from the sensor's.
        self.odometry.heard(messages.stamp_to_sec(msg.header.stamp))
        if self.handover.offer((msg, time.monotonic())):
            self.stats["dropped"] += 1

    def stop(self) -> None:
        self.handover.stop(timeout=30.0)

    # ------------------------------------------------------------------ preparer side
    def _prepare(self, offered: tuple[PointCloud2, float]) -> _Scan:
        """The scan's header checks, conversion and ``KeyframeOdometry.prepare``: what can be done
        while the scan before it is registered (none of it reads the odometry's state)."""
        msg, received = offered
        scan = _Scan(msg, received, self._scan_id)
        self._scan_id += 1
        try:
            scan.refusal = self._refusal(msg.header)
            if scan.refusal is None:
                xyz, times = self._points_and_times(msg)
                self._check_scale(xyz)
                scan.prepared = self.odometry.prepare(xyz, times, messages.stamp_to_sec(msg.header.stamp))
        except PointCloud2Error as exc:
            scan.refusal = f"malformed PointCloud2: {exc}"
        except Exception as exc:  # a bug: answered in order by the worker as an internal error
            scan.error = exc
        return scan

    def _check_scale(self, xyz: np.ndarray) -> None:
        """Once, on the first scans: the log says when the voxel size does not suit the scans' scale
        (s2h_ros.scene_scale: outdoor settings on a room, indoor ones on a street)."""
        hint = self._scale.add(xyz)
        if hint:
            self.get_logger().warning(f"registration.voxel_size {self._scale.voxel_size:g}: {hint}")

    def _points_and_times(self, msg: PointCloud2) -> tuple[np.ndarray, np.ndarray | None]:
        """The scan's ``(N, 3)`` points and, where it has a time field (s2h_ros.deskew.TIME_FIELDS)
        and ``odometry.deskew`` is on, each point's seconds relative to its stamp. Times that cannot
        be a sweep's are not used: the scan is registered as given (its result says deskewed: false),
        and the first time a field is found, or found unusable, the log says so."""
        if not self.odometry.cfg.deskew:
            return from_msg(msg)[0], None
        xyz, times, field, problem = read_xyz_times(msg, messages.stamp_to_sec(msg.header.stamp))
        if field is not None:
            self._log_time_field(field, problem)
        return xyz, times

    def _log_time_field(self, field: str, problem: str) -> None:
        """Once per field and outcome: the log says whether its per-point times are used."""
        if (field, bool(problem)) in self._time_fields:
            return
        self._time_fields.add((field, bool(problem)))
        if problem:  # rclpy fixes a call site's severity: one call per severity
            self.get_logger().warning(f"per-point times in field {field!r}: not used ({problem}); scans are "
                                      "registered as given")
        else:
            self.get_logger().info(f"per-point times in field {field!r}: scans are deskewed with the motion prior")

    # ------------------------------------------------------------------ worker side
    def _answer(self, scan: _Scan | Failed) -> None:
        """Register and publish one prepared scan; never raises (a bug in one scan must not stop
        the node: it is answered as failed)."""
        if isinstance(scan, Failed):  # the preparer itself failed (its own errors are in scan.error)
            scan = _Scan(*scan.item, scan_id=-1, error=scan.error)
        try:
            if scan.error is not None:
                raise scan.error
            self._process(scan)
        except Exception as exc:
            if not self.context.ok():  # shutting down: publishing fails, nobody listens
                return
            self.stats["failed"] += 1
            self._publish_failure(scan.msg.header, scan.scan_id, f"internal error: {type(exc).__name__}: {exc}",
                                  log=self.get_logger().error)

    def _process(self, scan: _Scan) -> None:
        msg, scan_id, received = scan.msg, scan.scan_id, scan.received
        stamp = msg.header.stamp
        sensor_frame = msg.header.frame_id or "sensor"
        if scan.refusal is not None:
            self.stats["bad_input"] += 1
            self._publish_failure(msg.header, scan_id, scan.refusal)
            return
        self._update_extrinsic(sensor_frame)
        # A newer scan offered or prepared: the odometry's global search is its quick try alone.
        step = self.odometry.step(scan.prepared, messages.stamp_to_sec(stamp), behind=self.handover.waiting)
        self.stats["processed"] += 1
        self._segment = step.segment
        self._note_event(step, scan_id)
        if step.success:
            self._publish_pose(step, stamp, sensor_frame, scan_id)
            if step.refinement is not None and not step.refinement.used:  # the registration's pose stands
                self.get_logger().info(f"scan {scan_id}: {step.refinement.message}")
            if step.new_keyframe:
                self.stats["keyframes"] += 1
        else:
            self.stats["failed"] += 1
            if step.event not in CONTINUITY_LOST:  # those have their own error line
                self.get_logger().warning(f"scan {scan_id}: {step.message}")
        self.pub_result.publish(messages.result_message(step, msg.header, scan_id))
        scan_pose = kf_pose = None
        if step.success:  # keyframe pose = scan pose composed with (keyframe <- scan)^-1
            scan_pose = self.frames.sensor_in_odom(step.pose)
            kf_pose = scan_pose @ geometry.invert_transform(step.T_keyframe_scan)
            self._publish_keyframe(step, kf_pose, stamp)
        max_lines = self.get_parameter("max_markers").value  # may change at run time
        self.pub_markers.publish(messages.correspondence_markers(
            step, self.odom_frame, stamp, scan_pose, kf_pose, max_lines))
        done = time.monotonic()
        self._latencies.append(done - received)  # receipt -> published, wall clock
        self._done_times.append(done)

    def _refusal(self, header: Header) -> str | None:
        """Why a scan cannot be registered from its header alone (None: it can)."""
        if header.stamp.sec == 0 and header.stamp.nanosec == 0:
            return "stamp is zero (sec 0, nanosec 0): the driver set no time; not registered"
        if header.frame_id == self.odom_frame:
            return (f"frame_id {header.frame_id!r} is the odometry frame: a scan must be in its sensor frame "
                    f"(registering it would publish {self.odom_frame} -> {self.odom_frame}); not registered")
        return None

    def _note_event(self, step: OdometryStep, scan_id: int) -> None:
        """Log and count the odometry's continuity event; a time reset starts a new timeline."""
        if step.event in CONTINUITY_LOST:
            self.stats["resets"] += 1
            with self._lost_lock:
                self._lost_since_diagnostics.append(f"scan {scan_id}: {step.event}")
            self.get_logger().error(f"scan {scan_id}: {step.event} (segment {step.segment}): {step.message}")
        elif step.event == "relocalised":
            self.get_logger().warning(f"scan {scan_id}: relocalised (segment {step.segment}): {step.message}")
        if step.event == "time_reset":
            # The odometry restarted at identity: odom is again the base frame at this scan (the
            # anchor from the extrinsic in use), and the path and TF's time order start again.
            self.frames.set_extrinsic(self.frames.sensor_to_base, None)
            self.path_poses.clear()
            self._last_tf_ns = None

    def _update_extrinsic(self, sensor_frame: str) -> None:
        """Take base <- sensor from the static TF tree once it is known; until then the parameter.
        odom does not jump when it arrives after the first scans (OdomFrame.set_extrinsic)."""
        if self._extrinsic_from_tf or not self.base_frame or sensor_frame == self.base_frame:
            return
        T = self.extrinsics.lookup(self.base_frame, sensor_frame)
        if T is not None:
            self.frames.set_extrinsic(T, self.odometry.last_pose)
            self._extrinsic_from_tf = True
            self.get_logger().info(f"sensor extrinsic {self.base_frame} <- {sensor_frame} from TF")

    def _publish_pose(self, step: OdometryStep, stamp, sensor_frame: str, scan_id: int) -> None:
        T = self.frames.child_in_odom(step.pose)  # odom -> base (or -> sensor without a base frame)
        child = self.base_frame or sensor_frame
        ns = stamps.stamp_ns(stamp)
        if self._last_tf_ns is not None and ns <= self._last_tf_ns:
            # The odometry refuses such stamps; this keeps TF's promise should it ever not.
            self.get_logger().error(f"scan {scan_id}: no TF: stamp {ns} ns is not after the last TF's "
                                    f"{self._last_tf_ns} ns")
        elif self.tf is not None:
            self.tf.send(messages.transform_stamped(T, stamp, self.odom_frame, child))
            self._last_tf_ns = ns
        twist, twist_cov = self.frames.twist_in_child(step.twist, step.twist_covariance)
        self.pub_odom.publish(messages.odometry(
            T, stamp, self.odom_frame, child, self.frames.covariance_in_odom(step.covariance, step.pose),
            twist, twist_cov))
        self.path_poses.append(messages.pose_stamped(T, stamp, self.odom_frame))
        self.pub_path.publish(Path(header=Header(stamp=stamp, frame_id=self.odom_frame), poses=list(self.path_poses)))

    def _publish_keyframe(self, step: OdometryStep, kf_pose: np.ndarray, stamp) -> None:
        """The keyframe's voxels in odom, once per keyframe (latched), as one PointCloud2."""
        limit = self.get_parameter("keyframe_cloud_max_points").value
        if step.keyframe_id == self._published_keyframe or step.keyframe_xyz is None or limit <= 0:
            return
        xyz = step.keyframe_xyz
        if len(xyz) > limit:
            xyz = xyz[geometry.fixed_subset(len(xyz), limit)]
        xyz = geometry.apply_transform(kf_pose, xyz.astype(np.float64)).astype(np.float32)
        self.pub_keyframe.publish(to_msg(xyz, frame_id=self.odom_frame, stamp=stamp))
        self._published_keyframe = step.keyframe_id

    def _publish_failure(self, header: Header, scan_id: int, text: str, log=None) -> None:
        """A failed result for a scan the odometry did not see (refused, malformed, internal error)."""
        (log or self.get_logger().warn)(f"scan {scan_id}: {text}")
        msg = RegistrationResultMsg(header=header, scan_id=scan_id, success=False, message=text,
                                    segment=self._segment)
        msg.transform.rotation.w = 1.0
        self.pub_result.publish(msg)

    def _publish_diagnostics(self) -> None:
        st = self.stats
        lat = np.array(self._latencies) if self._latencies else np.zeros(1)
        rate = 0.0
        if len(self._done_times) >= 2:
            rate = (len(self._done_times) - 1) / max(self._done_times[-1] - self._done_times[0], 1e-9)
        with self._lost_lock:
            lost, self._lost_since_diagnostics = self._lost_since_diagnostics, []
        level = DiagnosticStatus.OK
        text = "tracking"
        if lost:
            level, text = DiagnosticStatus.ERROR, f"continuity lost ({', '.join(lost)})"
        elif st["processed"] and st["failed"] > 0.5 * st["processed"]:
            level, text = DiagnosticStatus.WARN, "more than half of the scans failed"
        status = DiagnosticStatus(level=level, name="s2h_ros: registration", message=text,
                                  hardware_id=self.get_fully_qualified_name())
        values = dict(st, rate_hz=f"{rate:.2f}", latency_p50_ms=f"{1e3 * np.percentile(lat, 50):.1f}",
                      latency_p95_ms=f"{1e3 * np.percentile(lat, 95):.1f}")
        status.values = [KeyValue(key=k, value=str(v)) for k, v in values.items()]
        self.pub_diag.publish(DiagnosticArray(header=Header(stamp=self.get_clock().now().to_msg()), status=[status]))


def _frame_parameters(p: dict[str, Any]) -> tuple[str, str]:
    """``(odom_frame, base_frame)``; ConfigError for frames that would publish odom -> odom."""
    if not p["odom_frame"]:
        raise ConfigError("parameter odom_frame: must not be empty")
    if p["base_frame"] == p["odom_frame"]:
        raise ConfigError(f"parameter base_frame: {p['base_frame']!r} is odom_frame too (would publish "
                          f"{p['odom_frame']} -> {p['odom_frame']}); name the robot base, or leave it empty "
                          "for the sensor frame")
    return p["odom_frame"], p["base_frame"]


def _start_registrar(cfg) -> tuple[Registrar, str]:
    """The registrar and its feature kind, the weights loaded now: a device that is not there or
    weights that cannot be read stop the start-up with a ConfigError naming the parameter, instead
    of failing every scan."""
    try:
        registrar = Registrar(cfg)
    except RegistrationError as exc:
        raise ConfigError(f"parameter registration.device: {exc}") from None
    try:
        features = registrar.features_used()  # loads the weights when the features are learned
    except RegistrationError as exc:
        shipped = "" if cfg.weights else " (empty: the shipped weights)"
        raise ConfigError(f"parameter registration.weights{shipped}: {exc}") from None
    return registrar, features


def main(argv: list[str] | None = None) -> int:
    limit_malloc_arenas()  # before any thread starts (s2h_ros.handover)
    rclpy.init(args=argv if argv is not None else sys.argv)
    try:
        node = RegistrationNode()
    except ConfigError as exc:  # every start-up failure names its parameter (see the module text)
        print(f"registration_node: invalid configuration: {' '.join(str(exc).split())}", file=sys.stderr)
        rclpy.try_shutdown()
        return 2
    try:
        rclpy.spin(node)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        node.stop()
        node.destroy_node()
        rclpy.try_shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
