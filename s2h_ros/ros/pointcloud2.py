"""sensor_msgs/PointCloud2 messages from and to numpy (thin: the codec is s2h_ros.pointcloud2)."""
from __future__ import annotations

import array
from typing import Any

import numpy as np
from builtin_interfaces.msg import Time
from sensor_msgs.msg import PointCloud2, PointField
from std_msgs.msg import Header

from s2h_ros.pointcloud2 import create_cloud_fields, read_xyz
from s2h_ros.ros.messages import stamp_msg


def to_msg(
    xyz: np.ndarray,
    frame_id: str | Header = "",
    stamp: float | int | Time | None = None,
    extra: dict[str, np.ndarray] | None = None,
    shape: tuple[int, int] | None = None,
    header: Header | None = None,
) -> PointCloud2:
    """PointCloud2 of ``(N, 3)`` points plus extra ``{name: (N,) or (N, count)}`` fields.

    The second argument is a frame id or a whole std_msgs/Header (as is ``header=``); a header
    wins over ``stamp``, which is seconds (float), nanoseconds (int) or a builtin_interfaces/Time.
    ``shape=(height, width)`` publishes an organized cloud.
    """
    if isinstance(frame_id, Header):
        header, frame_id = frame_id, ""
    fields, point_step, data = create_cloud_fields(xyz, extra, shape)
    height, width = shape if shape is not None else (1, len(data) // point_step)
    if header is None:
        header = Header(frame_id=frame_id, stamp=stamp_msg(stamp))
    msg = PointCloud2(
        header=header,
        height=int(height),
        width=int(width),
        fields=[PointField(name=n, offset=o, datatype=d, count=c) for n, o, d, c in fields],
        is_bigendian=False,
        point_step=point_step,
        row_step=point_step * int(width),
        is_dense=bool(np.isfinite(np.asarray(xyz)).all()),
    )
    msg.data = array.array("B", data)  # array.array('B') skips rclpy's per-byte check
    return msg


def from_msg(msg: Any, skip_nans: bool = True) -> tuple[np.ndarray, int]:
    """``(N, 3) float32`` points of a PointCloud2 and the number of NaN/inf points dropped."""
    return read_xyz(msg, skip_nans=skip_nans)
