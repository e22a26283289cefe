"""ROS parameters of the s2h_ros nodes: typed, described, range-checked, read-only where they
cannot change at run time, and forgiving about how numbers are typed.

registration_node mirrors the core dataclasses field by field (``RegistrationConfig`` under
``registration.``, ``OdometryConfig`` under ``odometry.``) plus ``NODE_PARAMETERS``; kitti_replay
declares ``REPLAY_PARAMETERS`` on its own node, so ``--params-file`` and ``ros2 param`` reach both.

ROS parses ``-p rate:=10`` as an integer, ``-p sequence:=00`` as the integer 0 and a YAML
``[0, 0, 0, 0, 0, 0, 1]`` as an integer array; a parameter declared as double or string then
fails with InvalidParameterTypeException. :func:`declare` reads such a value untyped, converts it
when the conversion loses nothing (int -> float, a whole float -> int, a number -> string, an
integer array -> a double array) and declares the parameter with its real type and that value;
anything else is a ConfigError naming the parameter. An override for a parameter the node does
not declare (a typo) is a ConfigError too, with the closest known name.
"""
from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np
from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor, ParameterType
from rclpy.exceptions import InvalidParameterTypeException, InvalidParameterValueException
from rclpy.node import Node

from s2h_ros import geometry
from s2h_ros.config import ConfigError, OdometryConfig, RegistrationConfig, config_from_dict, describe

_ROS_TYPE = {
    bool: ParameterType.PARAMETER_BOOL,
    int: ParameterType.PARAMETER_INTEGER,
    float: ParameterType.PARAMETER_DOUBLE,
    str: ParameterType.PARAMETER_STRING,
    list: ParameterType.PARAMETER_DOUBLE_ARRAY,
}

# Parameters every rclpy node owns, and rclpy's QoS override namespace: never "unknown".
_BUILT_IN = ("use_sim_time", "start_type_description_service")
_BUILT_IN_PREFIXES = ("qos_overrides.",)


@dataclass(frozen=True)
class ParamSpec:
    """One parameter: its default (whose Python type is the parameter type), text, range, and
    whether it may change while the node runs (``read_only`` ones are fixed at start-up)."""

    name: str
    default: Any
    description: str
    range: tuple = (None, None)
    read_only: bool = True

    @property
    def type(self) -> type:
        return type(self.default)


NODE_PARAMETERS: tuple[ParamSpec, ...] = (
    ParamSpec("cloud_topic", "points", "PointCloud2 input topic"),
    ParamSpec("qos", "sensor_data", "input QoS: sensor_data (best effort) or reliable (bag replay)"),
    ParamSpec("odom_frame", "odom", "fixed odometry frame (REP-105)"),
    ParamSpec("base_frame", "base_link", "robot base frame; empty: publish odom -> sensor frame"),
    ParamSpec("sensor_to_base", [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0],
              "sensor pose in base_frame [x, y, z, qx, qy, qz, qw], used until tf2 or /tf_static gives one"),
    ParamSpec("publish_tf", True, "broadcast odom -> base (or sensor) for trusted scans"),
    ParamSpec("max_markers", 500, "most correspondence lines drawn per scan (changeable at run time)", (0, 100000),
              read_only=False),
    ParamSpec("keyframe_cloud_max_points", 20000,
              "most keyframe points published on ~/keyframe_cloud (changeable at run time)", (0, 10_000_000),
              read_only=False),
    ParamSpec("path_max_length", 1000, "most poses kept in the published ~/path (oldest dropped)", (1, 1_000_000)),
    ParamSpec("diagnostics_period", 1.0, "seconds between diagnostics messages", (0.05, 3600.0)),
    ParamSpec("prepare_ahead", True, "prepare the next scan (voxels, features) on a second thread while the one before "
              "is registered (s2h_ros.handover); false: one scan at a time, about 100 ms less latency (2-core VM at 10 Hz: "
              "in process 1.2-1.4x the scans ahead; over DDS with the replayer on the same cores 1.2x on a VLP-32 drive, "
              "0.9x on an HDL-64 one; docs/performance.md)"),
    ParamSpec("prepare_overlap", 1.0, "with prepare_ahead, the fraction of a typical preparation that may run beside "
              "the registration before it (s2h_ros.handover): 1 starts the next scan's preparation so that it is ready "
              "when the registration ends (the most scans per second), smaller values start it later: less latency where "
              "the two threads slow each other, fewer scans (2-core VM, held-out HDL-64 drive at 10 Hz, config/cpu.yaml: "
              "1 -> 0.25 latency p95 378-466 -> 327-399 ms, 5.7-7.5 -> 5.1-6.0 scans/s; on a second drive with corners "
              "the slower rate cost a lost track; docs/performance.md)", (0.0, 1.0)),
    ParamSpec("cpu_threads", 0, "CPU threads of torch, BLAS and scipy (config.use_cpu_threads); 0: with device cpu all cores but one (at least 1), which "
              "stays free for the executor and DDS (2-core VM, 64-beam stream at 10 Hz: 1 thread answered 123 scans, "
              "latency p50 340 ms; 2 threads 69 scans, 766 ms: OpenMP threads stall when a core is taken); with a GPU device 1 (H200: step p50 200 -> 152 ms, "
              "docs/performance.md)", (0, 1024)),
)

REPLAY_PARAMETERS: tuple[ParamSpec, ...] = (
    ParamSpec("sequence_dir", "", "KITTI odometry root (with sequence) or one sequence folder (velodyne/, poses.txt, calib.txt)"),
    ParamSpec("sequence", "", "sequence id under sequence_dir/sequences (empty: sequence_dir is one sequence)"),
    ParamSpec("rate", 10.0, "scans per second; 0: lock-step (next scan when the node has answered); -1: the rate this "
              "machine sustains (s2h_ros.ros.replay.sustainable_rate of a lock-step warm-up)", (-1.0, 1000.0)),
    ParamSpec("start", 0, "first frame", (0, 10_000_000)),
    ParamSpec("end", -1, "one past the last frame (-1: all)", (-1, 10_000_000)),
    ParamSpec("topic", "points", "PointCloud2 topic to publish"),
    ParamSpec("frame_id", "velodyne", "frame of the published clouds"),
    ParamSpec("base_frame", "base_link", "robot base frame: base_frame -> frame_id goes to /tf_static (empty: none)"),
    ParamSpec("reliable", True, "publish with reliable QoS (else sensor-data QoS)"),
    ParamSpec("node_name", "registration_node", "name of the registration node to listen to"),
    ParamSpec("output_dir", "results/replay", "where metrics.json, trajectory.png and poses go"),
    ParamSpec("sensor_to_base", [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0],
              "sensor pose in base_frame [x, y, z, qx, qy, qz, qw] (as registration_node's)"),
    ParamSpec("discovery_timeout", 60.0, "seconds to wait for registration_node to appear", (0.0, 3600.0)),
)


@dataclass
class NodeSettings:
    registration: RegistrationConfig
    odometry: OdometryConfig
    node: dict


def _descriptor(spec: ParamSpec) -> ParameterDescriptor:
    d = ParameterDescriptor(name=spec.name, type=_ROS_TYPE[spec.type], description=spec.description,
                            read_only=spec.read_only)
    lo, hi = spec.range
    if lo is not None and spec.type is float:
        d.floating_point_range = [FloatingPointRange(from_value=float(lo), to_value=float(hi), step=0.0)]
    elif lo is not None and spec.type is int and hi <= 2**63 - 1:
        d.integer_range = [IntegerRange(from_value=int(lo), to_value=int(hi), step=1)]
    return d


def coerce(value: Any, typ: type) -> Any:
    """``value`` as ``typ`` when nothing is lost (see the module text); ValueError otherwise."""
    if isinstance(value, typ) and not (typ is int and isinstance(value, bool)):
        return list(value) if typ is list else value
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if typ is int and isinstance(value, float) and math.isfinite(value) and value == int(value):
        return int(value)
    if typ is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if typ is list and isinstance(value, (list, tuple, np.ndarray)) and all(
            isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) for v in value):
        return [float(v) for v in value]
    raise ValueError(f"expected {typ.__name__}, got {type(value).__name__} {value!r}")


def declare(node: Node, spec: ParamSpec) -> Any:
    """Declare one parameter (see the module text) and return its value."""
    descriptor = _descriptor(spec)
    try:
        return node.declare_parameter(spec.name, spec.default, descriptor).value
    except InvalidParameterTypeException:
        pass
    except InvalidParameterValueException as exc:
        raise ConfigError(f"parameter {spec.name}: out of range {spec.range} ({spec.description}): {exc}") from None
    # The override has another type: read it untyped, convert, declare typed with that value.
    raw = node.declare_parameter(spec.name, spec.default, ParameterDescriptor(dynamic_typing=True)).value
    node.undeclare_parameter(spec.name)
    try:
        value = coerce(raw, spec.type)
    except ValueError as exc:
        raise ConfigError(f"parameter {spec.name}: {exc} ({spec.description})") from None
    try:
        return node.declare_parameter(spec.name, value, descriptor, ignore_override=True).value
    except InvalidParameterValueException as exc:
        raise ConfigError(f"parameter {spec.name}: out of range {spec.range} ({spec.description}): {exc}") from None


def declare_all(node: Node, specs: Iterable[ParamSpec]) -> dict[str, Any]:
    """Declare ``specs``, reject overrides for anything undeclared, return ``{name: value}``."""
    values = {spec.name: declare(node, spec) for spec in specs}
    reject_unknown_overrides(node)
    return values


def reject_unknown_overrides(node: Node) -> None:
    """ConfigError for a ``-p``/params-file value the node never declared (usually a typo).

    rclpy keeps the overrides it was given in ``Node._parameter_overrides`` (no public accessor in
    Humble-Kilted); without it the check is skipped.
    """
    overrides = getattr(node, "_parameter_overrides", None) or {}
    unknown = sorted(n for n in overrides if not node.has_parameter(n) and n not in _BUILT_IN
                     and not n.startswith(_BUILT_IN_PREFIXES))
    if unknown:
        known = list(node._parameters) if hasattr(node, "_parameters") else []
        hints = []
        for name in unknown:
            close = difflib.get_close_matches(name, known, n=1)
            hints.append(f"{name} (did you mean {close[0]}?)" if close else name)
        raise ConfigError(f"unknown parameter(s) for {node.get_name()}: {', '.join(hints)}")


def pose_parameter(name: str, value: list[float]):
    """A ``[x, y, z, qx, qy, qz, qw]`` parameter as a (4, 4) transform; ConfigError naming it."""
    if len(value) != 7:
        raise ConfigError(f"parameter {name}: needs 7 numbers [x, y, z, qx, qy, qz, qw], got {len(value)}")
    try:
        return geometry.pose_matrix(value[:3], value[3:])
    except ValueError as exc:
        raise ConfigError(f"parameter {name}: {exc}") from None


def _dataclass_specs(group: str, cls: type) -> list[ParamSpec]:
    return [ParamSpec(f"{group}.{name}", default, description, rng)
            for name, _typ, default, description, rng in describe(cls)]


def declare_and_read(node: Node) -> NodeSettings:
    """Declare registration_node's parameters and build the configs; ``ConfigError`` names any bad value."""
    values = declare_all(node, [*_dataclass_specs("registration", RegistrationConfig),
                                *_dataclass_specs("odometry", OdometryConfig), *NODE_PARAMETERS])
    groups: dict[str, dict] = {"registration": {}, "odometry": {}, "node": {}}
    for name, value in values.items():
        group, dot, field_name = name.partition(".")
        if dot and group in ("registration", "odometry"):
            groups[group][field_name] = value
        else:
            groups["node"][name] = value
    configs = {}
    for group, cls in (("registration", RegistrationConfig), ("odometry", OdometryConfig)):
        try:
            configs[group] = config_from_dict(cls, groups[group])
        except ConfigError as exc:  # "field: why" -> "parameter group.field: why"
            raise ConfigError(f"parameter {group}.{exc}") from None
    node_values = groups["node"]
    if node_values["qos"] not in ("sensor_data", "reliable"):
        raise ConfigError(f"parameter qos: {node_values['qos']!r} is not sensor_data or reliable")
    pose_parameter("sensor_to_base", node_values["sensor_to_base"])
    return NodeSettings(configs["registration"], configs["odometry"], node_values)
