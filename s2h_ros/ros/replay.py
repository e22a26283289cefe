"""Replay a scan sequence into registration_node over DDS and evaluate what it publishes.

``SequenceReplayer`` publishes each scan of a ``Sequence`` (KITTI layout, synthetic, rosbag2) as
PointCloud2 with ``/clock``, the ground-truth odometry beside it, and records the node's
odometry and results. At a fixed rate (``rate`` Hz; scans the node cannot keep up with are
dropped by the node, as on a robot), in lock-step (``rate`` = 0: the next scan goes out when
the node has answered the previous one), or at the rate this machine sustains (``rate`` =
``AUTO_RATE``, -1: :func:`sustainable_rate` of the node's answer times over a lock-step warm-up,
then that fixed rate, so a slow CPU replays in slowed real time and a GPU at the sensor's rate).
``request_stop`` (a signal handler's) ends a run after the scan in hand. At the end the sequence metrics of the scans answered so far (JSON), the
estimated poses (KITTI text) and a top-view trajectory plot are written, each atomically.

Its settings are ROS parameters (``REPLAY_PARAMETERS``, declared on this node, so ``--ros-args
--params-file config/kitti.yaml`` and ``ros2 param`` reach them); constructor keywords change their
defaults. With a ``base_frame`` it publishes ``base_frame -> frame_id`` from ``sensor_to_base`` on
/tf_static, as a robot description would, so RViz (fixed frame odom) places the clouds.
"""
from __future__ import annotations

import dataclasses
import io
import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from nav_msgs.msg import Odometry
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import PointCloud2

from s2h_ros import geometry, stamps
from s2h_ros.config import ConfigError
from s2h_ros.datasets.types import Sequence, scan_fields
from s2h_ros.msg import RegistrationResult as RegistrationResultMsg
from s2h_ros.outputs import write_json, write_text
from s2h_ros.ros import messages
from s2h_ros.ros.parameters import REPLAY_PARAMETERS, coerce, declare_all, pose_parameter
from s2h_ros.ros.pointcloud2 import to_msg
from s2h_ros.ros.tf import StaticTfPublisher

AUTO_RATE = -1.0  # ``rate`` value: choose the rate from a lock-step warm-up (sustainable_rate)
AUTO_WARMUP_SCANS = 12  # lock-step scans the automatic rate is measured on (the first is not counted)
AUTO_HEADROOM = 0.7  # the chosen period is the median answer time / this


def sustainable_rate(answer_s: list[float], stamps_s: list[float], headroom: float = AUTO_HEADROOM) -> dict:
    """The replay rate this machine sustains: ``headroom`` / the median lock-step answer time
    (publish -> result, seconds; the first scan of a run, which loads the models, left out by the
    caller), at most the sensor's own rate (median spacing of ``stamps_s``). Returns ``{"rate_hz",
    "sensor_hz", "answer_p50_ms", "warmup_scans"}``; ValueError without answers to measure."""
    if not answer_s:
        raise ValueError("no answered warm-up scans to choose a rate from")
    spacing = np.diff(np.asarray(stamps_s, dtype=np.float64))
    spacing = spacing[spacing > 0]
    sensor_hz = 1.0 / float(np.median(spacing)) if len(spacing) else math.inf
    answer = float(np.median(answer_s))
    rate = min(sensor_hz, headroom / max(answer, 1e-3))
    return {"rate_hz": round(rate, 3), "sensor_hz": round(sensor_hz, 3) if math.isfinite(sensor_hz) else None,
            "answer_p50_ms": round(1e3 * answer, 1), "warmup_scans": len(answer_s)}


RELIABLE = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_LAST)


@dataclass
class ReplayRecord:
    """What came back from the node, keyed by the scan stamp (nanoseconds)."""

    stamps_ns: list[int] = field(default_factory=list)  # published scans, in order
    indices: list[int] = field(default_factory=list)  # their indices in the sequence
    poses: dict[int, np.ndarray] = field(default_factory=dict)  # stamp -> odom->base 4x4
    results: dict[int, dict] = field(default_factory=dict)  # stamp -> result summary
    publish_wall: dict[int, float] = field(default_factory=dict)  # stamp -> wall time published
    result_wall: dict[int, float] = field(default_factory=dict)  # stamp -> wall time result arrived
    odom_wall: dict[int, float] = field(default_factory=dict)  # stamp -> wall time odometry arrived
    rate: dict | None = None  # the automatic rate chosen (sustainable_rate), when one was


def load_kitti_sequence(sequence_dir: str, sequence: str) -> Sequence:
    """The KITTI-layout sequence the ``sequence_dir`` / ``sequence`` parameters name; ConfigError otherwise."""
    from s2h_ros.datasets.kitti import KittiSequence

    if not sequence_dir:
        raise ConfigError("parameter sequence_dir is required")
    try:
        return KittiSequence(sequence_dir, sequence or None)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read sequence_dir {sequence_dir!r} (sequence {sequence!r}): {exc}") from None


class SequenceReplayer(Node):
    """Publishes a sequence and listens to registration_node's answers.

    ``sequence`` None: the KITTI-layout sequence named by the ``sequence_dir``/``sequence``
    parameters. ``defaults``: new defaults for REPLAY_PARAMETERS (e.g. ``topic="points"``).
    """

    def __init__(self, sequence: Sequence | None = None, name: str = "kitti_replay", start_time: float = 1.0,
                 context=None, **defaults) -> None:
        super().__init__(name, context=context)
        unknown = set(defaults) - {spec.name for spec in REPLAY_PARAMETERS}
        if unknown:
            raise TypeError(f"unknown replay settings: {', '.join(sorted(unknown))}")
        specs = [dataclasses.replace(spec, default=coerce(defaults[spec.name], spec.type)) if spec.name in defaults
                 else spec for spec in REPLAY_PARAMETERS]
        self.settings = declare_all(self, specs)
        if self.settings["rate"] < 0 and self.settings["rate"] != AUTO_RATE:
            raise ConfigError(f"parameter rate must be >= 0 scans/s or {AUTO_RATE:g} (automatic), "
                              f"got {self.settings['rate']:g}")
        self.sensor_to_base = pose_parameter("sensor_to_base", self.settings["sensor_to_base"])
        if sequence is None:
            sequence = load_kitti_sequence(self.settings["sequence_dir"], self.settings["sequence"])
        self.sequence = sequence
        self.frame_id = self.settings["frame_id"]
        self.start_time = start_time
        qos = RELIABLE if self.settings["reliable"] else qos_profile_sensor_data
        self.pub_cloud = self.create_publisher(PointCloud2, self.settings["topic"], qos)
        base = self.settings["base_frame"]
        if base and base != self.frame_id:
            self._static_tf = StaticTfPublisher(self)
            self._static_tf.send([messages.transform_stamped(self.sensor_to_base, messages.stamp_msg(start_time),
                                                             base, self.frame_id)])
        node_name = self.settings["node_name"]
        clock_qos = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE,
                               durability=DurabilityPolicy.TRANSIENT_LOCAL, history=HistoryPolicy.KEEP_LAST)
        self.pub_clock = self.create_publisher(Clock, "/clock", clock_qos)
        self.pub_gt = self.create_publisher(Odometry, "~/ground_truth", 10)
        self.record = ReplayRecord()
        self._cv = threading.Condition()
        self._stop_requested = False
        self.create_subscription(Odometry, f"/{node_name}/odometry", self._on_odom, RELIABLE)
        self.create_subscription(RegistrationResultMsg, f"/{node_name}/result", self._on_result, RELIABLE)

    # ------------------------------------------------------------------ listening
    def _on_odom(self, msg: Odometry) -> None:
        with self._cv:
            key = stamps.stamp_ns(msg.header.stamp)
            self.record.poses[key] = geometry.transform_to_matrix(msg.pose.pose.position, msg.pose.pose.orientation)
            self.record.odom_wall[key] = time.monotonic()
            self._cv.notify_all()

    def _on_result(self, msg: RegistrationResultMsg) -> None:
        with self._cv:
            key = stamps.stamp_ns(msg.header.stamp)
            self.record.results[key] = {
                "success": bool(msg.success), "message": msg.message, "keyframe_id": int(msg.keyframe_id),
                "num_inliers": int(msg.num_inliers), "inlier_ratio": float(msg.inlier_ratio),
                "fitness": float(msg.fitness), "total_time_ms": float(msg.total_time_ms),
                "stages_ms": dict(zip(msg.stage_names, map(float, msg.stage_times_ms))),
                "segment": int(msg.segment), "event": msg.event,
            }
            self.record.result_wall[key] = time.monotonic()
            self._cv.notify_all()

    def request_stop(self) -> None:
        """End ``run`` and the waits after the scan in hand (safe from a signal handler)."""
        with self._cv:
            self._stop_requested = True
            self._cv.notify_all()

    @property
    def stop_requested(self) -> bool:
        return self._stop_requested

    def wait_for(self, predicate, timeout: float) -> bool:
        """Wait (executor spinning elsewhere) until ``predicate()`` holds, ``timeout`` passes or a
        stop is requested; whether ``predicate()`` holds."""
        with self._cv:
            self._cv.wait_for(lambda: self._stop_requested or predicate(), timeout=timeout)
            return bool(predicate())

    def wait_for_subscriber(self, timeout: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self._stop_requested:
            if self.pub_cloud.get_subscription_count() > 0 and self.count_publishers(self._result_topic()) > 0:
                return True
            with self._cv:
                self._cv.wait(0.05)
        return False

    def _result_topic(self) -> str:
        return [s.topic_name for s in self.subscriptions if s.msg_type is RegistrationResultMsg][0]

    # ------------------------------------------------------------------ publishing
    def publish_scan(self, i: int) -> int:
        scan = self.sequence[i]
        t = self.start_time + float(scan.stamp)
        stamp = messages.stamp_msg(t)
        self.pub_clock.publish(Clock(clock=stamp))
        msg = to_msg(scan.points, frame_id=self.frame_id, stamp=stamp, extra=scan_fields(scan))
        key = stamps.stamp_ns(stamp)
        with self._cv:
            self.record.stamps_ns.append(key)
            self.record.indices.append(i)
            self.record.publish_wall[key] = time.monotonic()
        self.pub_cloud.publish(msg)
        if scan.pose is not None:
            self.pub_gt.publish(messages.odometry(scan.pose, stamp, "world", self.frame_id))
        return key

    def run(self, rate: float = 10.0, start: int = 0, end: int | None = None, answer_timeout: float = 60.0,
            settle_timeout: float = 10.0, progress=None) -> None:
        """Publish scans ``start..end``; lock-step when ``rate`` is 0, at the rate this machine
        sustains when it is ``AUTO_RATE`` (the first ``AUTO_WARMUP_SCANS`` lock-step, then the rate
        :func:`sustainable_rate` chooses from them, kept in ``record.rate``). Returns when answers
        are in, or at once after ``request_stop``."""
        end = len(self.sequence) if end is None else min(end, len(self.sequence))
        if rate == AUTO_RATE:
            warm_end = min(end, start + AUTO_WARMUP_SCANS)
            self.run(0.0, start, warm_end, answer_timeout, settle_timeout, progress)
            if warm_end >= end or self._stop_requested:
                return
            self.record.rate = self._measured_rate()
            self.get_logger().info(f"automatic rate: {self.record.rate['rate_hz']:.2f} Hz (lock-step answer p50 "
                                   f"{self.record.rate['answer_p50_ms']:.0f} ms, sensor "
                                   f"{self.record.rate['sensor_hz']} Hz)")
            start, rate = warm_end, self.record.rate["rate_hz"]
        elif rate < 0:
            raise ValueError(f"rate must be >= 0 scans/s or AUTO_RATE ({AUTO_RATE:g}), got {rate:g}")
        period = 1.0 / rate if rate > 0 else 0.0
        next_time = time.monotonic()
        for i in range(start, end):
            if period:
                delay = next_time - time.monotonic()
                if delay > 0:
                    with self._cv:  # pacing, not synchronisation
                        self._cv.wait_for(lambda: self._stop_requested, delay)
                next_time += period
            if self._stop_requested:
                return
            key = self.publish_scan(i)
            if not period:
                if not self.wait_for(lambda: key in self.record.results, answer_timeout) and not self._stop_requested:
                    self.get_logger().warning(f"scan {i}: no answer within {answer_timeout} s")
            if progress is not None:
                progress(i)
        # Fixed rate: the node may still be working on the last scans (or have dropped some).
        n = len(self.record.stamps_ns)
        last = self.record.stamps_ns[-1] if n else None
        self.wait_for(lambda: last is None or last in self.record.results, settle_timeout)

    def _measured_rate(self) -> dict:
        """:func:`sustainable_rate` of the scans published so far (all lock-step), the first left out."""
        with self._cv:
            keys = list(self.record.stamps_ns)
            answers = [self.record.result_wall[k] - self.record.publish_wall[k] for k in keys[1:]
                       if k in self.record.result_wall]
        return sustainable_rate(answers, [stamps.ns_to_sec(k) for k in keys])


def evaluate_replay(sequence: Sequence, record: ReplayRecord, out_dir: Path,
                    sensor_to_base: np.ndarray | None = None, name: str = "s2h",
                    interrupted: str | None = None) -> dict:
    """:func:`replay_report` written by :func:`write_replay_outputs` into ``out_dir``; the report."""
    report, est, gt = replay_report(sequence, record, sensor_to_base, name, interrupted)
    write_replay_outputs(out_dir, report, est, gt, f"{getattr(sequence, 'name', 'sequence')}: top view")
    return report


def replay_report(sequence: Sequence, record: ReplayRecord, sensor_to_base: np.ndarray | None = None,
                  name: str = "s2h", interrupted: str | None = None) -> tuple[dict, np.ndarray, np.ndarray | None]:
    """Sequence metrics of the node's trusted poses against ground truth: ``(report, estimated
    (N, 4, 4), ground truth (N, 4, 4) or None)`` over the N published scans evaluated.

    Scans without a trusted pose (failed or dropped) hold the previous pose, as a consumer of the
    published odometry would (``metrics``); ``metrics_trusted`` scores the trusted poses alone (what
    was published, e.g. at a rate where the node drops scans). Their count is reported beside the
    metrics, and so are the node's continuity events (``relocalised``, ``new_segment``, ``time_reset``). ``interrupted``: the
    signal that ended the replay early; the report then covers the scans up to the last one
    answered (those published after it were in flight, not dropped: ``scans_in_flight``).
    """
    from s2h_ros.evaluation.metrics import sequence_metrics

    T_bs = np.eye(4) if sensor_to_base is None else sensor_to_base
    T_sb = geometry.invert_transform(T_bs)
    stamps = list(record.stamps_ns)
    in_flight = 0
    while interrupted and stamps and stamps[-1] not in record.results:
        stamps.pop()
        in_flight += 1
    indices = record.indices[:len(stamps)]
    est, trusted = [], []
    last = np.eye(4)
    for key in stamps:
        if key in record.poses:
            last = T_sb @ record.poses[key] @ T_bs  # odom->base back to the sensor trajectory
        trusted.append(key in record.poses)
        est.append(last)
    have = sum(trusted)
    est = np.stack(est) if est else np.zeros((0, 4, 4))
    answered = [record.results[k] for k in stamps if k in record.results]
    events: dict[str, int] = {}
    for r in answered:
        if r.get("event"):
            events[r["event"]] = events.get(r["event"], 0) + 1
    report: dict = {
        "method": name,
        "interrupted": interrupted,
        "scans_published": len(record.stamps_ns),
        "scans_answered": len(answered),
        "scans_trusted": have,
        "scans_failed": sum(1 for r in answered if not r["success"]),
        "scans_dropped": len(stamps) - len(answered),
        "scans_in_flight": in_flight,
        "events": events,
    }
    if record.rate is not None:
        report["rate"] = record.rate
    latencies = [record.odom_wall[k] - record.publish_wall[k] for k in stamps if k in record.odom_wall]
    if latencies:
        report["latency_ms"] = {"p50": 1e3 * float(np.percentile(latencies, 50)),
                                "p95": 1e3 * float(np.percentile(latencies, 95))}
    times = [r["total_time_ms"] for r in answered]
    if times:
        report["step_ms"] = {"p50": float(np.percentile(times, 50)), "p95": float(np.percentile(times, 95))}
    gt = None
    if sequence.poses is not None and len(stamps):
        gt = sequence.poses[indices]
        gt = np.einsum("ij,njk->nik", geometry.invert_transform(gt[0]), gt)
        report["metrics"] = sequence_metrics(gt, est)
        if 2 <= have < len(stamps):  # what was published, without the held poses
            report["metrics_trusted"] = sequence_metrics(gt[trusted], est[trusted])
    return report, est, gt


def baseline_odometry(sequence: Sequence, record: ReplayRecord,
                      names: list[str]) -> tuple[dict[str, dict], dict[str, np.ndarray]]:
    """Offline odometry of other methods (e.g. ``kiss_icp``) on exactly the scans the replay
    published, scored like the node: ``({name: metrics and time per scan}, {name: (N, 4, 4)})``.
    A method that cannot run here (not installed) is reported with its error, not skipped silently."""
    from s2h_ros.datasets.types import SubSequence
    from s2h_ros.evaluation.harness import evaluate_sequence
    from s2h_ros.evaluation.methods import MethodUnavailable, make_method

    scans = SubSequence(sequence, list(record.indices))
    summaries: dict[str, dict] = {}
    poses: dict[str, np.ndarray] = {}
    for name in names:
        try:
            method = make_method(name, scale="outdoor")
        except (MethodUnavailable, ValueError) as exc:
            summaries[name] = {"error": str(exc)}
            continue
        result = evaluate_sequence({name: method}, scans, progress=False)
        summaries[name], poses[name] = result.summary[name], result.poses[name]
    return summaries, poses


def write_replay_outputs(out_dir: Path, report: dict, est: np.ndarray, gt: np.ndarray | None,
                         title: str = "", others: dict[str, np.ndarray] | None = None) -> None:
    """``trajectory.png`` (with ground truth and ``others``' trajectories), ``poses_estimated.txt``
    (KITTI rows) and ``metrics.json`` in ``out_dir``, each atomically, the metrics last (they name
    the plot, which ``report["plot"]`` then holds). An OSError names the file that could not be written."""
    from s2h_ros.evaluation.plots import trajectories_top_view

    out_dir = Path(out_dir)
    if gt is not None:
        report["plot"] = str(trajectories_top_view(gt, {report["method"]: est, **(others or {})},
                                                   out_dir / "trajectory.png", title=title))
    rows = io.StringIO()
    np.savetxt(rows, est[:, :3, :].reshape(len(est), 12))
    write_text(out_dir / "poses_estimated.txt", rows.getvalue())
    write_json(out_dir / "metrics.json", report)
