"""TF: broadcasting odom -> base, and the sensor extrinsic from the static TF tree.

With a full ROS 2 install tf2_ros does both. The PyPI ROS 2 runtime has no tf2_ros (see README):
there the node publishes ``tf2_msgs/msg/TFMessage`` on ``/tf`` with the QoS tf2_ros uses, and
reads ``/tf_static`` itself (latched, as tf2's static listener does), composing the static tree
to find base <- sensor. Only static transforms are composed here: a robot's extrinsics are
static, and the dynamic /tf buffer with interpolation is what tf2 is for.
"""
from __future__ import annotations

import threading

import numpy as np
from geometry_msgs.msg import TransformStamped
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

from s2h_ros import geometry

try:  # a full ROS 2 install
    from tf2_ros import TransformBroadcaster as _Broadcaster
except ImportError:  # PyPI wheels: no tf2_ros
    _Broadcaster = None

HAVE_TF2_ROS = _Broadcaster is not None

TF_QOS = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.VOLATILE,
                    history=HistoryPolicy.KEEP_LAST)
# Latched, as tf2's static broadcaster publishes (depth 1) and its listener reads (depth 100).
TF_STATIC_QOS = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE,
                           durability=DurabilityPolicy.TRANSIENT_LOCAL, history=HistoryPolicy.KEEP_LAST)
TF_STATIC_LISTENER_QOS = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE,
                                    durability=DurabilityPolicy.TRANSIENT_LOCAL, history=HistoryPolicy.KEEP_LAST)


def _tf_message_type():
    from tf2_msgs.msg import TFMessage

    return TFMessage


class TfPublisher:
    def __init__(self, node: Node) -> None:
        if _Broadcaster is not None:
            self._impl = _Broadcaster(node)
            self._pub = None
        else:
            self._msg_type = _tf_message_type()
            self._pub = node.create_publisher(self._msg_type, "/tf", TF_QOS)

    def send(self, transform: TransformStamped) -> None:
        if self._pub is None:
            self._impl.sendTransform(transform)
        else:
            self._pub.publish(self._msg_type(transforms=[transform]))


class StaticTfPublisher:
    """Latched ``/tf_static`` (tf2_ros.StaticTransformBroadcaster where it exists)."""

    def __init__(self, node: Node) -> None:
        if HAVE_TF2_ROS:
            from tf2_ros import StaticTransformBroadcaster

            self._impl = StaticTransformBroadcaster(node)
            self._pub = None
        else:
            self._msg_type = _tf_message_type()
            self._pub = node.create_publisher(self._msg_type, "/tf_static", TF_STATIC_QOS)

    def send(self, transforms: list[TransformStamped]) -> None:
        if self._pub is None:
            self._impl.sendTransform(transforms)
        else:
            self._pub.publish(self._msg_type(transforms=list(transforms)))


class StaticTree:
    """Static transforms ``parent -> child`` and their composition (a tree, as TF is)."""

    def __init__(self) -> None:
        self._parent: dict[str, tuple[str, np.ndarray]] = {}  # child -> (parent, T_parent_child)
        self._lock = threading.Lock()

    def add(self, transform: TransformStamped) -> None:
        parent, child = transform.header.frame_id.lstrip("/"), transform.child_frame_id.lstrip("/")
        T = geometry.transform_to_matrix(transform.transform.translation, transform.transform.rotation)
        with self._lock:
            self._parent[child] = (parent, T)

    def _chain(self, frame: str) -> dict[str, np.ndarray]:
        """``{ancestor: T_ancestor_frame}`` for ``frame`` and every frame above it."""
        out, T = {frame: np.eye(4)}, np.eye(4)
        while frame in self._parent and len(out) <= len(self._parent):
            frame, T_up = self._parent[frame][0], self._parent[frame][1] @ T
            out[frame], T = T_up, T_up
        return out

    def lookup(self, target: str, source: str) -> np.ndarray | None:
        """(4, 4) pose of ``source`` in ``target`` when both hang in one static tree, else None."""
        target, source = target.lstrip("/"), source.lstrip("/")
        with self._lock:
            up_t, up_s = self._chain(target), self._chain(source)
        common = next((f for f in up_s if f in up_t), None)
        if common is None:
            return None
        return geometry.invert_transform(up_t[common]) @ up_s[common]


class ExtrinsicLookup:
    """The sensor's pose in the base frame from the static TF of the robot description: tf2 where
    it exists, else this module's /tf_static reader. ``lookup`` returns None while unknown."""

    def __init__(self, node: Node) -> None:
        self._buffer = None
        self._static = None
        if HAVE_TF2_ROS:
            from tf2_ros import Buffer, TransformListener

            self._buffer = Buffer()
            self._listener = TransformListener(self._buffer, node, spin_thread=False)
        else:
            self._static = StaticTree()
            node.create_subscription(_tf_message_type(), "/tf_static", self._on_static, TF_STATIC_LISTENER_QOS)

    def _on_static(self, msg) -> None:
        for transform in msg.transforms:
            self._static.add(transform)

    def lookup(self, base_frame: str, sensor_frame: str) -> np.ndarray | None:
        """(4, 4) pose of ``sensor_frame`` in ``base_frame`` (latest), or None when unknown."""
        if not base_frame or not sensor_frame:
            return None
        if self._static is not None:
            return self._static.lookup(base_frame, sensor_frame)
        from rclpy.time import Time

        try:
            tf = self._buffer.lookup_transform(base_frame, sensor_frame, Time())
        except Exception:  # tf2 raises LookupException / ExtrapolationException / ConnectivityException
            return None
        return geometry.transform_to_matrix(tf.transform.translation, tf.transform.rotation)
