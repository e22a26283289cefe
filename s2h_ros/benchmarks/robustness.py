"""``s2h bench robustness``: every bad-input and fault case, against registration_node over DDS,
the ``s2h register`` CLI and the library, as one table; and, with ``--soak-minutes``, a soak.

One registration_node process (:func:`~s2h_ros.commands.replay.registration_node_process`:
config/register.yaml and config/kitti.yaml, as ``s2h replay`` starts it) is fed, over real DDS, a
catalogue of cases between real scans of a 64-beam drive with ground truth (the curved drive of
test/conftest.py): malformed PointCloud2 messages, odd but valid clouds, bad stamps and frames,
and motion the odometry must not trust blindly (a gap, a teleport, noise, another scene, a burst).
For each case the table has:

* **outcome**: the RegistrationResult of its scans (success, message, continuity event) and
  whether TF went out for them;
* **crashed?**: the node process died or stopped answering (it is restarted for the next case);
* **trusted wrong?**: a trusted pose that disagrees with the ground truth by more than 0.3 m or
  2 deg (as ``s2h bench trust``) relative to the previous trusted pose of the same segment, or any
  trusted pose for a scan no pose can be right for (noise, another scene, garbage bytes);
* **as expected?**: the case's own expectation (the message, the event, TF or not) held.

Every node case ends with the next real scan of the drive, which must be trusted: the node still
tracks, and its TF (published in order) settles whether the case's own scans had any. Then come
the start-up failures (exit 2 naming the parameter), process faults (the parent killed, SIGINT),
``s2h register`` on bad files and options (exit 0/1/2) and library calls. ``--soak-minutes M``
streams the drive at 10 Hz, forwards and backwards with stamps always increasing, into the same
node for M minutes: processed rate, failures, drops, continuity events, each trusted step against
the ground truth, the node's RSS over time and its trend (least squares, MB per minute), crashes.

Each case names the test under test/ that asserts its outcome (``Case.test``); the node cases run
in test/test_robustness.py against one node process.
"""
from __future__ import annotations

import argparse
import array
import dataclasses
import os
import re
import signal
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from s2h_ros import geometry, stamps
from s2h_ros.pointcloud2 import INT8

MAX_TE_M, MAX_RE_DEG = 0.3, 2.0  # a trusted step further off the ground truth is wrong (s2h bench trust, stream)
ANSWER_TIMEOUT_S = 120.0  # no answer to a scan within this: the node stopped answering
TF_TIMEOUT_S = 10.0  # a trusted scan's TF and odometry arrive within this
TELEPORT_M = 40.0
EPOCH0_S, EPOCH_STEP_S = 1_000_000.0, 1000.0  # each new track starts this much earlier: a time reset
FIRST_OF_TRACK = ("initialised", "time_reset")
GARBAGE = "no right pose"  # the truth of a scan no pose can be right for
CELL_CHARS = 150


# ---------------------------------------------------------------------------- the catalogue


@dataclass
class Outcome:
    outcome: str
    expected: bool
    crashed: bool = False
    trusted_wrong: bool | None = None  # None: the case has no pose to judge
    details: dict = field(default_factory=dict)


@dataclass
class Case:
    name: str
    layer: str
    expect: str  # the expected outcome, in words
    test: str  # "file.py::test_name" under test/ that asserts it
    run: Callable[["Bench"], Outcome]
    final: bool = False  # runs after the soak (it ends the node)


CASES: list[Case] = []


def _case(name: str, layer: str, expect: str, test: str, final: bool = False):
    def add(fn: Callable[["Bench"], Outcome]) -> Callable[["Bench"], Outcome]:
        CASES.append(Case(name, layer, expect, test, fn, final))
        return fn

    return add


class Expect:
    """A case's expectations; each one that fails is named at the end of the outcome."""

    def __init__(self) -> None:
        self.failed: list[str] = []

    def that(self, condition: bool, what: str) -> bool:
        if not condition:
            self.failed.append(what)
        return bool(condition)

    def outcome(self, text: str, **kwargs) -> Outcome:
        if self.failed:
            text += " | NOT AS EXPECTED: " + "; ".join(self.failed)
        return Outcome(text, not self.failed, **kwargs)


def step_error(last_pose: np.ndarray, pose: np.ndarray, last_truth: np.ndarray,
               truth: np.ndarray) -> tuple[float, float]:
    """(m, deg) between the estimated and the true motion from the last trusted scan to this one."""
    re_deg, te_m = geometry.transform_errors(geometry.invert_transform(last_pose) @ pose,
                                             geometry.invert_transform(last_truth) @ truth)
    return float(te_m), float(re_deg)


def is_wrong(error: tuple[float, float]) -> bool:
    return error[0] > MAX_TE_M or error[1] > MAX_RE_DEG


class NoAnswer(RuntimeError):
    """registration_node died or stopped answering."""


# ---------------------------------------------------------------------------- scenes


class Resampled:
    """A Sequence view: the scans ``order`` of ``base`` (repeats allowed), stamped ``k * period``
    (None: the base's own stamps)."""

    def __init__(self, base, order, period: float | None = None, name: str | None = None) -> None:
        self.base, self.order, self.period = base, list(order), period
        self.name = name or getattr(base, "name", "sequence")

    def __len__(self) -> int:
        return len(self.order)

    def __getitem__(self, k: int):
        scan = self.base[self.order[k]]
        return scan if self.period is None else dataclasses.replace(scan, stamp=k * self.period)

    def __iter__(self):
        return (self[k] for k in range(len(self)))

    @property
    def poses(self) -> np.ndarray | None:
        poses = self.base.poses
        return None if poses is None else poses[self.order]


def back_and_forth(n: int, count: int) -> list[int]:
    """``count`` scan indices running 0 .. n-1, back to 0, and on: the drive driven to and fro."""
    period = max(2 * n - 2, 1)
    return [p if p < n else period - p for p in (k % period for k in range(count))]


@dataclass
class Scenes:
    drive: object  # 64-beam drive with ground truth, a few metres between scans (the node cases)
    vlp16: object  # a 16-beam drive with ground truth
    other: np.ndarray  # (N, 3) a scan of another world
    drive_dir: Path | None = None  # a drive on disk (KITTI layout) for the s2h replay case
    stream: object | None = None  # the 10 Hz drive ``drive`` is taken from (the soak)


# test/conftest.py's curved_drive: every 4th scan of this drive (about 3 m and up to 9 deg apart).
CURVED_DRIVE = {"n_frames": 80, "seed": 12, "sensor": "hdl64", "speed": 10.0}
CURVED_EVERY = 4


def other_world_scan() -> np.ndarray:
    """A 64-beam scan of a world no drive here passes through."""
    from s2h_ros.datasets.synthetic import simulate_sequence

    return simulate_sequence(n_frames=1, seed=99, sensor="hdl64")[0].points


def make_scenes(cache: Path) -> Scenes:
    """The curved drive at 10 Hz on disk under ``cache`` (rendered once), every 4th scan of it for
    the cases; the reported 16-beam drive (seed 4, 10 m/s) and another world in memory."""
    from s2h_ros.datasets.kitti import KittiSequence
    from s2h_ros.datasets.synthetic import simulate_sequence
    from s2h_ros.datasets.types import ScanList

    folder = Path(cache) / "curved_drive"
    if not (folder / "poses.txt").exists():
        simulate_sequence(**CURVED_DRIVE, out_dir=folder, progress=True)
    stream = KittiSequence(folder)
    drive = Resampled(stream, range(0, len(stream), CURVED_EVERY), name="curved_drive")
    vlp16 = ScanList(list(simulate_sequence(n_frames=6, seed=4, sensor="vlp16", speed=10.0)), name="vlp16")
    return Scenes(drive, vlp16, other_world_scan(), folder, stream)


# ---------------------------------------------------------------------------- the node over DDS


@dataclass
class Sent:
    """A cloud sent to the node and what came of it."""

    label: str
    stamp_ns: int
    truth: np.ndarray | str | None  # true sensor pose (world), GARBAGE, or None (not judged)
    role: str = "case"  # "case": the case's own scan; "drive": a real scan around it (track start, recovery)
    tf_before: int = 0  # TFs already seen at this stamp when it was sent
    result: object | None = None  # s2h_ros/RegistrationResult
    wrong: bool | None = False  # trusted and wrong; None: trusted, not judged
    error: tuple[float, float] | None = None  # (m, deg) from the ground truth, relative to the last trusted

    @property
    def trusted(self) -> bool:
        return self.result is not None and bool(self.result.success)


class Probe:
    """The bench's end of DDS: a SequenceReplayer of the drive (the cloud publisher, /tf_static
    base_link -> velodyne) with every result, TF and odometry registration_node sends, matched to
    the clouds sent by stamp."""

    def __init__(self, drive, context=None) -> None:
        from nav_msgs.msg import Odometry
        from rclpy.executors import SingleThreadedExecutor
        from tf2_msgs.msg import TFMessage

        from s2h_ros.msg import RegistrationResult
        from s2h_ros.ros.replay import RELIABLE, SequenceReplayer
        from s2h_ros.ros.tf import TF_QOS

        self.node = SequenceReplayer(drive, name="robustness_probe", topic="points", context=context)
        self._cv = threading.Condition()
        self._pending: list[Sent] = []
        self.tf: dict[int, int] = {}  # stamp (ns) -> TFs seen
        self.poses: dict[int, np.ndarray] = {}  # stamp (ns) -> odom -> base of the first odometry
        self.unmatched = 0  # results for no cloud of the probe's (the soak's)
        self.node.create_subscription(RegistrationResult, "/registration_node/result", self._on_result, RELIABLE)
        self.node.create_subscription(TFMessage, "/tf", self._on_tf, TF_QOS)
        self.node.create_subscription(Odometry, "/registration_node/odometry", self._on_odometry, RELIABLE)
        self.executor = SingleThreadedExecutor(context=context)
        self.executor.add_node(self.node)
        threading.Thread(target=self.executor.spin, daemon=True).start()

    def _on_result(self, msg) -> None:
        key = stamps.stamp_ns(msg.header.stamp)
        with self._cv:
            sent = next((s for s in self._pending if s.stamp_ns == key), None)
            if sent is None:
                self.unmatched += 1
            else:
                sent.result = msg
                self._pending.remove(sent)
            self._cv.notify_all()

    def _on_tf(self, msg) -> None:
        with self._cv:
            for t in msg.transforms:
                key = stamps.stamp_ns(t.header.stamp)
                self.tf[key] = self.tf.get(key, 0) + 1
            self._cv.notify_all()

    def _on_odometry(self, msg) -> None:
        with self._cv:
            self.poses.setdefault(stamps.stamp_ns(msg.header.stamp), geometry.transform_to_matrix(
                msg.pose.pose.position, msg.pose.pose.orientation))
            self._cv.notify_all()

    def publish(self, sent: Sent, msg) -> None:
        with self._cv:
            sent.tf_before = self.tf.get(sent.stamp_ns, 0)
            self._pending.append(sent)
        self.node.pub_cloud.publish(msg)

    def wait_for(self, predicate, timeout: float) -> bool:
        with self._cv:
            return self._cv.wait_for(predicate, timeout)

    def forget_pending(self) -> None:
        with self._cv:
            self._pending.clear()

    def close(self) -> None:
        self.executor.shutdown()
        self.node.destroy_node()


@dataclass
class Track:
    """The drive being replayed: its last frame trusted and the last stamp sent."""

    drive: object
    i: int
    t: float


def cloud_msg(points: np.ndarray, stamp_s: float, frame_id: str = "velodyne", **kwargs):
    """A PointCloud2 of ``points`` (s2h_ros.ros.pointcloud2.to_msg)."""
    from s2h_ros.ros import messages
    from s2h_ros.ros.pointcloud2 import to_msg

    return to_msg(points, frame_id=frame_id, stamp=messages.stamp_msg(stamp_s), **kwargs)


class NodeSession:
    """One registration_node process (restarted after a crash), the probe, the track of the drive
    being replayed, and the judge of trusted poses against the ground truth."""

    def __init__(self, scenes: Scenes, work: Path, overrides=(), context=None, env: dict | None = None) -> None:
        self.scenes, self.work, self.overrides, self.env = scenes, Path(work), list(overrides), env
        self.probe = Probe(scenes.drive, context)
        self.proc: subprocess.Popen | None = None
        self.logs: list[Path] = []
        self.epoch = EPOCH0_S
        self.track: Track | None = None
        self.sent: list[Sent] = []
        self._last: tuple | None = None  # (odom pose, true pose, segment) of the last trusted scan
        self._scans: dict[tuple[int, int], object] = {}
        self._stack = ExitStack()

    # ------------------------------------------------------------------ the process
    def start(self) -> None:
        from s2h_ros.commands.replay import registration_node_process

        log = self.work / f"registration_node.{len(self.logs)}.log"
        self.logs.append(log)
        self._stack = ExitStack()
        self.proc = self._stack.enter_context(registration_node_process(log, overrides=self.overrides, env=self.env))
        if not self.probe.node.wait_for_subscriber(ANSWER_TIMEOUT_S):
            raise RuntimeError(f"registration_node did not come up; see {log}")
        self.track, self._last = None, None

    def stop(self) -> None:
        self._stack.close()
        self.probe.forget_pending()

    def restart(self) -> None:
        self.stop()
        self.start()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def close(self) -> None:
        self.stop()
        self.probe.close()

    # ------------------------------------------------------------------ clouds in, answers out
    def send(self, msg, truth, label: str, wait: bool = True, role: str = "case") -> Sent:
        sent = Sent(label, stamps.stamp_ns(msg.header.stamp), truth, role)
        self.sent.append(sent)
        self.probe.publish(sent, msg)
        if wait:
            self.answer(sent)
        return sent

    def answer(self, sent: Sent, timeout: float = ANSWER_TIMEOUT_S, judge: bool = True) -> None:
        """Wait for the node's answer to ``sent`` and judge it; NoAnswer when the node died or went
        silent (the condition is checked each second for the process)."""
        deadline = time.monotonic() + timeout
        while not self.probe.wait_for(lambda: sent.result is not None, 1.0):
            if not self.alive():
                raise NoAnswer(f"{sent.label}: registration_node exited with {self.proc.returncode}")
            if time.monotonic() > deadline:
                raise NoAnswer(f"{sent.label}: no answer within {timeout:.0f} s")
        if judge:
            self.judge(sent)

    def judge(self, sent: Sent) -> None:
        """A trusted answer: its TF and odometry awaited, its pose compared with the ground truth
        relative to the last trusted scan of the same segment (see the module text)."""
        r = sent.result
        if not r.success:
            return
        key = sent.stamp_ns
        self.probe.wait_for(lambda: key in self.probe.poses and self.probe.tf.get(key, 0) > sent.tf_before,
                            TF_TIMEOUT_S)
        pose, truth = self.probe.poses.get(key), sent.truth
        sent.wrong = None
        if isinstance(truth, str):
            sent.wrong = True
        elif r.event in FIRST_OF_TRACK:
            sent.wrong = False  # the origin of a new track: identity by definition
        elif truth is not None and pose is not None and self._last is not None and self._last[2] == r.segment:
            sent.error = step_error(self._last[0], pose, self._last[1], truth)
            sent.wrong = is_wrong(sent.error)
        ok = pose is not None and isinstance(truth, np.ndarray)
        self._last = (pose, truth, r.segment) if ok else None

    def new_tf(self, sent: Sent) -> int:
        """TFs at ``sent``'s stamp since it was sent (final once a later trusted scan's TF is in)."""
        return self.probe.tf.get(sent.stamp_ns, 0) - sent.tf_before

    # ------------------------------------------------------------------ the track
    def scan(self, drive, i: int):
        key = (id(drive), i)
        if key not in self._scans:
            self._scans[key] = drive[i]
        return self._scans[key]

    def spacing(self, drive, i: int, j: int) -> float:
        """Seconds from scan ``i`` to scan ``j`` of ``drive``."""
        return float(self.scan(drive, j).stamp - self.scan(drive, i).stamp)

    def frame_msg(self, drive, i: int, stamp_s: float, frame_id: str = "velodyne"):
        scan = self.scan(drive, i)
        extra = {"intensity": scan.intensity} if scan.intensity is not None else None
        return cloud_msg(scan.points, stamp_s, frame_id, extra=extra)

    def next_epoch(self, span_s: float = 0.0) -> float:
        """A start stamp more than max_gap before every stamp sent so far (a time reset), leaving
        ``span_s`` seconds free after it."""
        self.epoch -= EPOCH_STEP_S + span_s
        return self.epoch

    def new_track(self, drive=None, i: int = 0, t: float | None = None, role: str = "drive") -> Sent:
        """Scan ``i`` of ``drive`` (default: the 64-beam drive) starting a new track at ``t``
        (default: a new epoch; the odometry starts again: time_reset, or initialised at first)."""
        drive = self.scenes.drive if drive is None else drive
        t = self.next_epoch() if t is None else t
        self.track = Track(drive, i, t)
        return self.send(self.frame_msg(drive, i, t), drive.poses[i], f"{drive.name} {i}", role=role)

    def ensure_track(self, frames_ahead: int = 1) -> None:
        """A track on the 64-beam drive with ``frames_ahead`` scans left (a new one if not)."""
        tr = self.track
        if tr is None or tr.drive is not self.scenes.drive or tr.i + frames_ahead >= len(tr.drive):
            self.new_track()

    def next(self, step: int = 1, dt: float | None = None, build=None, truth=None, label: str = "",
             wait: bool = True, role: str = "case") -> Sent:
        """Scan ``i + step`` of the track at its last stamp + ``dt`` (default: the drive's own
        spacing), as ``build(scan, stamp_s)`` makes it (default: the scan as it is); ``truth``: the
        ground truth (None) or GARBAGE. The track's stamp moves on, its frame when trusted."""
        tr = self.track
        j = tr.i + step
        t = tr.t + (self.spacing(tr.drive, tr.i, j) if dt is None else dt)
        msg = self.frame_msg(tr.drive, j, t) if build is None else build(self.scan(tr.drive, j), t)
        sent = self.send(msg, tr.drive.poses[j] if truth is None else truth, label or f"{tr.drive.name} {j}",
                         wait=wait, role=role)
        tr.t = max(tr.t, t)
        if sent.trusted:
            tr.i = j
        return sent

    def recover(self) -> Sent:
        """The next real scan of the drive (a new track when it has ended)."""
        self.ensure_track(1)
        return self.next(role="drive")


def describe(session: NodeSession, sent: Sent) -> str:
    r = sent.result
    if r is None:
        return "no answer"
    text = ("trusted" if r.success else f"failed: {r.message}") + (f" [{r.event}]" if r.event else "")
    tf = session.new_tf(sent)
    text += f", TF x{tf}" if tf else ", no TF"
    if sent.error is not None:
        text += f", {100 * sent.error[0]:.0f} cm / {sent.error[1]:.1f} deg off"
    return text + (f" (WRONG: {sent.label})" if sent.wrong else "")


def _next_scan(session: NodeSession, after: Sent) -> str:
    return "next scan trusted" if after.trusted and not after.wrong else f"next scan {describe(session, after)}"


def _counted(session: NodeSession, sents: list[Sent]) -> str:
    """``k of n trusted`` and the worst error from the ground truth."""
    errors = [s.error for s in sents if s.error is not None]
    worst = f", worst {100 * max(e[0] for e in errors):.0f} cm / {max(e[1] for e in errors):.1f} deg" if errors else ""
    events = sorted({s.result.event for s in sents if s.result is not None and s.result.event})
    return (f"{sum(s.trusted for s in sents)} of {len(sents)} trusted{worst}"
            + (f" [{', '.join(events)}]" if events else "")
            + f", TF for {sum(session.new_tf(s) > 0 for s in sents)}")


# ---------------------------------------------------------------------------- node cases

NODE_TEST = "test_robustness.py::test_node_case"


def one_scan(b: "Bench", build, refused: tuple[str, ...] | None = None, truth=None, step: int = 1,
             dt: float | None = None) -> Outcome:
    """One scan between real scans of the drive: frame ``i + step`` made by ``build(scan, stamp)``.
    ``refused``: texts its failed answer must hold (``()``: any failure), else it must be trusted
    and right; no TF for a refused scan; then the next real scan must be trusted."""
    s = b.session
    s.ensure_track(step + 1)
    if dt is None and refused is not None:
        dt = 0.1  # a refused scan does not move the track: the next one stays within max_gap
    sent = s.next(step=step, dt=dt, build=build, truth=truth)
    after = s.recover()
    e, r = Expect(), sent.result
    if refused is None:
        e.that(r.success, "trusted")
        e.that(not sent.wrong, "right")
        e.that(s.new_tf(sent) == 1, "one TF")
    else:
        e.that(not r.success, "refused")
        for text in refused:
            e.that(text in r.message, f"the message holds {text!r}")
        e.that(s.new_tf(sent) == 0, "no TF")
    e.that(after.trusted, "the next scan trusted")
    return e.outcome(f"{describe(s, sent)}; {_next_scan(s, after)}")


@_case("drive_before", "node: drive", "8 scans of the drive, all trusted and right, TF for each", NODE_TEST)
def drive_before(b: "Bench") -> Outcome:
    return _drive(b, 8)


def _drive(b: "Bench", n: int) -> Outcome:
    s = b.session
    sents = [s.new_track(role="case")] + [s.next() for _ in range(n - 1)]
    e = Expect()
    e.that(all(x.trusted for x in sents), "all trusted")
    e.that(not any(x.wrong for x in sents), "all right")
    e.that(all(s.new_tf(x) == 1 for x in sents), "one TF each")
    wrong = [f"{x.label}: {100 * x.error[0]:.0f} cm / {x.error[1]:.1f} deg off" for x in sents if x.wrong]
    return e.outcome(_counted(s, sents) + (f" (WRONG: {', '.join(wrong)})" if wrong else ""))


def _edit(**attrs):
    """A builder: the scan's x, y, z as PointCloud2, then ``attrs`` set (a callable gets the message)."""

    def build(scan, t):
        msg = cloud_msg(scan.points, t)
        for name, value in attrs.items():
            setattr(msg, name, value(msg) if callable(value) else value)
        return msg

    return build


def _edit_field(index: int, **attrs):
    """A builder: the scan's x, y, z as PointCloud2 with field ``index`` changed."""

    def build(scan, t):
        msg = cloud_msg(scan.points, t)
        for name, value in attrs.items():
            setattr(msg.fields[index], name, value)
        return msg

    return build


MALFORMED = [  # (name, what, builder, text the refusal names)
    ("pc2_no_z", "fields x and y only", _edit(fields=lambda m: m.fields[:2]), "PointCloud2 has no field z"),
    ("pc2_unknown_datatype", "x of datatype 9", _edit_field(0, datatype=9), "field 'x' has unsupported datatype 9"),
    ("pc2_point_step_too_small", "point_step 8 for 12 bytes of fields", _edit(point_step=8),
     "outside point_step 8"),
    ("pc2_data_one_byte_short", "data one byte short", _edit(data=lambda m: m.data[:-1]), "data holds"),
    ("pc2_row_step_too_small", "row_step < width * point_step", _edit(row_step=lambda m: m.row_step - 1),
     "< width"),
    ("pc2_huge_width", "width 2^32 - 1", _edit(width=2**32 - 1), "width 4294967295"),
    ("pc2_height_without_data", "height 2, data for one row", _edit(height=2), "height 2 * row_step"),
    ("pc2_count_zero", "x of count 0", _edit_field(0, count=0), "field 'x' has count 0"),
    ("pc2_field_twice", "two fields named x", _edit_field(1, name="x"), "field 'x' appears twice"),
    ("pc2_coordinate_count_2", "x of count 2", _edit_field(0, datatype=INT8, count=2), "coordinates need count 1"),
]
for _name, _what, _build, _text in MALFORMED:
    _case(_name, "node: PointCloud2", f"{_what}: refused, 'malformed PointCloud2: ... {_text} ...', no TF",
          NODE_TEST)(lambda b, build=_build, text=_text: one_scan(b, build, ("malformed PointCloud2: ", text),
                                                                   truth=GARBAGE))


def _points(make):
    """A builder of a cloud of ``make(scan.points)``."""
    return lambda scan, t: cloud_msg(make(scan.points), t)


def _byte_order(bigendian_data: bool):
    """A builder flagged is_bigendian; the data really big-endian or left little-endian."""

    def build(scan, t):
        msg = cloud_msg(scan.points, t)
        if bigendian_data:  # every field float32: each 4-byte word swapped
            msg.data = array.array("B", np.frombuffer(msg.data, dtype="<f4").astype(">f4").tobytes())
        msg.is_bigendian = True
        return msg

    return build


def _with_bad_rows(points: np.ndarray) -> np.ndarray:
    out = points.copy()
    out[::20, 0] = np.nan
    out[7::100, 2] = np.inf
    out[11::100, 1] = -np.inf
    return out


def _organized(scan, t):
    """64 rows, NaN where a beam had no return (and every 7th point): an organized driver's cloud."""
    points = scan.points.copy()
    points[::7] = np.nan
    width = -(-len(points) // 64)
    holes = np.full((64 * width - len(points), 3), np.nan, np.float32)
    return cloud_msg(np.vstack([points, holes]), t, shape=(64, width))


def _extra_fields(scan, t):
    n = len(scan.points)
    return cloud_msg(scan.points, t, extra={
        "intensity": np.linspace(0, 1, n, dtype=np.float32), "ring": (np.arange(n) % 64).astype(np.uint16),
        "time": np.linspace(0, 0.1, n), "rgb": np.full((n, 3), 200, np.uint8)})


def _plus_point(x: float, y: float, z: float):
    return _points(lambda p: np.vstack([p, np.array([[x, y, z]], p.dtype)]))


DECODED = [  # (name, what, builder, texts of the refusal or None: trusted and right, truth)
    ("scan_big_endian", "is_bigendian with big-endian data", _byte_order(True), None, None),
    ("scan_byte_order_flag_wrong", "is_bigendian on little-endian data", _byte_order(False),
     ("bad scan: ", "not metric coordinates", "byte-swapped"), GARBAGE),
    ("scan_nan_inf_points", "5 % NaN and 2 % inf points", _points(_with_bad_rows), None, None),
    ("scan_organized_nan_holes", "organized 64 x W with NaN holes", _organized, None, None),
    ("scan_point_at_1e9", "one point at 1e9 m", _plus_point(1e9, 0, 0), None, None),
    ("scan_point_at_1e30", "one point at 1e30 m", _plus_point(0, 1e30, 0), None, None),
    ("scan_float64", "FLOAT64 x, y, z", _points(lambda p: p.astype(np.float64)), None, None),
    ("scan_extra_fields", "intensity, ring, float64 time, rgb", _extra_fields, None, None),
    ("scan_empty", "width 0", _points(lambda p: p[:0]), ("bad scan: 0 finite points (need 100)",), GARBAGE),
    ("scan_all_nan", "1000 NaN points", _points(lambda p: np.full((1000, 3), np.nan, np.float32)),
     ("bad scan: 0 finite points (need 100)",), GARBAGE),
    ("scan_one_point", "1 point", _points(lambda p: p[:1]), ("bad scan: 1 finite points (need 100)",), GARBAGE),
    ("scan_fifty_points", "50 points", _points(lambda p: p[:50]), ("bad scan: 50 finite points (need 100)",), GARBAGE),
]
for _name, _what, _build, _texts, _truth in DECODED:
    _expect = "trusted and right, TF" if _texts is None else f"refused, '{' ... '.join(_texts)}', no TF"
    _case(_name, "node: scan", f"{_what}: {_expect}", NODE_TEST)(
        lambda b, build=_build, texts=_texts, truth=_truth: one_scan(b, build, texts, truth=truth))


def _header(frame_id: str = "velodyne", stamp: float | None = None):
    def build(scan, t):
        return cloud_msg(scan.points, t if stamp is None else stamp, frame_id)

    return build


@_case("stamp_zero", "node: header", "sec 0 nanosec 0: refused, 'stamp is zero', no TF", NODE_TEST)
def stamp_zero(b: "Bench") -> Outcome:
    return one_scan(b, _header(stamp=0.0), ("stamp is zero (sec 0, nanosec 0)",))


@_case("frame_id_odom", "node: header", "frame_id odom: refused, 'is the odometry frame', no odom -> odom",
       NODE_TEST)
def frame_id_odom(b: "Bench") -> Outcome:
    return one_scan(b, _header("odom"), ("frame_id 'odom' is the odometry frame",))


@_case("frame_id_empty", "node: header", "frame_id '': trusted and right, TF odom -> base_link", NODE_TEST)
def frame_id_empty(b: "Bench") -> Outcome:
    return one_scan(b, _header(""))


@_case("stamp_duplicate", "node: header", "the last scan's stamp again: refused, 'duplicate or out of "
       "order', the stamp's one TF stays one", NODE_TEST)
def stamp_duplicate(b: "Bench") -> Outcome:
    return one_scan(b, None, ("not after the last scan's", "(duplicate or out of order)"), dt=0.0)


@_case("stamp_backwards", "node: header", "0.2 s before the last scan: refused, 'not after the last scan', "
       "no TF", NODE_TEST)
def stamp_backwards(b: "Bench") -> Outcome:
    return one_scan(b, None, ("not after the last scan's",), dt=-0.2)


@_case("stamp_loop_back_50s", "node: header", "a bag that loops (the drive again, 50 s earlier): time_reset, "
       "trusted, tracked again, right", NODE_TEST)
def stamp_loop_back(b: "Bench") -> Outcome:
    s = b.session
    s.ensure_track(3)
    reset = s.new_track(t=s.track.t - 50.0, role="case")
    again = [s.next() for _ in range(2)]
    e = Expect()
    e.that(reset.trusted and reset.result.event == "time_reset", "time_reset, trusted")
    e.that(all(x.trusted and not x.result.event for x in again), "tracked again")
    return e.outcome(f"{describe(s, reset)}; then {_counted(s, again)}")


def scans_apart(b: "Bench", count: int, step: int, dt: float, all_trusted: bool) -> Outcome:
    """``count`` scans, each ``step`` frames and ``dt`` seconds after the last; ``all_trusted``:
    each must be trusted (else each may be refused); then the next real scan must be trusted."""
    s = b.session
    s.ensure_track(count * step + 1)
    sents = [s.next(step=step, dt=dt) for _ in range(count)]
    after = s.recover()
    e = Expect()
    if all_trusted:
        e.that(all(x.trusted for x in sents), "all trusted")
    e.that(after.trusted, "the next scan trusted")
    return e.outcome(f"{_counted(s, sents)}; {_next_scan(s, after)}")


@_case("motion_zero", "node: motion", "the same scan three times 0.1 s apart: trusted, identity", NODE_TEST)
def motion_zero(b: "Bench") -> Outcome:
    return scans_apart(b, 3, step=0, dt=0.1, all_trusted=True)


@_case("motion_gap_10s", "node: motion", "the next scan 10 s later: relocalised against the keyframe, "
       "trusted and right", NODE_TEST)
def motion_gap(b: "Bench") -> Outcome:
    s = b.session
    s.ensure_track(2)
    late = s.next(dt=10.0)
    e = Expect()
    e.that(late.trusted and late.result.event == "relocalised", "relocalised, trusted")
    return e.outcome(describe(s, late))


@_case("motion_teleport", "node: motion", f"scans >= {TELEPORT_M:.0f} m away, 0.4 s later: never a trusted "
       "jump; new_segment within max_failures scans, then tracked there", NODE_TEST)
def motion_teleport(b: "Bench") -> Outcome:
    from s2h_ros.config import OdometryConfig

    s = b.session
    s.new_track()
    drive, here = s.track.drive, s.track.i
    poses = drive.poses
    far = [k for k in range(len(drive)) if np.linalg.norm(poses[k, :3, 3] - poses[here, :3, 3]) >= TELEPORT_M]
    max_failures = OdometryConfig().max_failures
    e = Expect()
    if not e.that(len(far) >= max_failures + 2, f"{max_failures + 2} scans >= {TELEPORT_M:.0f} m away"):
        return e.outcome(f"the drive has {len(far)} such scans")
    sents = []
    for k in far[:max_failures + 2]:
        sents.append(s.next(step=k - s.track.i, dt=0.4))
    events = [x.result.event for x in sents]
    lost = events.index("new_segment") if "new_segment" in events else None
    e.that(lost is not None and lost < max_failures, f"new_segment within {max_failures} scans")
    if lost is not None:
        e.that(not any(x.trusted for x in sents[:lost + 1]), "nothing trusted before it")
        e.that(all(x.trusted for x in sents[lost + 1:]), "tracked in the new segment")
    text = "; ".join(f"{round(float(np.linalg.norm(poses[k, :3, 3] - poses[here, :3, 3])))} m: {describe(s, x)}"
                     for k, x in zip(far, sents))
    return e.outcome(text)


@_case("motion_very_fast", "node: motion", "scans 2 frames apart 0.1 s apart (about 60 m/s): trusted and "
       "right or refused, never wrong", NODE_TEST)
def motion_very_fast(b: "Bench") -> Outcome:
    return scans_apart(b, 2, step=2, dt=0.1, all_trusted=False)


@_case("scene_noise", "node: motion", "20,000 uniform random points: not trusted, no TF", NODE_TEST)
def scene_noise(b: "Bench") -> Outcome:
    noise = np.random.default_rng(7).uniform([-40, -40, -2], [40, 40, 6], size=(20_000, 3)).astype(np.float32)
    return one_scan(b, lambda scan, t: cloud_msg(noise, t), (), truth=GARBAGE)


@_case("scene_other_world", "node: motion", "a scan of another town: not trusted, no TF", NODE_TEST)
def scene_other_world(b: "Bench") -> Outcome:
    return one_scan(b, lambda scan, t: cloud_msg(b.scenes.other, t), (), truth=GARBAGE)


@_case("burst", "node: motion", "6 scans published at once: the one-slot buffer drops some, the newest is "
       "answered, trusted and right", NODE_TEST)
def burst(b: "Bench") -> Outcome:
    s = b.session
    s.ensure_track(7)
    tr = s.track
    start_i, start_t = tr.i, tr.t
    sents = []
    for j in range(start_i + 1, start_i + 7):
        t = start_t + s.spacing(tr.drive, start_i, j)
        sents.append(s.send(s.frame_msg(tr.drive, j, t), tr.drive.poses[j], f"{tr.drive.name} {j}", wait=False))
    last = sents[-1]
    s.answer(last, judge=False)  # the answers before it are in by then (one publisher, in order)
    answered = [x for x in sents if x.result is not None]
    for x in answered:
        s.judge(x)
    s.track = Track(tr.drive, start_i + 6 if last.trusted else start_i, t)
    after = s.recover()
    e = Expect()
    e.that(len(answered) < len(sents), "some dropped")
    e.that(last.trusted, "the newest answered and trusted")
    e.that(after.trusted, "the next scan trusted")
    return e.outcome(f"{len(answered)} of {len(sents)} answered, the newest {describe(s, last)}; "
                     f"{_next_scan(s, after)}")


@_case("sensor_vlp16", "node: motion", "5 scans of a 16-beam drive (a new track): all trusted and right", NODE_TEST)
def sensor_vlp16(b: "Bench") -> Outcome:
    s = b.session
    first = s.new_track(drive=b.scenes.vlp16, role="case")
    sents = [first] + [s.next() for _ in range(4)]
    s.track = None  # the next case starts again on the 64-beam drive
    e = Expect()
    e.that(all(x.trusted for x in sents), "all trusted")
    return e.outcome(_counted(s, sents))


@_case("drive_after", "node: drive", "after every case: the whole drive again, all trusted and right", NODE_TEST)
def drive_after(b: "Bench") -> Outcome:
    return _drive(b, len(b.scenes.drive))


@_case("node_sigint", "process", "SIGINT to the node after everything: exit 0 within 30 s", NODE_TEST, final=True)
def node_sigint(b: "Bench") -> Outcome:
    s = b.session
    e = Expect()
    alive = e.that(s.alive(), "running before")
    t0 = time.monotonic()
    s.proc.send_signal(signal.SIGINT)
    try:
        code = s.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        code = None
    e.that(code == 0, "exit 0 within 30 s")
    return e.outcome(f"exit {code} after {time.monotonic() - t0:.1f} s" if alive else "was not running",
                     crashed=code not in (0, None) and code != -signal.SIGINT)


# ---------------------------------------------------------------------------- start-up and process


def _one_line(stderr: str, prefix: str, *texts: str, e: Expect) -> str:
    """The single stderr line, checked to start with ``prefix`` and hold ``texts``."""
    lines = stderr.strip().splitlines()
    e.that(len(lines) == 1, f"one stderr line (got {len(lines)})")
    line = lines[-1] if lines else ""
    e.that(line.startswith(prefix), f"it starts {prefix!r}")
    for text in texts:
        e.that(text in line, f"it holds {text!r}")
    return line


STARTUP_TEST = "test_registration_node.py::test_start_up_failures_exit_2_with_one_line_naming_the_parameter"
STARTUP = [  # (name, override, the line's text after 'invalid configuration: ', test)
    ("startup_wrong_type", "registration.voxel_size:=fast", ("registration.voxel_size",),
     "test_registration_node.py::test_wrong_parameter_type_fails_at_start_up_with_a_clear_message"),
    ("startup_out_of_range", "registration.k:=0", ("registration.k",),
     "test_registration_node.py::test_out_of_range_parameter_fails_at_start_up"),
    ("startup_misspelt_parameter", "registration.voxelsize:=0.3", ("did you mean registration.voxel_size",),
     "test_parameters.py::test_bad_values_and_typos_fail_naming_the_parameter"),
    ("startup_no_cuda", "registration.device:=cuda", ("parameter registration.device", "CUDA is not available"),
     STARTUP_TEST),
    ("startup_missing_weights", "registration.weights:=/nonexistent/weights.pt",
     ("parameter registration.weights", "checkpoint not found"), STARTUP_TEST),
    ("startup_garbage_weights", "registration.weights:={garbage}",
     ("parameter registration.weights", "cannot read checkpoint"), STARTUP_TEST),
    ("startup_bad_topic", "cloud_topic:=bad topic!", ("parameter cloud_topic", "is not a valid topic name"),
     STARTUP_TEST),
    ("startup_base_frame_is_odom", "base_frame:=odom", ("parameter base_frame", "is odom_frame too"), STARTUP_TEST),
]


def startup(b: "Bench", override: str, texts: tuple[str, ...]) -> Outcome:
    """registration_node with one bad parameter: exit 2, one stderr line naming it."""
    import torch

    from s2h_ros.commands.replay import node_command

    if "cuda" in override and torch.cuda.is_available():
        return Outcome("skipped: CUDA is available here", True)
    garbage = b.work / "garbage.pt"
    garbage.write_bytes(np.random.default_rng(0).bytes(4096))
    out = subprocess.run(node_command([], [override.format(garbage=garbage)]), capture_output=True, text=True,
                         timeout=300, env=b.aux_env)
    e = Expect()
    e.that(out.returncode == 2, "exit 2")
    line = _one_line(out.stderr, "registration_node: invalid configuration: ", *texts, e=e)
    return e.outcome(f"exit {out.returncode}: {line}", crashed="Traceback" in out.stderr or out.returncode < 0)


for _name, _override, _texts, _test in STARTUP:
    _case(_name, "start-up", f"-p {_override}: exit 2, one stderr line naming the parameter", _test)(
        lambda b, override=_override, texts=_texts: startup(b, override, texts))


def process_running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def poll_until(condition, timeout: float, interval: float = 0.05) -> bool:
    """For states nothing announces (another process's file, /proc): check every ``interval``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        threading.Event().wait(interval)
    return True


_HOLDER = """import sys
from pathlib import Path
from s2h_ros.commands.replay import registration_node_process
with registration_node_process(Path(sys.argv[1])) as proc:
    print(proc.pid, flush=True)
    sys.stdin.read()
"""


@_case("process_parent_killed", "process", "kill -9 of the process that started the node: the node exits too",
       "test_process_faults.py::test_kill_9_of_s2h_replay_takes_its_node_with_it")
def process_parent_killed(b: "Bench") -> Outcome:
    log = b.work / "holder_node.log"
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(log)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=b.aux_env)
    e = Expect()
    try:
        pid = int(holder.stdout.readline())
        e.that(poll_until(lambda: "registering" in log.read_text(), ANSWER_TIMEOUT_S), "the node came up")
        holder.kill()
        holder.wait(timeout=30)
        t0 = time.monotonic()
        gone = e.that(poll_until(lambda: not process_running(pid), 30.0), "the node exited within 30 s")
    finally:
        holder.kill()
        holder.wait()
    if not gone:
        os.kill(pid, signal.SIGKILL)
    return e.outcome(f"node gone {time.monotonic() - t0:.1f} s after its parent" if gone else "node still running")


class ResultCounter:
    """Counts registration_node results in DDS domain ``domain`` (an rclpy context of its own)."""

    def __init__(self, domain: int) -> None:
        import rclpy
        from rclpy.context import Context
        from rclpy.executors import SingleThreadedExecutor

        from s2h_ros.msg import RegistrationResult
        from s2h_ros.ros.replay import RELIABLE

        self.context = Context()
        rclpy.init(context=self.context, domain_id=domain)
        self.node = rclpy.create_node("robustness_counter", context=self.context)
        self.count = 0
        self._cv = threading.Condition()
        self.node.create_subscription(RegistrationResult, "/registration_node/result", self._on_result, RELIABLE)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        threading.Thread(target=self.executor.spin, daemon=True).start()

    def _on_result(self, _msg) -> None:
        with self._cv:
            self.count += 1
            self._cv.notify_all()

    def wait_for(self, n: int, timeout: float) -> bool:
        with self._cv:
            return self._cv.wait_for(lambda: self.count >= n, timeout)

    def close(self) -> None:
        import rclpy

        self.executor.shutdown()
        self.node.destroy_node()
        rclpy.try_shutdown(context=self.context)


@_case("process_replay_sigint", "process", "SIGINT to s2h replay mid-drive: exit 130, metrics of the scans "
       "answered so far written, marked interrupted; its node exits",
       "test_process_faults.py::test_stopping_s2h_replay_writes_the_metrics_answered_so_far")
def process_replay_sigint(b: "Bench") -> Outcome:
    import json

    if b.scenes.drive_dir is None:
        return Outcome("skipped: no drive on disk", True)
    out_dir = b.work / "replay_sigint"
    counter = ResultCounter(int(b.aux_env["ROS_DOMAIN_ID"]))
    e = Expect()
    try:
        replay = subprocess.Popen([sys.executable, "-m", "s2h_ros.cli", "replay", str(b.scenes.drive_dir), "--rate",
                                   "0", "--out", str(out_dir)], env=b.aux_env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        try:
            node_pid = int(re.search(r"pid (\d+)", replay.stdout.readline()).group(1))
            e.that(counter.wait_for(2, ANSWER_TIMEOUT_S), "two scans answered")
            replay.send_signal(signal.SIGINT)
            stdout, stderr = replay.communicate(timeout=120)
        finally:
            replay.kill()
    finally:
        counter.close()
    e.that(replay.returncode == 130, "exit 130")
    e.that("s2h replay: stopped by SIGINT after" in stderr, "stderr says it stopped")
    report = json.loads((out_dir / "metrics.json").read_text()) if (out_dir / "metrics.json").exists() else {}
    e.that(report.get("interrupted") == "SIGINT", "metrics.json marked interrupted")
    e.that(report.get("scans_answered", 0) >= 1, "metrics of the answered scans")
    e.that(poll_until(lambda: not process_running(node_pid), 30.0), "its node exited")
    return e.outcome(f"exit {replay.returncode}, metrics.json: {report.get('scans_answered')} of "
                     f"{report.get('scans_published')} scans answered, interrupted {report.get('interrupted')}",
                     crashed="Traceback" in stderr)


# ---------------------------------------------------------------------------- s2h register


PCD_XYZ = "VERSION 0.7\nFIELDS x y z\nSIZE 4 4 4\nTYPE F F F\nCOUNT 1 1 1\nWIDTH 3\nHEIGHT 1\nPOINTS 3\nDATA ascii\n"
PLY_XYZ = ("ply\nformat ascii 1.0\nelement vertex {n}\nproperty float x\nproperty float y\nproperty float z\n"
           "end_header\n")


def _kitti_bin(b: "Bench") -> Path:
    from s2h_ros.datasets.io import write_points

    path = b.work / "cli" / "kitti.bin"
    if not path.exists():
        write_points(path, b.kitti_scan, intensity=np.full(len(b.kitti_scan), 0.5, np.float32))
    return path


def _file(b: "Bench", name: str, data: bytes | str) -> Path:
    path = b.work / "cli" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def _npy(b: "Bench", name: str, array: np.ndarray) -> Path:
    path = b.work / "cli" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, array)
    return path


def _near(b: "Bench") -> np.ndarray:
    """The KITTI sample within 20 m (about 18k points): registers to itself in about a second."""
    return b.kitti_scan[np.linalg.norm(b.kitti_scan[:, :2], axis=1) < 20.0]


def _cli_absurd_point(b: "Bench") -> list:
    from s2h_ros.datasets.io import write_points

    good = write_points(b.work / "cli" / "good.bin", _near(b))
    bad = write_points(b.work / "cli" / "bad.bin", np.vstack([_near(b), [[1e9, 0, 0]]]))
    return [bad, good, "--json", b.work / "cli" / "absurd.json"]


def _cli_boxes(b: "Bench") -> list:
    rng = np.random.default_rng(3)
    a, c = (_npy(b, f"box_{k}.npy", rng.uniform(-10, 10, size=(3000, 3))) for k in "ac")
    return [a, c, "--features", "fpfh", "--ransac-iters", "1000", "--json", b.work / "cli" / "boxes.json"]


BAD_INPUT_TEST = "test_bad_input.py::"
CLI = [  # (name, what, arguments, exit status, texts of the stderr line, test)
    ("cli_missing_file", "a file that does not exist",
     lambda b: [b.work / "cli" / "nope.ply", _kitti_bin(b)], 2, ("not found", "nope.ply"), "test_missing_file"),
    ("cli_unknown_extension", "a .xyz file", lambda b: [_file(b, "c.xyz", "1 2 3\n"), _kitti_bin(b)], 2,
     ("unknown point-cloud extension",), "test_wrong_extension"),
    ("cli_empty_file", "an empty .pcd", lambda b: [_file(b, "e.pcd", b""), _kitti_bin(b)], 2, ("empty file",),
     "test_empty_file"),
    ("cli_random_bytes_bin", "16000 random bytes as .bin",
     lambda b: [_file(b, "rand.bin", np.random.default_rng(1).bytes(16000)), _kitti_bin(b)], 2,
     ("rand.bin:", "is negative: not a KITTI .bin"), "test_random_bytes_as_bin_are_refused_not_hashed"),
    ("cli_truncated_bin", "a KITTI .bin cut at 15000 bytes",
     lambda b: [_file(b, "cut.bin", _kitti_bin(b).read_bytes()[:15000]), _kitti_bin(b)], 2,
     ("truncated or not a KITTI .bin",), "test_truncated_n_by_4_bin_whose_size_divides_by_24_is_refused"),
    ("cli_bad_columns", "--columns 5", lambda b: [_kitti_bin(b), _kitti_bin(b), "--columns", "5"], 2,
     ("4 or 6 float32 columns, not 5",), "test_six_column_bin_needs_normals_or_an_explicit_columns"),
    ("cli_ply_negative_count", "PLY 'element vertex -5'",
     lambda b: [_file(b, "neg.ply", PLY_XYZ.format(n=-5) + "1 2 3\n"), _kitti_bin(b)], 2, ("element vertex -5",),
     "test_ply_with_a_negative_vertex_count_never_reaches_open3d"),
    ("cli_pcd_text_row", "an ASCII PCD row of words",
     lambda b: [_file(b, "rows.pcd", PCD_XYZ + "1 2 3\nfoo bar baz\n4 5 6\n"), _kitti_bin(b)], 2,
     ("line 11", "is not 3 numbers"), "test_ascii_pcd_row_that_is_not_three_numbers_is_an_error"),
    ("cli_npy_transposed", "a 3 x N .npy", lambda b: [_npy(b, "t.npy", b.kitti_scan[:500].T), _kitti_bin(b)], 2,
     ("looks transposed",), "test_npy_of_shape_3_by_n_is_refused_with_the_transpose_hint"),
    ("cli_npy_no_points", "a 0 x 3 .npy",
     lambda b: [_npy(b, "zero.npy", np.zeros((0, 3), np.float32)), _kitti_bin(b)], 2, ("no points",),
     "test_zero_size_and_flat_arrays"),
    ("cli_npy_all_nan", "a .npy of NaN", lambda b: [_npy(b, "nan.npy", np.full((10, 3), np.nan, np.float32)),
                                                    _kitti_bin(b)], 2, ("all 10 points are NaN or infinite",),
     "test_nan_and_inf_rows_are_dropped_and_counted"),
    ("cli_bad_voxel_size", "--voxel-size -1", lambda b: [_kitti_bin(b), _kitti_bin(b), "--voxel-size", "-1"], 2,
     ("voxel_size: -1.0 is outside",), "test_bad_options_are_one_line_and_exit_2"),
    ("cli_bad_gt", "--gt of 6 numbers",
     lambda b: [_kitti_bin(b), _kitti_bin(b), "--gt", _file(b, "gt.txt", "1 0 0\n0 1 0\n")], 2,
     ("--gt", "expected 16 finite numbers"), "test_bad_options_are_one_line_and_exit_2"),
    ("cli_json_unwritable", "--json under a file", lambda b: [_kitti_bin(b), _kitti_bin(b), "--voxel-size", "1",
                                                              "--json", _kitti_bin(b) / "r.json"], 2,
     ("cannot write --json",), "test_unwritable_json_exits_2_naming_it"),
    ("cli_absurd_point", "a point at 1e9 m in the source file", _cli_absurd_point, 0,
     ("warning: source: dropped 1 points more than",),
     "test_absurd_point_in_a_file_is_a_warning_and_the_result_is_trusted"),
    ("cli_unrelated_clouds", "two unrelated random boxes", _cli_boxes, 1, ("not trusted:",),
     "test_not_trusted_exits_1_with_the_reason_on_stderr"),
]


def cli(b: "Bench", arguments, status: int, texts: tuple[str, ...]) -> Outcome:
    """``s2h register`` as a subprocess: the exit status, one stderr line holding ``texts``; a
    trusted result (exit 0) checked against the truth where the case has one (identity)."""
    import json

    out = subprocess.run([sys.executable, "-m", "s2h_ros.cli", "register", *map(str, arguments(b))],
                         capture_output=True, text=True, timeout=600)
    e = Expect()
    e.that(out.returncode == status, f"exit {status}")
    line = _one_line(out.stderr, "s2h register: ", *texts, e=e)
    wrong = None
    if out.returncode == 0:  # the only trusted case registers a cloud to itself
        result = json.loads((b.work / "cli" / "absurd.json").read_text())
        re_deg, te_m = geometry.transform_errors(np.array(result["transform"]), np.eye(4))
        wrong = bool(te_m > MAX_TE_M or re_deg > MAX_RE_DEG)
        line += f" (transform {100 * te_m:.1f} cm / {re_deg:.2f} deg from the truth)"
    elif out.returncode == 1:
        wrong = False
    return e.outcome(f"exit {out.returncode}: {line}", trusted_wrong=wrong,
                     crashed="Traceback" in out.stderr or out.returncode not in (0, 1, 2, 3))


for _name, _what, _arguments, _status, _texts, _test in CLI:
    _case(_name, "s2h register", f"{_what}: exit {_status}, one stderr line '{' ... '.join(_texts)}'",
          BAD_INPUT_TEST + _test)(lambda b, a=_arguments, s=_status, t=_texts: cli(b, a, s, t))


# ---------------------------------------------------------------------------- library


def _refused_by_register(source, target, *texts: str) -> Outcome:
    from s2h_ros.cloud import RegistrationError
    from s2h_ros.pipeline import register

    e = Expect()
    try:
        result = register(source, target)
    except RegistrationError as exc:
        for text in texts:
            e.that(text in str(exc), f"the error holds {text!r}")
        return e.outcome(f"RegistrationError: {exc}", trusted_wrong=False)
    e.that(False, "RegistrationError")
    return e.outcome(f"returned success={result.success}", trusted_wrong=bool(result.success))


@_case("lib_float32_georeferenced", "library", "register() of float32 UTM coordinates: RegistrationError "
       "'pass float64'", BAD_INPUT_TEST + "test_float32_georeferenced_coordinates_are_refused_not_collapsed")
def lib_float32_georeferenced(b: "Bench") -> Outcome:
    offset = np.array([500000.0, 5400000.0, 0.0])
    near = _near(b).astype(np.float64)
    return _refused_by_register((near + offset).astype(np.float32), near + offset, "float32 coordinates",
                                "pass float64")


@_case("lib_too_few_points", "library", "register() of 2 points: RegistrationError 'only 2 occupied voxels'",
       BAD_INPUT_TEST + "test_too_few_points")
def lib_too_few_points(b: "Bench") -> Outcome:
    return _refused_by_register(np.array([[0.0, 0.0, 0.0], [10.0, 0.0, 0.0]]), b.kitti_scan,
                                "source has only 2 occupied voxels")


@_case("lib_transposed_array", "library", "register() of a 3 x N array: RegistrationError 'looks transposed'",
       BAD_INPUT_TEST + "test_npy_of_shape_3_by_n_is_refused_with_the_transpose_hint")
def lib_transposed_array(b: "Bench") -> Outcome:
    return _refused_by_register(b.kitti_scan[:500].T, b.kitti_scan, "looks transposed")


@_case("lib_georeferenced_1e6", "library", "register() of the real KITTI loop pair moved 1,000 km: trusted, "
       "right (0.3 m / 2 deg of the ground truth)",
       BAD_INPUT_TEST + "test_georeferenced_pair_registers_as_at_the_origin")
def lib_georeferenced(b: "Bench") -> Outcome:
    from s2h_ros.datasets.kitti import kitti_loop_pair
    from s2h_ros.pipeline import register

    pair = kitti_loop_pair()
    o = np.array([1e6 + 123.45, -1e6 + 67.8, 30.1])
    result = register(pair.source.astype(np.float64) + o, pair.target.astype(np.float64) + o)
    re_deg, te_m = geometry.transform_errors(geometry.shift_transform(result.transform, -o, -o), pair.T_gt)
    e = Expect()
    e.that(result.success, "trusted")
    wrong = bool(result.success and (te_m > MAX_TE_M or re_deg > MAX_RE_DEG))
    e.that(not wrong, "right")
    return e.outcome(f"success={result.success}, {100 * te_m:.1f} cm / {re_deg:.2f} deg from the ground truth",
                     trusted_wrong=wrong)


# ---------------------------------------------------------------------------- running


class Bench:
    """What the cases run against: the node session (started at the first node case), a work
    folder, the scenes, and a DDS domain apart (``aux_env``) for the processes cases start."""

    def __init__(self, scenes: Scenes, work: Path, overrides=(), context=None, env: dict | None = None) -> None:
        self.scenes, self.work, self.overrides, self.context = scenes, Path(work), list(overrides), context
        self.work.mkdir(parents=True, exist_ok=True)
        self.env = dict(os.environ if env is None else env)
        domain = int(self.env.get("ROS_DOMAIN_ID") or 0)
        self.aux_env = dict(self.env, ROS_DOMAIN_ID=str((domain + 1) % 232))
        self._session: NodeSession | None = None
        self._kitti_scan: np.ndarray | None = None

    @property
    def session(self) -> NodeSession:
        if self._session is None:
            self._session = NodeSession(self.scenes, self.work, self.overrides, self.context, self.env)
            self._session.start()
        return self._session

    @property
    def kitti_scan(self) -> np.ndarray:
        """A real KITTI scan (the bundled loop pair's source), (N, 3) float32."""
        if self._kitti_scan is None:
            from s2h_ros import paths
            from s2h_ros.datasets.io import read_points

            self._kitti_scan = read_points(paths.KITTI_LOOP_PAIR[0])
        return self._kitti_scan

    def close(self) -> None:
        if self._session is not None:
            self._session.close()


def run_case(b: Bench, case: Case) -> dict:
    """One case as a table row (a dict): its outcome, whether the node crashed (then restarted),
    whether anything trusted was wrong, the scans it sent."""
    session = b._session
    mark = len(session.sent) if session is not None else 0
    t0 = time.monotonic()
    try:
        out = case.run(b)
    except NoAnswer as exc:
        out = Outcome(f"no answer: {exc}", False, crashed=True)
    except Exception as exc:  # the bench's own failure: one row says so and the run goes on
        out = Outcome(f"bench error: {type(exc).__name__}: {' '.join(str(exc).split())}", False)
    seconds = time.monotonic() - t0
    row = {"name": case.name, "layer": case.layer, "expect": case.expect, "test": case.test}
    session = b._session
    if case.layer.startswith("node:") and session is not None:
        sent = session.sent[mark:]
        out.trusted_wrong = any(s.wrong for s in sent)
        row["case_trusted_wrong"] = any(s.wrong for s in sent if s.role == "case")
        row["wrong_drive_scans"] = [s.label for s in sent if s.wrong and s.role == "drive"]
        row["scans"] = [{"label": s.label, "role": s.role, "stamp_ns": s.stamp_ns, "answered": s.result is not None,
                         "success": s.trusted, "message": s.result.message if s.result else None,
                         "event": s.result.event if s.result else None, "tf": session.new_tf(s), "wrong": s.wrong,
                         "error_m_deg": s.error} for s in sent]
        if not session.alive():
            out.crashed = True
            row["node_exit"] = session.proc.returncode
            row["node_log"] = str(session.logs[-1])
            session.restart()
    row.update(outcome=out.outcome, expected=out.expected, crashed=out.crashed, trusted_wrong=out.trusted_wrong,
               seconds=round(seconds, 2), **out.details)
    return row


def _cell(text: str) -> str:
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= CELL_CHARS else text[:CELL_CHARS - 3] + "..."


def cases_table(rows: list[dict]) -> str:
    from s2h_ros.evaluation.report import markdown_table

    def yes(value) -> str:
        return "n/a" if value is None else ("**YES**" if value else "no")

    def wrong(r: dict) -> str:
        if r["trusted_wrong"] and not r.get("case_trusted_wrong", True):
            return f"**YES**: drive scan {', '.join(x.split()[-1] for x in r['wrong_drive_scans'])}, not the case's own"
        return yes(r["trusted_wrong"])

    return markdown_table(["case", "layer", "outcome", "crashed?", "trusted wrong?", "as expected?"],
                          [[r["name"], r["layer"], _cell(r["outcome"]), yes(r["crashed"]), wrong(r),
                            "yes" if r["expected"] else "**NO**"] for r in rows])


# ---------------------------------------------------------------------------- soak


class Sampler:
    """The node's RSS and the machine's 1-minute load average every ``period`` seconds."""

    def __init__(self, pid: int, period: float = 5.0) -> None:
        from s2h_ros.benchmarks.replay import _rss_mb

        self.samples: list[tuple[float, float, float]] = []  # (s, MB, load)
        self._stop = threading.Event()
        t0 = time.monotonic()

        def sample() -> None:
            while True:
                mb = _rss_mb(pid)
                if mb is not None:
                    self.samples.append((time.monotonic() - t0, mb, os.getloadavg()[0]))
                if self._stop.wait(period):
                    return

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def rss_trend(samples: list[tuple[float, float, float]]) -> dict:
    """Start, end, max and the least-squares slope (MB per minute), over all samples and the second half."""
    if len(samples) < 3:
        return {"samples": len(samples)}
    t = np.array([s[0] for s in samples]) / 60.0
    mb = np.array([s[1] for s in samples])
    half = len(t) // 2
    return {"start_mb": float(mb[0]), "end_mb": float(mb[-1]), "max_mb": float(mb.max()),
            "trend_mb_per_min": float(np.polyfit(t, mb, 1)[0]),
            "trend_second_half_mb_per_min": float(np.polyfit(t[half:], mb[half:], 1)[0]),
            "samples": [(round(float(a), 1), round(float(m), 1)) for a, m in zip(t * 60, mb)][:: max(1, len(t) // 40)]}


def judge_stream(seq, record) -> dict:
    """The trusted poses of a replay (``SequenceReplayer.record``) against the ground truth: each
    step from the previous trusted scan of the same segment (wrong beyond 0.3 m / 2 deg), and the
    RMS position error of the trusted poses (all relative to the first scan published). Every
    answered scan is listed (``answered``: stream index, stamp, success, event, keyframe, message)
    so that the run can be replayed offline; the wrong steps with their errors (``wrong``)."""
    gt = seq.poses
    index = dict(zip(record.stamps_ns, record.indices))
    origin = geometry.invert_transform(gt[record.indices[0]])
    errors, wrong, offsets, last = [], [], [], None
    answered = [{"k": index[key], "stamp_ns": key, **{f: r[f] for f in ("success", "event", "keyframe_id", "message")}}
                for key, r in sorted(record.results.items()) if key in index]
    for key in sorted(k for k in record.poses if k in index):
        result, pose, truth = record.results.get(key, {}), record.poses[key], origin @ gt[index[key]]
        offsets.append(float(np.linalg.norm(pose[:3, 3] - truth[:3, 3])))
        if last is not None and last[2] == result.get("segment") and result.get("event") not in FIRST_OF_TRACK:
            errors.append(step_error(last[0], pose, last[1], truth))
            if is_wrong(errors[-1]):
                wrong.append({"k": index[key], "from_k": last[3], "error_m_deg": errors[-1],
                              "true_step_m": float(np.linalg.norm(truth[:3, 3] - last[1][:3, 3])),
                              "event": result.get("event"), "message": result.get("message"),
                              "keyframe_id": result.get("keyframe_id")})
        last = (pose, truth, result.get("segment"), index[key])
    return {"steps_judged": len(errors), "steps_wrong": len(wrong),
            "worst_step": (max(e[0] for e in errors), max(e[1] for e in errors)) if errors else None,
            "position_rmse_m": float(np.sqrt(np.mean(np.square(offsets)))) if offsets else None,
            "wrong": wrong, "answered": answered}


def soak(b: Bench, minutes: float, rate: float = 10.0) -> dict:
    """The 10 Hz drive, to and fro, stamps always increasing, into the node for ``minutes``."""
    from s2h_ros.ros.replay import SequenceReplayer, replay_report

    if b.scenes.stream is None:
        raise ValueError("the soak needs the 10 Hz drive (Scenes.stream)")
    s = b.session
    count = int(round(minutes * 60.0 * rate))
    seq = Resampled(b.scenes.stream, back_and_forth(len(b.scenes.stream), count), period=1.0 / rate, name="soak")
    start = s.next_epoch(count / rate)
    replayer = SequenceReplayer(seq, name="robustness_soak", topic="points", context=b.context, start_time=start)
    s.probe.executor.add_node(replayer)
    sampler = Sampler(s.proc.pid)
    t0 = time.monotonic()
    try:
        replayer.run(rate=rate, settle_timeout=60.0)
    finally:
        duration = time.monotonic() - t0
        sampler.stop()
        s.probe.executor.remove_node(replayer)
    record = replayer.record
    report, _, _ = replay_report(seq, record)
    replayer.destroy_node()
    s.track = None
    minute = [0] * (int(duration // 60) + 1)
    for wall in record.result_wall.values():
        minute[min(int((wall - t0) // 60), len(minute) - 1)] += 1
    loads = [x[2] for x in sampler.samples]
    return {
        "minutes": minutes, "rate_hz": rate, "duration_s": duration, "scans_published": report["scans_published"],
        "scans_answered": report["scans_answered"], "processed_rate_hz": report["scans_answered"] / duration,
        "scans_trusted": report["scans_trusted"], "scans_failed": report["scans_failed"],
        "scans_dropped": report["scans_dropped"], "events": report["events"],
        "step_ms": report.get("step_ms"), "latency_ms": report.get("latency_ms"),
        "trusted_poses": judge_stream(seq, record), "answered_per_minute": minute,
        "node_alive_after": s.alive(), "crashes": 0 if s.alive() else 1, "rss": rss_trend(sampler.samples),
        "load_avg_1min": {"mean": float(np.mean(loads)) if loads else None, "max": max(loads, default=None)},
        "cpu_count": os.cpu_count(),
    }


def _judged(j: dict) -> str:
    if not j["steps_judged"]:
        return "-"
    return (f"{j['steps_wrong']} of {j['steps_judged']} steps wrong (worst {100 * j['worst_step'][0]:.0f} cm / "
            f"{j['worst_step'][1]:.1f} deg); position RMS error {j['position_rmse_m']:.2f} m")


def soak_table(r: dict) -> str:
    from s2h_ros.evaluation.report import markdown_table

    rss = r["rss"]
    return markdown_table(["soak", "value"], [
        ["stream", f"{r['rate_hz']:g} Hz 64-beam for {r['duration_s'] / 60:.1f} min: {r['scans_published']} scans"],
        ["processed", f"{r['scans_answered']} scans, {r['processed_rate_hz']:.2f} Hz "
                      f"(per minute: {', '.join(map(str, r['answered_per_minute']))})"],
        ["trusted / failed / dropped", f"{r['scans_trusted']} / {r['scans_failed']} / {r['scans_dropped']}"],
        ["continuity events", ", ".join(f"{k} {v}" for k, v in r["events"].items()) or "none"],
        ["processing per scan p50 / p95", f"{r['step_ms']['p50']:.0f} / {r['step_ms']['p95']:.0f} ms"
         if r["step_ms"] else "-"],
        ["trusted poses vs ground truth", _judged(r["trusted_poses"])],
        ["node RSS", f"{rss.get('start_mb', 0):.0f} MB -> {rss.get('end_mb', 0):.0f} MB (max "
                     f"{rss.get('max_mb', 0):.0f}); trend {rss.get('trend_mb_per_min', 0):+.2f} MB/min, second half "
                     f"{rss.get('trend_second_half_mb_per_min', 0):+.2f} MB/min"],
        ["crashes", str(r["crashes"])],
        ["machine", f"{r['cpu_count']} cores, 1-min load average mean {r['load_avg_1min']['mean'] or 0:.1f}, "
                    f"max {r['load_avg_1min']['max'] or 0:.1f}"],
    ])


# ---------------------------------------------------------------------------- the command


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cases", default="", metavar="REGEX", help="only the cases whose name matches")
    parser.add_argument("--soak-minutes", type=float, default=0.0,
                        help="after the cases, stream the drive at 10 Hz into the node for this long (0: no soak)")
    parser.add_argument("--markdown", type=Path, help="also write the table(s) here")
    parser.add_argument("--cache", type=Path, default=Path("results/bench_robustness"),
                        help="the drive, node logs and scratch files go here")
    parser.add_argument("-p", "--param", action="append", default=[], metavar="NAME:=VALUE",
                        help="registration_node parameter override")


def run(args: argparse.Namespace) -> dict:
    import rclpy

    from s2h_ros.outputs import write_text

    selected = [c for c in CASES if re.search(args.cases, c.name)]
    scenes = make_scenes(args.cache)
    rclpy.init(args=[])
    bench = Bench(scenes, args.cache / "work", overrides=args.param)
    rows, soak_result = [], None
    load_before = os.getloadavg()
    try:
        for case in [c for c in selected if not c.final]:
            rows.append(run_case(bench, case))
            print(f"{case.name}: {rows[-1]['outcome']}", file=sys.stderr, flush=True)
        if args.soak_minutes > 0:
            soak_result = soak(bench, args.soak_minutes)
        for case in [c for c in selected if c.final]:
            rows.append(run_case(bench, case))
    finally:
        bench.close()
        rclpy.try_shutdown()
    table = cases_table(rows)
    text = table + ("\n" + soak_table(soak_result) if soak_result else "")
    print(text, end="")
    if args.markdown:
        write_text(args.markdown, text)
    return {
        "cases": rows, "table": table, "soak": soak_result,
        "summary": {"cases": len(rows), "as_expected": sum(r["expected"] for r in rows),
                    "crashed": sum(bool(r["crashed"]) for r in rows),
                    "trusted_wrong": sum(bool(r["trusted_wrong"]) for r in rows)},
        "node_logs": [str(p) for p in (bench._session.logs if bench._session else [])],
        "load_avg_before": load_before, "load_avg_after": os.getloadavg(), "cpu_count": os.cpu_count(),
    }
