"""rosbag2 PointCloud2 + TF ground truth, mcap and sqlite3 (s2h_ros.datasets.rosbag)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from s2h_ros import paths
from s2h_ros.datasets.rosbag import (
    RosbagError, list_topics, read_pointcloud_bag, read_tf_poses, write_pointcloud_bag,
)
from s2h_ros.datasets.types import Scan


@pytest.fixture(scope="module")
def scans() -> list[Scan]:
    """The two bundled real KITTI scans plus a generated one with NaN returns, with poses."""
    rng = np.random.default_rng(7)
    clouds = [np.fromfile(p, dtype=np.float32).reshape(-1, 6)[:, :3].copy() for p in paths.KITTI_LOOP_PAIR]
    noisy = rng.uniform(-20, 20, size=(500, 3)).astype(np.float32)
    noisy[::50] = np.nan
    clouds.append(noisy)
    out = []
    for i, xyz in enumerate(clouds):
        pose = np.eye(4)
        pose[:3, :3] = Rotation.random(random_state=i).as_matrix()
        pose[:3, 3] = rng.normal(scale=10.0, size=3)
        out.append(Scan(stamp=1_700_000_000.0 + 0.1 * i, points=xyz, pose=pose,
                        intensity=rng.random(len(xyz), dtype=np.float32), frame_id="velodyne", index=i))
    return out


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_written_bag_reads_back_scans_stamps_and_tf_poses(tmp_path, scans, storage):
    bag = write_pointcloud_bag(tmp_path / "bag", scans, topic="/velodyne_points", storage=storage)
    assert list_topics(bag) == {"/velodyne_points": "sensor_msgs/msg/PointCloud2", "/tf": "tf2_msgs/msg/TFMessage"}
    back = list(read_pointcloud_bag(bag, "/velodyne_points"))
    assert [s.index for s in back] == [0, 1, 2]
    for written, read in zip(scans, back):
        finite = np.isfinite(written.points).all(axis=1)
        np.testing.assert_array_equal(read.points, written.points[finite])
        np.testing.assert_array_equal(read.intensity, written.intensity[finite])
        assert round(read.stamp * 1e9) == round(written.stamp * 1e9)
        assert read.frame_id == "velodyne"
        np.testing.assert_allclose(read.pose, written.pose, atol=1e-12)
    assert back[2].points.shape[0] == 490  # ten NaN returns dropped


def test_per_point_times_go_into_the_bag_and_come_back_relative_to_each_stamp(tmp_path, scans):
    """A scan's times are written as the Velodyne driver's ``time`` field and read back as seconds
    relative to its stamp, for the points kept; a scan without them reads back without."""
    rng = np.random.default_rng(3)
    timed = [dataclasses.replace(s, times=rng.uniform(-0.05, 0.05, len(s.points))) for s in scans[1:]]
    bag = write_pointcloud_bag(tmp_path / "bag", [scans[0], *timed], tf=False)
    back = list(read_pointcloud_bag(bag, "/points"))
    assert back[0].times is None
    for written, read in zip(timed, back[1:]):
        finite = np.isfinite(written.points).all(axis=1)
        np.testing.assert_allclose(read.times, written.times[finite].astype(np.float32), atol=1e-7)


def test_single_mcap_file_is_readable_without_its_directory(tmp_path, scans):
    bag = write_pointcloud_bag(tmp_path / "bag", scans[:1], topic="/points", frame_id="lidar", tf=False)
    (mcap_file,) = bag.glob("*.mcap")
    (scan,) = read_pointcloud_bag(mcap_file, "/points")
    assert scan.frame_id == "lidar" and scan.pose is None
    np.testing.assert_array_equal(scan.points, scans[0].points)


def test_tf_array_gives_poses_in_scan_order(tmp_path, scans):
    poses = np.stack([np.eye(4)] * len(scans))
    poses[:, 0, 3] = [1.0, 2.0, 3.0]
    bag = write_pointcloud_bag(tmp_path / "bag", scans, storage="sqlite3", tf=poses, world_frame="map")
    by_stamp = read_tf_poses(bag, "velodyne")
    assert sorted(T[0, 3] for T in by_stamp.values()) == [1.0, 2.0, 3.0]
    np.testing.assert_allclose([s.pose[0, 3] for s in read_pointcloud_bag(bag, "/points")], [1.0, 2.0, 3.0])


def test_bag_bytes_deserialise_with_rclpy(tmp_path, scans):
    """What the writer stores is real CDR that ROS itself reads."""
    from rclpy.serialization import deserialize_message
    from rosbags.rosbag2 import Reader
    from sensor_msgs.msg import PointCloud2
    from tf2_msgs.msg import TFMessage

    from s2h_ros.ros.pointcloud2 import from_msg

    bag = write_pointcloud_bag(tmp_path / "bag", scans[:1])
    with Reader(bag) as reader:
        raw = {c.topic: bytes(data) for c, _, data in reader.messages()}
    xyz, dropped = from_msg(deserialize_message(raw["/points"], PointCloud2))
    assert dropped == 0
    np.testing.assert_array_equal(xyz, scans[0].points)
    tf = deserialize_message(raw["/tf"], TFMessage).transforms[0]
    assert (tf.header.frame_id, tf.child_frame_id) == ("world", "velodyne")
    assert tf.transform.translation.x == pytest.approx(scans[0].pose[0, 3])


def test_missing_bag_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="rosbag2 not found"):
        list_topics(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="rosbag2 not found"):
        next(read_pointcloud_bag(tmp_path / "nope", "/points"))


def test_unknown_topic_error_lists_available_topics(tmp_path, scans):
    bag = write_pointcloud_bag(tmp_path / "bag", scans[:1])
    with pytest.raises(RosbagError, match=r"'/lidar' not in .*available topics: /points \(sensor_msgs/msg/"
                                          r"PointCloud2\), /tf \(tf2_msgs/msg/TFMessage\)"):
        next(read_pointcloud_bag(bag, "/lidar"))
    with pytest.raises(RosbagError, match="'/tf' .* carries tf2_msgs/msg/TFMessage, not sensor_msgs"):
        next(read_pointcloud_bag(bag, "/tf"))


def _corrupt_storage_file(bag: Path) -> None:
    (data_file,) = [p for p in bag.iterdir() if p.suffix in (".mcap", ".db3")]
    data_file.write_bytes(data_file.read_bytes()[:300])  # truncated mid-file


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_truncated_bag_raises_rosbag_error(tmp_path, scans, storage):
    bag = write_pointcloud_bag(tmp_path / "bag", scans[:2], storage=storage)
    _corrupt_storage_file(bag)
    with pytest.raises(RosbagError, match="bag"):
        list(read_pointcloud_bag(bag, "/points"))


def test_garbage_metadata_raises_rosbag_error(tmp_path, scans):
    bag = write_pointcloud_bag(tmp_path / "bag", scans[:1])
    (bag / "metadata.yaml").write_text("rosbag2_bagfile_information: [unclosed\n")
    with pytest.raises(RosbagError, match="cannot read rosbag2"):
        list_topics(bag)
    not_a_bag = tmp_path / "empty_dir"
    not_a_bag.mkdir()
    with pytest.raises(RosbagError, match="metadata"):
        list_topics(not_a_bag)


def test_writer_refuses_to_overwrite_and_unknown_storage(tmp_path, scans):
    bag = write_pointcloud_bag(tmp_path / "bag", scans[:1])
    with pytest.raises(FileExistsError, match="overwrite=True"):
        write_pointcloud_bag(bag, scans[:1])
    again = write_pointcloud_bag(bag, scans[1:2], overwrite=True)
    assert len(list(read_pointcloud_bag(again, "/points"))) == 1
    with pytest.raises(ValueError, match="storage must be one of"):
        write_pointcloud_bag(tmp_path / "other", scans[:1], storage="bag")


def test_rosbag_sequence_gives_scans_and_their_poses(tmp_path, scans):
    from s2h_ros.datasets.rosbag import RosbagSequence

    bag = write_pointcloud_bag(tmp_path / "bag", scans, storage="sqlite3")
    seq = RosbagSequence(bag, "/points")
    assert len(seq) == 3 and seq.name == "bag:/points"
    np.testing.assert_array_equal(seq[1].points, scans[1].points)
    np.testing.assert_allclose(seq.poses, np.stack([s.pose for s in scans]), atol=1e-12)
    assert len(RosbagSequence(bag, "/points", max_scans=2)) == 2
    assert RosbagSequence(bag, "/points", tf_topic=None).poses is None
