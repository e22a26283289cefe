"""PointCloud2 <-> numpy codec (s2h_ros.pointcloud2) and its thin ROS wrapper (s2h_ros.ros.pointcloud2).

Expected bytes are built point by point with ``struct`` (an independent encoder), so the
vectorised decoder is checked against the wire format itself, not against its own encoder.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np
import pytest

from s2h_ros import paths
from s2h_ros.pointcloud2 import (
    FLOAT32, FLOAT64, INT8, UINT16, UINT32, UINT8, PointCloud2Error, create_cloud_fields, read_points, read_xyz,
    read_xyz_field,
)

STRUCT_CHAR = {1: "b", 2: "B", 3: "h", 4: "H", 5: "i", 6: "I", 7: "f", 8: "d"}


@dataclass
class PointFieldLike:
    name: str
    offset: int
    datatype: int
    count: int = 1


@dataclass
class CloudLike:
    """Any object with PointCloud2's attributes is a cloud to the codec."""

    height: int
    width: int
    fields: list
    is_bigendian: bool
    point_step: int
    row_step: int
    data: bytes
    is_dense: bool = False
    header: object = field(default=None)


def pack_cloud(records, fields, point_step, height=1, row_pad=0, bigendian=False) -> CloudLike:
    """Pack ``records`` (list of {name: value or tuple}) with struct, one point at a time."""
    width = len(records) // height
    row_step = width * point_step + row_pad
    buf = bytearray(b"\xab" * (row_step * height))  # non-zero filler: padding must be ignored
    order = ">" if bigendian else "<"
    for i, rec in enumerate(records):
        r, c = divmod(i, width)
        base = r * row_step + c * point_step
        for f in fields:
            values = rec[f.name] if f.count > 1 else (rec[f.name],)
            struct.pack_into(order + STRUCT_CHAR[f.datatype] * f.count, buf, base + f.offset, *values)
    return CloudLike(height, width, fields, bigendian, point_step, row_step, bytes(buf))


def lidar_records(rng, n):
    xyz = rng.uniform(-50, 50, size=(n, 3)).astype(np.float32)
    return [
        {"x": float(p[0]), "y": float(p[1]), "z": float(p[2]), "intensity": float(i),
         "ring": int(r), "time": float(t)}
        for p, i, r, t in zip(xyz, rng.random(n, dtype=np.float32), rng.integers(0, 128, n),
                              rng.random(n, dtype=np.float32))
    ], xyz


# Shuffled order, gaps between fields and trailing padding (point_step 40 > 26 bytes of fields).
SHUFFLED_LAYOUT = [
    PointFieldLike("intensity", 0, FLOAT32),
    PointFieldLike("z", 8, FLOAT32),
    PointFieldLike("ring", 12, UINT16),
    PointFieldLike("x", 16, FLOAT32),
    PointFieldLike("y", 20, FLOAT32),
    PointFieldLike("time", 28, FLOAT32),
]


def test_read_xyz_decodes_any_field_order_with_padding(rng):
    records, xyz = lidar_records(rng, 50)
    cloud = pack_cloud(records, SHUFFLED_LAYOUT, point_step=40)
    out, dropped = read_xyz(cloud)
    assert out.dtype == np.float32 and out.shape == (50, 3) and dropped == 0
    np.testing.assert_array_equal(out, xyz)


def test_read_points_returns_every_field_with_its_own_dtype(rng):
    records, _ = lidar_records(rng, 30)
    cloud = pack_cloud(records, SHUFFLED_LAYOUT, point_step=40)
    out, dropped = read_points(cloud)
    assert dropped == 0 and set(out) == {"x", "y", "z", "intensity", "ring", "time"}
    assert out["ring"].dtype == np.uint16 and out["time"].dtype == np.float32
    np.testing.assert_array_equal(out["ring"], [r["ring"] for r in records])
    np.testing.assert_array_equal(out["intensity"], np.float32([r["intensity"] for r in records]))
    only, _ = read_points(cloud, fields=["ring"])
    assert list(only) == ["ring"]


def test_organized_cloud_with_row_padding_keeps_row_major_order(rng):
    height, width = 4, 6
    records, xyz = lidar_records(rng, height * width)
    cloud = pack_cloud(records, SHUFFLED_LAYOUT, point_step=40, height=height, row_pad=13)
    assert cloud.row_step > cloud.width * cloud.point_step
    out, _ = read_xyz(cloud)
    np.testing.assert_array_equal(out, xyz)
    fields, _ = read_points(cloud, skip_nans=False)
    np.testing.assert_array_equal(fields["x"].reshape(height, width), xyz[:, 0].reshape(height, width))


def test_nan_and_inf_points_are_dropped_and_counted(rng):
    records, xyz = lidar_records(rng, 40)
    bad = {3: ("x", float("nan")), 10: ("y", float("inf")), 11: ("z", float("-inf")), 39: ("x", float("nan"))}
    for i, (name, value) in bad.items():
        records[i][name] = value
    cloud = pack_cloud(records, SHUFFLED_LAYOUT, point_step=40, height=4)
    keep = np.setdiff1d(np.arange(40), list(bad))
    out, dropped = read_xyz(cloud)
    assert dropped == 4
    np.testing.assert_array_equal(out, xyz[keep])
    fields, dropped = read_points(cloud)
    assert dropped == 4
    np.testing.assert_array_equal(fields["ring"], np.array([r["ring"] for r in records])[keep])
    kept_all, dropped = read_xyz(cloud, skip_nans=False)
    assert dropped == 0 and kept_all.shape == (40, 3) and np.isnan(kept_all[3, 0])


def test_big_endian_flag_is_honoured(rng):
    records, xyz = lidar_records(rng, 25)
    big = pack_cloud(records, SHUFFLED_LAYOUT, point_step=40, bigendian=True)
    little = pack_cloud(records, SHUFFLED_LAYOUT, point_step=40)
    assert big.data != little.data
    np.testing.assert_array_equal(read_xyz(big)[0], xyz)
    fields, _ = read_points(big)
    assert fields["ring"].dtype.isnative
    np.testing.assert_array_equal(fields["ring"], [r["ring"] for r in records])


PACKED_LAYOUT = [  # x, y, z adjacent float32 (the common case, decoded in one pass) after intensity
    PointFieldLike("intensity", 0, FLOAT32),
    PointFieldLike("x", 4, FLOAT32),
    PointFieldLike("y", 8, FLOAT32),
    PointFieldLike("z", 12, FLOAT32),
    PointFieldLike("ring", 16, UINT16),
]


@pytest.mark.parametrize("bigendian", [False, True])
def test_adjacent_xyz_decode_honours_offset_endianness_and_row_padding(rng, bigendian):
    records, xyz = lidar_records(rng, 3 * 7)
    records[4]["y"] = float("nan")
    cloud = pack_cloud(records, PACKED_LAYOUT, point_step=20, height=3, row_pad=6, bigendian=bigendian)
    out, dropped = read_xyz(cloud)
    assert dropped == 1
    np.testing.assert_array_equal(out, np.delete(xyz, 4, axis=0))


@pytest.mark.parametrize("bigendian", [False, True])
def test_float64_coordinates_keep_their_precision(rng, bigendian):
    """Georeferenced clouds (UTM, ~5e6 m) survive decoding to the millimetre: float64 stays float64."""
    xyz = rng.uniform(-1e3, 1e3, size=(20, 3)) + [500000.0, 5400000.0, 0.0]
    xyz[7, 2] = np.nan
    layout = [PointFieldLike(c, 8 * i, FLOAT64) for i, c in enumerate("xyz")]
    records = [{"x": p[0], "y": p[1], "z": p[2]} for p in xyz]
    cloud = pack_cloud(records, layout, point_step=24, bigendian=bigendian)
    out, dropped = read_xyz(cloud)
    assert out.dtype == np.float64 and dropped == 1
    np.testing.assert_array_equal(out, np.delete(xyz, 7, axis=0))
    exact, _ = read_points(cloud, skip_nans=False)
    assert exact["x"].dtype == np.float64
    np.testing.assert_array_equal(exact["x"], xyz[:, 0])


def test_count_greater_than_one_becomes_a_column_block(rng):
    layout = [PointFieldLike("x", 0, FLOAT32), PointFieldLike("y", 4, FLOAT32), PointFieldLike("z", 8, FLOAT32),
              PointFieldLike("rgb", 12, UINT8, count=3), PointFieldLike("normal", 16, FLOAT32, count=3)]
    rgb = rng.integers(0, 256, size=(10, 3))
    normal = rng.normal(size=(10, 3)).astype(np.float32)
    records = [{"x": 1.0 * i, "y": 2.0, "z": 3.0, "rgb": tuple(int(v) for v in rgb[i]),
                "normal": tuple(float(v) for v in normal[i])} for i in range(10)]
    fields, _ = read_points(pack_cloud(records, layout, point_step=28))
    assert fields["rgb"].shape == (10, 3) and fields["normal"].shape == (10, 3)
    np.testing.assert_array_equal(fields["rgb"], rgb)
    np.testing.assert_array_equal(fields["normal"], normal)


def _xyz_cloud(**overrides) -> CloudLike:
    layout = [PointFieldLike(c, 4 * i, FLOAT32) for i, c in enumerate("xyz")]
    cloud = pack_cloud([{"x": 1.0, "y": 2.0, "z": 3.0}] * 4, layout, point_step=12)
    for key, value in overrides.items():
        setattr(cloud, key, value)
    return cloud


@pytest.mark.parametrize("overrides, problem", [
    ({"fields": [PointFieldLike("x", 0, FLOAT32), PointFieldLike("y", 4, FLOAT32)]}, "no field z"),
    ({"data": b"\0" * 47}, "data holds 47 bytes"),
    ({"width": 5, "row_step": 60}, "data holds 48 bytes"),
    ({"fields": [PointFieldLike("x", 0, 9), PointFieldLike("y", 4, FLOAT32), PointFieldLike("z", 8, FLOAT32)]},
     "unsupported datatype 9"),
    ({"row_step": 20}, "row_step 20 < width 4"),
    ({"data": b"\0" * 60}, r"data holds 60 bytes; height 1 \* row_step 48 = 48"),
    ({"row_step": 50}, r"data holds 48 bytes; height 1 \* row_step 50 = 50"),
    ({"width": -4}, "width is -4; expected >= 0"),
    ({"height": "two"}, "height is not an integer"),
    ({"point_step": 10}, "outside point_step 10"),
    ({"fields": [PointFieldLike("x", 0, FLOAT32), PointFieldLike("x", 4, FLOAT32), PointFieldLike("z", 8, FLOAT32)]},
     "'x' appears twice"),
    ({"fields": [PointFieldLike("x", 0, FLOAT32, count=0), PointFieldLike("y", 4, FLOAT32),
                 PointFieldLike("z", 8, FLOAT32)]}, "count 0"),
    ({"fields": [PointFieldLike("x", 0, INT8, count=2), PointFieldLike("y", 4, FLOAT32),
                 PointFieldLike("z", 8, FLOAT32)]}, "coordinates need count 1"),
])
def test_malformed_message_raises_pointcloud2error_naming_the_problem(overrides, problem):
    cloud = _xyz_cloud(**overrides)
    with pytest.raises(PointCloud2Error, match=problem):
        read_xyz(cloud)
    with pytest.raises(PointCloud2Error, match=problem):
        read_points(cloud)


def test_object_without_pointcloud2_attributes_is_rejected():
    with pytest.raises(PointCloud2Error, match="no attribute 'height'"):
        read_xyz(object())
    assert issubclass(PointCloud2Error, ValueError)


def test_data_as_a_list_of_ints_decodes_and_a_string_is_rejected():
    cloud = _xyz_cloud()
    np.testing.assert_array_equal(read_xyz(_xyz_cloud(data=list(cloud.data)))[0], read_xyz(cloud)[0])
    with pytest.raises(PointCloud2Error, match="data is not a byte buffer: str"):
        read_xyz(_xyz_cloud(data="not bytes"))


def test_empty_cloud_decodes_to_zero_points():
    out, dropped = read_xyz(_xyz_cloud(width=0, data=b""))
    assert out.shape == (0, 3) and dropped == 0


def test_create_cloud_fields_packs_a_velodyne_layout(rng):
    n = 64
    xyz = rng.normal(size=(n, 3)).astype(np.float32)
    extra = {"intensity": rng.random(n, dtype=np.float32), "ring": rng.integers(0, 32, n).astype(np.uint16),
             "time": rng.random(n, dtype=np.float32)}
    fields, point_step, data = create_cloud_fields(xyz, extra)
    assert fields == [("x", 0, FLOAT32, 1), ("y", 4, FLOAT32, 1), ("z", 8, FLOAT32, 1),
                      ("intensity", 12, FLOAT32, 1), ("ring", 16, UINT16, 1), ("time", 18, FLOAT32, 1)]
    assert point_step == 22 and len(data) == 22 * n
    assert struct.unpack_from("<fffHf", data, 22 * 5 + 4)[3] == extra["ring"][5]
    cloud = CloudLike(1, n, [PointFieldLike(*f) for f in fields], False, point_step, point_step * n, data)
    decoded, _ = read_points(cloud)
    for name, values in extra.items():
        np.testing.assert_array_equal(decoded[name], values)
    np.testing.assert_array_equal(read_xyz(cloud)[0], xyz)


@pytest.mark.parametrize("bigendian", [False, True])
def test_an_ouster_time_field_is_read_for_the_same_points_as_the_coordinates(bigendian):
    """An Ouster layout (x, y, z, padding, intensity, t UINT32 ns, ...): the times of the points kept
    after NaN ones are dropped, native-endian; a field the cloud lacks is named."""
    layout = [PointFieldLike("x", 0, FLOAT32), PointFieldLike("y", 4, FLOAT32), PointFieldLike("z", 8, FLOAT32),
              PointFieldLike("intensity", 16, FLOAT32), PointFieldLike("t", 20, UINT32)]
    records = [{"x": float(i), "y": 0.0, "z": float("nan") if i in (1, 4) else 1.0, "intensity": 0.5,
                "t": 10_000_000 * i} for i in range(6)]
    cloud = pack_cloud(records, layout, point_step=32, bigendian=bigendian)
    xyz, t, dropped = read_xyz_field(cloud, "t")
    assert dropped == 2 and xyz[:, 0].tolist() == [0.0, 2.0, 3.0, 5.0]
    assert t.tolist() == [0, 20_000_000, 30_000_000, 50_000_000] and t.dtype == np.dtype("=u4")
    assert read_xyz_field(cloud, None)[1] is None
    with pytest.raises(PointCloud2Error, match="no field 'time'"):
        read_xyz_field(cloud, "time")


@pytest.mark.parametrize("xyz, extra, shape, problem", [
    (np.zeros((5, 2)), None, None, r"xyz must be \(N, 3\)"),
    (np.zeros((6, 3)), None, (4, 2), "does not hold 6 points"),
    (np.zeros((6, 3)), {"label": np.zeros(6, dtype=np.int64)}, None, "dtype int64"),
    (np.zeros((6, 3)), {"intensity": np.zeros(5, dtype=np.float32)}, None, r"must be \(6,\)"),
    (np.zeros((6, 3)), {"x": np.zeros(6, dtype=np.float32)}, None, "clashes with x, y, z"),
])
def test_create_cloud_fields_rejects_bad_arrays(xyz, extra, shape, problem):
    with pytest.raises(PointCloud2Error, match=problem):
        create_cloud_fields(xyz, extra, shape)


@pytest.fixture(scope="module")
def kitti_scan() -> np.ndarray:
    """A real KITTI scan (x, y, z of the bundled N x 6 float32 sample)."""
    return np.fromfile(paths.KITTI_LOOP_PAIR[0], dtype=np.float32).reshape(-1, 6)[:, :3].copy()


def test_rclpy_serialization_round_trip_keeps_a_real_kitti_scan(kitti_scan, rng):
    from rclpy.serialization import deserialize_message, serialize_message
    from sensor_msgs.msg import PointCloud2

    from s2h_ros.ros.pointcloud2 import from_msg, to_msg

    intensity = rng.random(len(kitti_scan), dtype=np.float32)
    msg = to_msg(kitti_scan, frame_id="velodyne", stamp=12.25, extra={"intensity": intensity})
    back = deserialize_message(serialize_message(msg), PointCloud2)
    assert back.header.frame_id == "velodyne"
    assert (back.header.stamp.sec, back.header.stamp.nanosec) == (12, 250_000_000)
    assert back.is_dense and back.height == 1 and back.width == len(kitti_scan)
    xyz, dropped = from_msg(back)
    assert dropped == 0
    np.testing.assert_array_equal(xyz, kitti_scan)
    np.testing.assert_array_equal(read_points(back, ["intensity"])[0]["intensity"], intensity)


def test_rclpy_organized_cloud_with_nans_round_trips(rng):
    from rclpy.serialization import deserialize_message, serialize_message
    from sensor_msgs.msg import PointCloud2

    from s2h_ros.ros.pointcloud2 import from_msg, to_msg

    xyz = rng.normal(size=(16 * 32, 3))  # float64 coordinates stay float64 on the wire
    xyz[::5] = np.nan
    msg = to_msg(xyz, frame_id="os_sensor", stamp=1_700_000_000_123_456_789, shape=(16, 32))
    back = deserialize_message(serialize_message(msg), PointCloud2)
    assert (back.height, back.width, back.row_step) == (16, 32, 32 * back.point_step)
    assert back.fields[0].datatype == FLOAT64 and not back.is_dense
    assert (back.header.stamp.sec, back.header.stamp.nanosec) == (1_700_000_000, 123_456_789)
    points, dropped = from_msg(back)
    finite = np.isfinite(xyz).all(axis=1)
    assert dropped == int((~finite).sum()) and points.dtype == np.float64
    np.testing.assert_array_equal(points, xyz[finite])
    organized, _ = read_points(back, skip_nans=False)
    np.testing.assert_array_equal(organized["x"].reshape(16, 32), xyz[:, 0].reshape(16, 32))


def test_to_msg_takes_a_header_or_any_stamp_type(kitti_scan):
    from builtin_interfaces.msg import Time
    from std_msgs.msg import Header

    from s2h_ros.ros.pointcloud2 import to_msg

    from rclpy.time import Time as RclpyTime

    header = Header(frame_id="base_scan", stamp=Time(sec=5, nanosec=7))
    for msg in (to_msg(kitti_scan[:10], header), to_msg(kitti_scan[:10], header=header),
                to_msg(kitti_scan[:10], "base_scan", Time(sec=5, nanosec=7)),
                to_msg(kitti_scan[:10], "base_scan", RclpyTime(seconds=5, nanoseconds=7))):
        assert msg.header == header and msg.width == 10


def test_rosbags_and_rclpy_messages_decode_the_same_bytes(kitti_scan):
    """The codec reads rosbags-deserialised messages, and rclpy reads rosbags' CDR bytes."""
    from rclpy.serialization import deserialize_message, serialize_message
    from rosbags.typesys import Stores, get_typestore
    from sensor_msgs.msg import PointCloud2

    from s2h_ros.ros.pointcloud2 import to_msg

    rclpy_msg = to_msg(kitti_scan[:5000], frame_id="velodyne", stamp=3.5,
                       extra={"ring": np.arange(5000, dtype=np.uint16) % 64})
    store = get_typestore(Stores.ROS2_KILTED)
    rosbags_msg = store.deserialize_cdr(serialize_message(rclpy_msg), "sensor_msgs/msg/PointCloud2")
    assert isinstance(rosbags_msg.data, np.ndarray)
    np.testing.assert_array_equal(read_xyz(rosbags_msg)[0], kitti_scan[:5000])
    np.testing.assert_array_equal(read_points(rosbags_msg, ["ring"])[0]["ring"], np.arange(5000) % 64)
    again = deserialize_message(bytes(store.serialize_cdr(rosbags_msg, "sensor_msgs/msg/PointCloud2")),
                                PointCloud2)
    np.testing.assert_array_equal(read_xyz(again)[0], kitti_scan[:5000])


def test_bench_command_writes_json_with_ratios_against_the_per_point_baseline(tmp_path):
    import json

    from s2h_ros.cli import main

    out = tmp_path / "pc2.json"
    assert main(["bench", "pointcloud2", "--points", "3000", "--repeats", "2", "--baseline-repeats", "1",
                 "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["points"] == 3000 and result["bytes"] == 3000 * 22
    assert 0 < result["dropped_in_nan_case"] < 3000
    assert result["decode_speedup_vs_loop"] > 0 and result["encode_speedup_vs_loop"] > 0
