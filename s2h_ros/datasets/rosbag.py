"""rosbag2 files (mcap and sqlite3) with sensor_msgs/PointCloud2 scans, without ROS.

Reading and writing go through the ``rosbags`` library (pure Python; its ROS 2 Kilted type store
has PointCloud2 and tf2_msgs/TFMessage); clouds are decoded by the numpy codec in
:mod:`s2h_ros.pointcloud2`. Ground truth travels as TF: one ``world_frame -> frame_id`` transform
per scan, stamped with the scan's header stamp, on ``/tf``; the reader pairs them back by exact
stamp, so a bag written here replays with its poses.
"""
from __future__ import annotations

import contextlib
import functools
import itertools
import shutil
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np

from s2h_ros import stamps
from s2h_ros.datasets.types import Scan, ScanList, scan_fields
from s2h_ros.geometry import matrix_to_pose, transform_to_matrix
from s2h_ros.pointcloud2 import create_cloud_fields, read_points, read_xyz_times

POINTCLOUD2 = "sensor_msgs/msg/PointCloud2"
TFMESSAGE = "tf2_msgs/msg/TFMessage"
STORAGES = ("mcap", "sqlite3")


class RosbagError(ValueError):
    """A rosbag2 file is corrupt or lacks what was asked for (topic, message type)."""


@functools.lru_cache(maxsize=1)
def _typestore() -> Any:
    from rosbags.typesys import Stores, get_typestore

    return get_typestore(Stores.ROS2_KILTED)


def _open_reader(path: str | Path) -> Any:
    """An opened rosbags Reader on a bag directory or a single .mcap/.db3 file."""
    from rosbags.rosbag2 import Reader

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"rosbag2 not found: {path}")
    try:
        reader = Reader(path)
        reader.open()
    except Exception as exc:  # rosbags, yaml, sqlite3 and mcap parsing all raise their own types
        raise RosbagError(f"cannot read rosbag2 {path}: {exc}") from exc
    return reader


def _topics(reader: Any) -> dict[str, str]:
    return {topic: str(info.msgtype) for topic, info in reader.topics.items()}


def list_topics(path: str | Path) -> dict[str, str]:
    """``{topic: message type}`` of the bag, e.g. ``{"/points": "sensor_msgs/msg/PointCloud2"}``."""
    reader = _open_reader(path)
    try:
        return _topics(reader)
    finally:
        reader.close()


def _connections(reader: Any, path: Path, topic: str, msgtype: str) -> list[Any]:
    topics = _topics(reader)
    if topic not in topics:
        available = ", ".join(f"{t} ({m})" for t, m in sorted(topics.items())) or "none"
        raise RosbagError(f"topic {topic!r} not in {path}; available topics: {available}")
    if topics[topic] != msgtype:
        raise RosbagError(f"topic {topic!r} in {path} carries {topics[topic]}, not {msgtype}")
    return [c for c in reader.connections if c.topic == topic]


def _messages(reader: Any, path: Path, topic: str, msgtype: str) -> Iterator[tuple[int, Any]]:
    """``(bag timestamp ns, deserialised message)`` of one topic, in bag order."""
    connections = _connections(reader, path, topic, msgtype)
    raw_messages = iter(reader.messages(connections=connections))
    index = 0
    while True:
        try:
            _, timestamp, raw = next(raw_messages)
            msg = _typestore().deserialize_cdr(raw, msgtype)
        except StopIteration:
            return
        except Exception as exc:  # storage or CDR decoding of a damaged file
            raise RosbagError(f"{path}: message {index} on {topic!r} is corrupt: {exc}") from exc
        yield timestamp, msg
        index += 1


def read_tf_poses(path: str | Path, frame_id: str, tf_topic: str = "/tf") -> dict[int, np.ndarray]:
    """``{stamp ns: (4, 4) pose}`` of every transform on ``tf_topic`` whose child is ``frame_id``."""
    path = Path(path)
    reader = _open_reader(path)
    try:
        poses = {}
        for _, msg in _messages(reader, path, tf_topic, TFMESSAGE):
            for tf in msg.transforms:
                if tf.child_frame_id.lstrip("/") == frame_id.lstrip("/"):
                    stamp = stamps.stamp_ns(tf.header.stamp)
                    poses[stamp] = transform_to_matrix(tf.transform.translation, tf.transform.rotation)
        return poses
    finally:
        reader.close()


def read_pointcloud_bag(
    path: str | Path, topic: str, tf_topic: str | None = "/tf", skip_nans: bool = True
) -> Iterator[Scan]:
    """Scans of a PointCloud2 topic in bag order.

    ``stamp`` is the header stamp (the bag's receive time where the header has none), ``points``
    the finite x, y, z, ``intensity`` the intensity field when present, ``times`` the per-point
    times (s2h_ros.deskew: a ``t``, ``time``, ``timestamp``... field, as seconds relative to the
    stamp; None without one or when they are not one sweep's), ``pose`` the TF ground truth
    of ``tf_topic`` at exactly that stamp when the bag has it (else None).
    """
    path = Path(path)
    reader = _open_reader(path)
    try:
        has_tf = tf_topic is not None and _topics(reader).get(tf_topic) == TFMESSAGE
        poses: dict[int, np.ndarray] | None = None
        for index, (timestamp, msg) in enumerate(_messages(reader, path, topic, POINTCLOUD2)):
            stamp_ns = stamps.stamp_ns(msg.header.stamp) or int(timestamp)
            frame_id = str(msg.header.frame_id)
            if has_tf and poses is None:
                poses = read_tf_poses(path, frame_id, tf_topic)
            # float64 kept for georeferenced clouds; times that cannot be one sweep's are None, the
            # scan as given, as the node would take it
            points, times, _, _ = read_xyz_times(msg, stamps.ns_to_sec(stamp_ns), skip_nans)
            intensity = None
            if "intensity" in {f.name for f in msg.fields}:  # for the same points
                intensity = read_points(msg, ["intensity"], skip_nans=skip_nans)[0]["intensity"].astype(np.float32)
            pose = None if poses is None else poses.get(stamp_ns)
            yield Scan(stamp=stamps.ns_to_sec(stamp_ns), points=points, pose=pose, intensity=intensity,
                       frame_id=frame_id, index=index, times=times)
    finally:
        reader.close()


def _time(ts: Any, stamp_ns: int) -> Any:
    sec, nanosec = stamps.split_ns(stamp_ns)
    return ts.types["builtin_interfaces/msg/Time"](sec=sec, nanosec=nanosec)


def rosbags_cloud(xyz: np.ndarray, extra: dict[str, np.ndarray] | None = None, frame_id: str = "",
                  stamp_ns: int = 0) -> Any:
    """A rosbags sensor_msgs/PointCloud2 (unorganized) of ``(N, 3)`` points plus extra fields."""
    ts = _typestore()
    xyz = np.asarray(xyz)
    fields, point_step, data = create_cloud_fields(xyz, extra)
    field_type = ts.types["sensor_msgs/msg/PointField"]
    header = ts.types["std_msgs/msg/Header"](stamp=_time(ts, stamp_ns), frame_id=frame_id)
    return ts.types[POINTCLOUD2](
        header=header, height=1, width=xyz.shape[0],
        fields=[field_type(name=n, offset=o, datatype=d, count=c) for n, o, d, c in fields],
        is_bigendian=False, point_step=point_step, row_step=point_step * xyz.shape[0],
        data=np.frombuffer(data, dtype=np.uint8), is_dense=bool(np.isfinite(xyz).all()))


def _tf_msg(ts: Any, pose: np.ndarray, parent: str, child: str, stamp_ns: int) -> Any:
    pose = np.asarray(pose, dtype=np.float64)
    if pose.shape != (4, 4) or not np.isfinite(pose).all():
        raise ValueError(f"pose of {child!r} at {stamp_ns} ns must be a finite (4, 4) matrix")
    t, q = matrix_to_pose(pose)
    transform = ts.types["geometry_msgs/msg/Transform"](
        translation=ts.types["geometry_msgs/msg/Vector3"](x=t[0], y=t[1], z=t[2]),
        rotation=ts.types["geometry_msgs/msg/Quaternion"](x=q[0], y=q[1], z=q[2], w=q[3]))
    header = ts.types["std_msgs/msg/Header"](stamp=_time(ts, stamp_ns), frame_id=parent)
    stamped = ts.types["geometry_msgs/msg/TransformStamped"](
        header=header, child_frame_id=child, transform=transform)
    return ts.types[TFMESSAGE](transforms=[stamped])


def write_pointcloud_bag(
    path: str | Path,
    scans: Iterable[Scan],
    topic: str = "/points",
    frame_id: str | None = None,
    storage: str = "mcap",
    tf: bool | np.ndarray | None = True,
    tf_topic: str = "/tf",
    world_frame: str = "world",
    overwrite: bool = False,
) -> Path:
    """Write scans as PointCloud2 (x, y, z float32 + intensity and time when the scan has them,
    ``types.scan_fields``) to a new bag.

    ``frame_id`` None keeps each scan's own. Ground truth goes to ``tf_topic`` as
    ``world_frame -> frame_id`` at the scan's stamp: ``tf=True`` writes each ``scan.pose`` that
    is set, a ``(len, 4, 4)`` array gives the poses in scan order, False/None writes none.
    Returns the bag directory.
    """
    from rosbags.rosbag2 import StoragePlugin, Writer

    if storage not in STORAGES:
        raise ValueError(f"storage must be one of {STORAGES}; got {storage!r}")
    path = Path(path)
    if path.exists():
        if not overwrite:
            raise FileExistsError(f"{path} exists; pass overwrite=True to replace it")
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    poses = None if isinstance(tf, (bool, type(None))) else np.asarray(tf, dtype=np.float64)
    if poses is not None and (poses.ndim != 3 or poses.shape[1:] != (4, 4)):
        raise ValueError(f"tf poses must be (len, 4, 4); got {poses.shape}")
    ts = _typestore()
    plugin = StoragePlugin.MCAP if storage == "mcap" else StoragePlugin.SQLITE3
    with Writer(path, version=Writer.VERSION_LATEST, storage_plugin=plugin) as writer:
        clouds = writer.add_connection(topic, POINTCLOUD2, typestore=ts)
        tf_connection = None
        count = 0
        for i, scan in enumerate(scans):
            stamp_ns = stamps.sec_to_ns(float(scan.stamp))
            frame = frame_id if frame_id is not None else scan.frame_id
            msg = rosbags_cloud(scan.points, scan_fields(scan), frame, stamp_ns)
            writer.write(clouds, stamp_ns, ts.serialize_cdr(msg, POINTCLOUD2))
            if poses is not None and i >= len(poses):
                raise ValueError(f"tf holds {len(poses)} poses for more scans")
            pose = scan.pose if tf is True else (poses[i] if poses is not None else None)
            if pose is not None:
                if tf_connection is None:
                    tf_connection = writer.add_connection(tf_topic, TFMESSAGE, typestore=ts)
                tf_msg = _tf_msg(ts, pose, world_frame, frame, stamp_ns)
                writer.write(tf_connection, stamp_ns, ts.serialize_cdr(tf_msg, TFMESSAGE))
            count += 1
    if poses is not None and len(poses) != count:
        raise ValueError(f"tf holds {len(poses)} poses for {count} scans")
    return path


class RosbagSequence(ScanList):
    """A PointCloud2 topic of a rosbag2 as a :class:`~s2h_ros.datasets.types.Sequence`.

    Scans are read once, when the sequence is made (bags for evaluation are short; stream with
    :func:`read_pointcloud_bag` otherwise); ``poses`` are their TF ground truth, or None when a
    scan has no pose.
    """

    def __init__(self, path: str | Path, topic: str, tf_topic: str | None = "/tf",
                 max_scans: int | None = None) -> None:
        with contextlib.closing(read_pointcloud_bag(path, topic, tf_topic)) as scans:
            first = list(itertools.islice(scans, max_scans))
        super().__init__(first, name=f"{Path(path).name}:{topic}")
        self.path = Path(path)
