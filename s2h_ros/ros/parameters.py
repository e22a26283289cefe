"""ROS parameters of registration_node: the core dataclasses mirrored field by field.

``RegistrationConfig`` fields are declared under ``registration.``, ``OdometryConfig`` under
``odometry.``, with their types, descriptions and ranges, so ``config/*.yaml`` and ``-p``
overrides reach the same one config the library uses. Node-only options are ``NODE_PARAMETERS``.
"""
from __future__ import annotations

from dataclasses import dataclass

from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor, ParameterType
from rclpy.exceptions import InvalidParameterTypeException, InvalidParameterValueException
from rclpy.node import Node

from s2h_ros.config import ConfigError, OdometryConfig, RegistrationConfig, config_from_dict, describe

_ROS_TYPE = {
    bool: ParameterType.PARAMETER_BOOL,
    int: ParameterType.PARAMETER_INTEGER,
    float: ParameterType.PARAMETER_DOUBLE,
    str: ParameterType.PARAMETER_STRING,
    list: ParameterType.PARAMETER_DOUBLE_ARRAY,
}

# name -> (default, description, (lo, hi))
NODE_PARAMETERS: dict[str, tuple[object, str, tuple]] = {
    "cloud_topic": ("points", "PointCloud2 input topic", (None, None)),
    "qos": ("sensor_data", "input QoS: sensor_data (best effort) or reliable (bag replay)", (None, None)),
    "odom_frame": ("odom", "fixed odometry frame (REP-105)", (None, None)),
    "base_frame": ("base_link", "robot base frame; empty: publish odom -> sensor frame", (None, None)),
    "sensor_to_base": (
        [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0],
        "sensor pose in base_frame [x, y, z, qx, qy, qz, qw], used where tf2 gives none",
        (None, None),
    ),
    "publish_tf": (True, "broadcast odom -> base (or sensor) for trusted scans", (None, None)),
    "max_markers": (500, "most correspondence lines drawn per scan", (0, 100000)),
    "keyframe_cloud_max_points": (20000, "most keyframe points drawn as a marker", (0, 10_000_000)),
    "path_max_length": (100000, "most poses kept in the published path", (1, 10_000_000)),
    "diagnostics_period": (1.0, "seconds between diagnostics messages", (0.05, 3600.0)),
}


@dataclass
class NodeSettings:
    registration: RegistrationConfig
    odometry: OdometryConfig
    node: dict


def _descriptor(name: str, typ: type, description: str, rng: tuple) -> ParameterDescriptor:
    d = ParameterDescriptor(name=name, type=_ROS_TYPE[typ], description=description)
    lo, hi = rng
    if lo is not None and typ is float:
        d.floating_point_range = [FloatingPointRange(from_value=float(lo), to_value=float(hi), step=0.0)]
    elif lo is not None and typ is int and hi <= 2**63 - 1:
        d.integer_range = [IntegerRange(from_value=int(lo), to_value=int(hi), step=1)]
    return d


def declare_and_read(node: Node) -> NodeSettings:
    """Declare every parameter and build the configs; ``ConfigError`` names any bad value."""
    values: dict[str, dict] = {"registration": {}, "odometry": {}, "node": {}}
    specs = [("registration", f) for f in describe(RegistrationConfig)]
    specs += [("odometry", f) for f in describe(OdometryConfig)]
    specs += [("node", (n, type(d), d, desc, rng)) for n, (d, desc, rng) in NODE_PARAMETERS.items()]
    for group, (name, typ, default, description, rng) in specs:
        full = name if group == "node" else f"{group}.{name}"
        try:
            param = node.declare_parameter(full, default, _descriptor(full, typ, description, rng))
        except InvalidParameterTypeException as exc:
            raise ConfigError(f"parameter {full}: expected {typ.__name__} ({description}): {exc}") from None
        except InvalidParameterValueException as exc:
            raise ConfigError(f"parameter {full}: out of range {rng} ({description}): {exc}") from None
        values[group][name] = param.value
    try:
        reg = config_from_dict(RegistrationConfig, values["registration"])
        odo = config_from_dict(OdometryConfig, values["odometry"])
    except ConfigError as exc:
        raise ConfigError(f"parameter {exc}") from None
    node_values = values["node"]
    if node_values["qos"] not in ("sensor_data", "reliable"):
        raise ConfigError(f"parameter qos: {node_values['qos']!r} is not sensor_data or reliable")
    if len(node_values["sensor_to_base"]) != 7:
        raise ConfigError("parameter sensor_to_base: needs 7 numbers [x, y, z, qx, qy, qz, qw]")
    return NodeSettings(reg, odo, node_values)
