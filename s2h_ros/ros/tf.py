"""TF broadcasting: tf2_ros where a ROS 2 install provides it, else /tf directly.

The PyPI ROS 2 runtime has no tf2_ros (see README); there the node publishes
``tf2_msgs/msg/TFMessage`` on ``/tf`` with the QoS tf2_ros uses, so RViz and tf2 listeners on a
full install see the same thing.
"""
from __future__ import annotations

from geometry_msgs.msg import TransformStamped
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

try:  # a full ROS 2 install
    from tf2_ros import TransformBroadcaster as _Broadcaster
except ImportError:  # PyPI wheels: no tf2_ros
    _Broadcaster = None

HAVE_TF2_ROS = _Broadcaster is not None


class TfPublisher:
    def __init__(self, node: Node) -> None:
        if _Broadcaster is not None:
            self._impl = _Broadcaster(node)
            self._pub = None
        else:
            from tf2_msgs.msg import TFMessage

            self._msg_type = TFMessage
            qos = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE,
                             durability=DurabilityPolicy.VOLATILE, history=HistoryPolicy.KEEP_LAST)
            self._pub = node.create_publisher(TFMessage, "/tf", qos)

    def send(self, transform: TransformStamped) -> None:
        if self._pub is None:
            self._impl.sendTransform(transform)
        else:
            self._pub.publish(self._msg_type(transforms=[transform]))


class ExtrinsicLookup:
    """The sensor's pose in the base frame from tf2 (static TF of the robot description).

    Only where tf2_ros exists; elsewhere ``lookup`` returns None and the node uses its
    ``sensor_to_base`` parameter.
    """

    def __init__(self, node: Node) -> None:
        self._buffer = None
        if HAVE_TF2_ROS:
            from tf2_ros import Buffer, TransformListener

            self._buffer = Buffer()
            self._listener = TransformListener(self._buffer, node, spin_thread=False)

    def lookup(self, base_frame: str, sensor_frame: str):
        """(4, 4) pose of ``sensor_frame`` in ``base_frame`` (latest), or None when unknown."""
        if self._buffer is None or not base_frame or not sensor_frame:
            return None
        from rclpy.time import Time

        try:
            tf = self._buffer.lookup_transform(base_frame, sensor_frame, Time())
        except Exception:  # tf2 raises LookupException / ExtrapolationException / ConnectivityException
            return None
        from s2h_ros.datasets.rosbag import transform_to_matrix

        return transform_to_matrix(tf.transform.translation, tf.transform.rotation)
