"""Point-cloud file I/O: every format round-trips, the .bin layout rule holds, bad files raise
(the bad-input catalogue, through the library and the CLI, is test_bad_input.py)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from s2h_ros import paths
from s2h_ros.datasets.io import (
    PointCloudFileError,
    PointCloudFileNotFound,
    bin_columns,
    read_point_fields,
    read_points,
    write_points,
)


@pytest.fixture
def cloud(rng):
    points = rng.uniform(-40.0, 40.0, size=(500, 3)).astype(np.float32)
    intensity = rng.uniform(0.0, 1.0, size=500).astype(np.float32)
    normals = rng.normal(size=(500, 3)).astype(np.float32)
    normals /= np.linalg.norm(normals, axis=1, keepdims=True)
    return points, intensity, normals


@pytest.mark.parametrize("name,binary", [
    ("c.ply", True), ("c.ply", False), ("c.pcd", True), ("c.pcd", False),
])
def test_ply_and_pcd_round_trip_points_intensity_and_normals(tmp_path, cloud, name, binary):
    points, intensity, normals = cloud
    path = write_points(tmp_path / name, points, intensity=intensity, normals=normals, binary=binary)
    fields = read_point_fields(path)
    tol = 0 if binary else 1e-4  # ASCII keeps about 6 significant digits
    np.testing.assert_allclose(fields.points, points, atol=tol * 40)
    np.testing.assert_allclose(fields.intensity, intensity, atol=tol)
    np.testing.assert_allclose(fields.normals, normals, atol=tol)
    assert fields.points.dtype == np.float32 and fields.points.shape == (500, 3)


def test_kitti_bin_n_by_4_round_trips_points_and_reflectance(tmp_path, cloud):
    points, intensity, _ = cloud
    path = write_points(tmp_path / "000000.bin", points, intensity=intensity)
    assert path.stat().st_size == 500 * 16
    fields = read_point_fields(path)
    np.testing.assert_array_equal(fields.points, points)
    np.testing.assert_array_equal(fields.intensity, intensity)
    assert fields.normals is None


def test_bin_is_n_by_6_only_when_columns_4_to_6_are_normals(tmp_path, cloud):
    points, intensity, normals = (a[:480] for a in cloud)  # 7680 and 11520 bytes: multiples of 48
    as4 = write_points(tmp_path / "raw.bin", points, intensity=intensity)
    as6 = write_points(tmp_path / "normals.bin", points, normals=normals)
    assert as4.stat().st_size % 48 == 0 and as6.stat().st_size % 48 == 0
    assert bin_columns(as4) == 4 and bin_columns(as6) == 6
    np.testing.assert_array_equal(read_point_fields(as6).normals, normals)
    np.testing.assert_array_equal(read_points(as6, columns=6), points)
    # An explicit width overrides the rule: the same bytes read as N x 4 give 720 rows.
    assert read_points(as6, columns=4).shape == (720, 3)


def test_bin_size_divisible_only_by_24_reads_as_n_by_6(tmp_path, cloud):
    points, _, normals = cloud
    path = write_points(tmp_path / "odd.bin", points[:3], normals=normals[:3])  # 72 bytes
    assert bin_columns(path) == 6
    np.testing.assert_array_equal(read_point_fields(path).normals, normals[:3])


def test_bundled_kitti_sample_is_read_as_n_by_6_with_averaged_normals():
    fields = read_point_fields(paths.KITTI_LOOP_PAIR[0])
    assert fields.points.shape == (29291, 3)
    norms = np.linalg.norm(fields.normals, axis=1)
    assert norms.max() <= 1.001 and np.median(norms) > 0.99
    assert fields.intensity is None


def test_npy_round_trip_and_extra_column_becomes_intensity(tmp_path, cloud):
    points, intensity, _ = cloud
    path = write_points(tmp_path / "c.npy", points, intensity=intensity)
    fields = read_point_fields(path)
    np.testing.assert_array_equal(fields.points, points)
    np.testing.assert_array_equal(fields.intensity, intensity)
    np.save(tmp_path / "i16.npy", points.astype(np.int16))
    assert read_points(tmp_path / "i16.npy").dtype == np.float32


@pytest.mark.parametrize("name", ["g.npy", "g.ply", "g.pcd"])
def test_float64_coordinates_keep_their_precision(tmp_path, name):
    """Georeferenced (UTM-like) coordinates stay float64: the pipeline centres them before float32."""
    points = np.array([[500000.123456, 5400000.654321, 312.0625]] * 3) + np.arange(3)[:, None]
    if name.endswith(".npy"):
        np.save(tmp_path / name, points)
    else:
        import open3d as o3d

        cloud = o3d.t.geometry.PointCloud()
        cloud.point.positions = o3d.core.Tensor(points)
        assert o3d.t.io.write_point_cloud(str(tmp_path / name), cloud)
    read = read_points(tmp_path / name)
    assert read.dtype == np.float64
    np.testing.assert_array_equal(read, points)


def test_pth_fragment_holding_a_numpy_array_is_read(tmp_path, cloud):
    points = cloud[0]
    torch.save(points.astype(np.float64), tmp_path / "cloud_bin_0.pth")
    np.testing.assert_allclose(read_points(tmp_path / "cloud_bin_0.pth"), points)


def test_rows_with_nan_are_dropped_with_their_fields(tmp_path, cloud):
    points, intensity, _ = cloud
    points = points.copy()
    points[[3, 7], 1] = np.nan
    fields = read_point_fields(write_points(tmp_path / "n.pcd", points, intensity=intensity))
    assert len(fields) == 498 and len(fields.intensity) == 498
    np.testing.assert_array_equal(fields.intensity, np.delete(intensity, [3, 7]))


def test_missing_file_raises_not_found(tmp_path):
    with pytest.raises(PointCloudFileNotFound, match="not found"):
        read_points(tmp_path / "nope.ply")
    with pytest.raises(FileNotFoundError):
        read_points(tmp_path / "nope.bin")


def test_unknown_extension_and_bag_are_refused(tmp_path):
    (tmp_path / "c.xyz").write_text("1 2 3\n")
    with pytest.raises(PointCloudFileError, match="unknown point-cloud extension"):
        read_points(tmp_path / "c.xyz")
    with pytest.raises(PointCloudFileError, match="read_pointcloud_bag"):
        read_points(tmp_path / "run.mcap")


def test_bin_of_neither_row_width_raises(tmp_path):
    (tmp_path / "bad.bin").write_bytes(np.zeros(5, np.float32).tobytes())  # 20 bytes
    with pytest.raises(PointCloudFileError, match="not a whole number of N x 4 float32 rows"):
        read_points(tmp_path / "bad.bin")


def test_explicit_columns_fix_the_bin_layout(tmp_path, cloud):
    points, intensity, normals = cloud
    path = write_points(tmp_path / "n.bin", points[:4], normals=normals[:4])  # 96 bytes: 4 x 6 or 6 x 4
    assert read_points(path).shape == (4, 3)
    np.testing.assert_array_equal(read_points(path, columns=4)[0], points[0])
    with pytest.raises(PointCloudFileError, match="4 or 6 float32 columns, not 5"):
        read_points(path, columns=5)


@pytest.mark.parametrize("name,binary", [
    ("t.ply", True), ("t.ply", False), ("t.pcd", True), ("t.pcd", False),
])
def test_truncated_ply_and_pcd_raise(tmp_path, cloud, name, binary):
    path = write_points(tmp_path / name, cloud[0], binary=binary)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - len(data) // 4])
    with pytest.raises(PointCloudFileError, match="truncated|no points"):
        read_points(path)


@pytest.mark.parametrize("name", ["g.ply", "g.pcd", "g.npy"])
def test_garbage_file_raises(tmp_path, name):
    (tmp_path / name).write_bytes(b"\x00\x17garbage" * 20)
    with pytest.raises(PointCloudFileError):
        read_points(tmp_path / name)


def test_empty_file_and_nan_only_cloud_raise(tmp_path):
    (tmp_path / "e.bin").write_bytes(b"")
    with pytest.raises(PointCloudFileError, match="empty file"):
        read_points(tmp_path / "e.bin")
    np.save(tmp_path / "nan.npy", np.full((10, 3), np.nan, np.float32))
    with pytest.raises(PointCloudFileError, match="NaN"):
        read_points(tmp_path / "nan.npy")
    np.save(tmp_path / "zero.npy", np.zeros((0, 3), np.float32))
    with pytest.raises(PointCloudFileError, match="no points"):
        read_points(tmp_path / "zero.npy")


def test_wrong_array_shapes_raise(tmp_path):
    np.save(tmp_path / "flat.npy", np.zeros(12, np.float32))
    with pytest.raises(PointCloudFileError, match="shape"):
        read_points(tmp_path / "flat.npy")
    with pytest.raises(PointCloudFileError, match="shape"):
        write_points(tmp_path / "w.ply", np.zeros((5, 2)))
    with pytest.raises(PointCloudFileError, match="empty"):
        write_points(tmp_path / "w.ply", np.zeros((0, 3)))


def test_hand_written_pcl_style_ascii_pcd_with_intensity_is_read(tmp_path):
    header = ("# .PCD v0.7 - Point Cloud Data file format\nVERSION 0.7\nFIELDS x y z intensity\n"
              "SIZE 4 4 4 4\nTYPE F F F F\nCOUNT 1 1 1 1\nWIDTH 3\nHEIGHT 1\n"
              "VIEWPOINT 0 0 0 1 0 0 0\nPOINTS 3\nDATA ascii\n")
    (tmp_path / "pcl.pcd").write_text(header + "1 2 3 0.5\nnan nan nan 0\n-4 5.5 6 0.25\n")
    fields = read_point_fields(tmp_path / "pcl.pcd")
    np.testing.assert_array_equal(fields.points, [[1, 2, 3], [-4, 5.5, 6]])
    np.testing.assert_array_equal(fields.intensity, [0.5, 0.25])


def test_hand_written_ascii_ply_with_uchar_colours_is_read(tmp_path):
    header = ("ply\nformat ascii 1.0\ncomment from another tool\nelement vertex 2\nproperty float x\n"
              "property float y\nproperty float z\nproperty uchar red\nproperty uchar green\n"
              "property uchar blue\nend_header\n")
    (tmp_path / "c.ply").write_text(header + "0 0 1 255 0 0\n1 2 3 0 51 255\n")
    fields = read_point_fields(tmp_path / "c.ply")
    np.testing.assert_array_equal(fields.points, [[0, 0, 1], [1, 2, 3]])
    np.testing.assert_allclose(fields.colors, [[1, 0, 0], [0, 0.2, 1]], atol=1e-6)


def test_three_column_bin_reads_raw_xyz_only_when_asked(tmp_path):
    """Raw x, y, z .bin files (the RAW KITTI and Newer College samples) read with columns=3; by
    size alone they would be taken for N x 4 rows, so the reader never guesses 3."""
    raw = Path(__file__).resolve().parents[2] / "shared" / "data" / "kitti" / "raw_00" / "000000.bin"
    points = read_points(raw, columns=3)
    assert points.shape == (124_668, 3)
    ranges = np.linalg.norm(points, axis=1)
    assert 1.0 < np.median(ranges) < 40.0 and ranges.max() < 130.0  # an HDL-64E scan, metres
    # 1,496,016 bytes also divide into 16-byte rows: the 4th column then holds coordinates
    with pytest.raises(PointCloudFileError, match="negative: not a KITTI .bin file.*columns=3"):
        read_points(raw)
