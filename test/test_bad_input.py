"""Bad input never crashes and never passes silently: one clear error per layer, or a counted drop.

Layers and their one error type: file readers ``PointCloudFileError`` (``PointCloudFileNotFound``
for a missing file), the PointCloud2 codec ``PointCloud2Error``, the pipeline ``RegistrationError``;
``s2h register`` maps them to exit 2 (1: not trusted, 3: internal error) with one stderr line.
Every file here is written in its real format into tmp_path; the CLI runs as a subprocess.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from s2h_ros import geometry, paths
from s2h_ros.cloud import MAX_RANGE_M, RegistrationError
from s2h_ros.datasets.io import PointCloudFileError, PointCloudFileNotFound, read_point_fields, read_points, write_points
from s2h_ros.pipeline import register
from s2h_ros.pointcloud2 import PointCloud2Error, create_cloud_fields, read_xyz

S2H = str(Path(__file__).resolve().parents[1] / ".venv" / "bin" / "s2h")
PCD_XYZ = "VERSION 0.7\nFIELDS x y z\nSIZE 4 4 4\nTYPE F F F\nCOUNT 1 1 1\nWIDTH 3\nHEIGHT 1\nPOINTS 3\nDATA ascii\n"
PLY_XYZ = "ply\nformat {fmt} 1.0\nelement vertex {n}\nproperty float x\nproperty float y\nproperty float z\nend_header\n"


def s2h_register(*args: str | Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([S2H, "register", *map(str, args)], capture_output=True, text=True, timeout=600, env=env)


def assert_one_error_line(out: subprocess.CompletedProcess, status: int, *needles: str) -> str:
    """Exit ``status``, exactly one stderr line starting ``s2h register:`` holding every needle."""
    assert out.returncode == status, (out.returncode, out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("s2h register: "), out.stderr
    assert "Traceback" not in out.stderr + out.stdout
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def scan() -> np.ndarray:
    """A real KITTI scan, (N, 3) float32 (x, y, z of the bundled N x 6 sample)."""
    return read_points(paths.KITTI_LOOP_PAIR[0])


@pytest.fixture
def kitti_bin(tmp_path, scan) -> Path:
    """The scan as a raw KITTI N x 4 .bin (x, y, z, reflectance)."""
    return write_points(tmp_path / "000000.bin", scan, intensity=np.full(len(scan), 0.5, np.float32))


@pytest.fixture(scope="module")
def small_pair(scan):
    """The scan within 20 m (about 18k points) and a copy moved by a known T: registers in ~1 s."""
    target = scan[np.linalg.norm(scan[:, :2], axis=1) < 20.0].astype(np.float64)
    T = geometry.make_transform(Rotation.from_euler("z", 10, degrees=True).as_matrix(), np.array([1.0, 0.5, 0.0]))
    return geometry.apply_transform(geometry.invert_transform(T), target), target, T


@pytest.fixture(scope="module")
def small_result(small_pair):
    source, target, T = small_pair
    result = register(source, target)
    re, te = geometry.transform_errors(result.transform, T)
    assert result.success and re < 0.1 and te < 0.02, (result.message, re, te)
    return result


# ------------------------------------------------------------------- files: the readers' layer


def test_missing_file(tmp_path):
    with pytest.raises(PointCloudFileNotFound, match="point-cloud file not found: .*nope.ply"):
        read_points(tmp_path / "nope.ply")
    assert_one_error_line(s2h_register(tmp_path / "nope.ply", tmp_path / "b.ply"), 2, "not found", "nope.ply")


def test_wrong_extension(tmp_path):
    (tmp_path / "c.xyz").write_text("1 2 3\n")
    with pytest.raises(PointCloudFileError, match=r"unknown point-cloud extension '.xyz'.*known: .bin, .ply"):
        read_points(tmp_path / "c.xyz")
    assert_one_error_line(s2h_register(tmp_path / "c.xyz", tmp_path / "c.xyz"), 2, "unknown point-cloud extension")


def test_empty_file(tmp_path):
    (tmp_path / "e.pcd").write_bytes(b"")
    with pytest.raises(PointCloudFileError, match="e.pcd is an empty file"):
        read_points(tmp_path / "e.pcd")
    assert_one_error_line(s2h_register(tmp_path / "e.pcd", tmp_path / "e.pcd"), 2, "empty file")


def test_random_bytes_as_bin_are_refused_not_hashed(tmp_path, kitti_bin):
    rng = np.random.default_rng(1)
    (tmp_path / "odd.bin").write_bytes(rng.bytes(16001))  # no whole rows: the reader refuses it
    with pytest.raises(PointCloudFileError, match="16001 bytes is not a whole number of N x 4 float32 rows"):
        read_points(tmp_path / "odd.bin")
    (tmp_path / "rand.bin").write_bytes(rng.bytes(48000))  # 3000 whole N x 4 rows (4000 N x 3) of random floats
    with pytest.raises(PointCloudFileError, match="50 % of the 4th column .* is negative: not a KITTI .bin"):
        read_points(tmp_path / "rand.bin")  # half the "reflectances" are negative
    assert_one_error_line(s2h_register(tmp_path / "rand.bin", kitti_bin), 2, "rand.bin:", "reflectance")
    points = read_points(tmp_path / "rand.bin", columns=3)  # forced: random floats as x, y, z
    with pytest.raises(RegistrationError, match=r"source: \d+ of \d+ finite points lie more than 10000 m .*not metric"):
        register(points, points)


def test_truncated_n_by_4_bin_whose_size_divides_by_24_is_refused(tmp_path, kitti_bin):
    data = kitti_bin.read_bytes()
    cut = tmp_path / "cut.bin"
    cut.write_bytes(data[:15000])  # 937.5 rows of 16 bytes, 625 rows of 24: was read as N x 6 garbage
    with pytest.raises(PointCloudFileError, match="not a whole number of N x 4 .* columns 4-6 are not normals"):
        read_points(cut)
    assert_one_error_line(s2h_register(cut, kitti_bin), 2, "cut.bin", "truncated or not a KITTI .bin")


def test_six_column_bin_needs_normals_or_an_explicit_columns(tmp_path, scan):
    rng = np.random.default_rng(2)
    extra = rng.uniform(-50, 50, size=(len(scan), 3)).astype(np.float32)  # not normals
    path = tmp_path / "six.bin"
    np.hstack([scan, extra]).tofile(path)  # 29291 rows x 24 bytes: not a whole number of 16-byte rows
    with pytest.raises(PointCloudFileError, match="not normals"):
        read_points(path)
    np.testing.assert_array_equal(read_points(path, columns=6), scan)
    assert_one_error_line(s2h_register(path, path, "--columns", "5"), 2, "4 or 6 float32 columns, not 5")


@pytest.mark.parametrize("fmt", ["binary_little_endian", "ascii"])
def test_ply_with_a_negative_vertex_count_never_reaches_open3d(tmp_path, fmt):
    body = np.zeros(30, np.float32).tobytes() if fmt != "ascii" else b"1 2 3\n4 5 6\n"
    path = tmp_path / "neg.ply"
    path.write_bytes(PLY_XYZ.format(fmt=fmt, n=-5).encode() + body)
    with pytest.raises(PointCloudFileError, match=r"header line 'element vertex -5': '-5' is not a whole number >= 0"):
        read_points(path)
    assert_one_error_line(s2h_register(path, path), 2, "element vertex -5")


def test_ply_with_an_absurd_vertex_count_is_refused(tmp_path):
    path = tmp_path / "huge.ply"
    path.write_bytes(PLY_XYZ.format(fmt="binary_little_endian", n=10**15).encode() + np.zeros(30, np.float32).tobytes())
    with pytest.raises(PointCloudFileError, match="announces 1000000000000000 elements; the body has 120 bytes"):
        read_points(path)


@pytest.mark.parametrize("row, problem", [("foo bar baz", "'foo bar baz'"), ("7 8", "'7 8'"), ("1 2 3 4", "'1 2 3 4'")])
def test_ascii_pcd_row_that_is_not_three_numbers_is_an_error(tmp_path, row, problem):
    path = tmp_path / "rows.pcd"
    path.write_text(PCD_XYZ + f"1 2 3\n{row}\n4 5 6\n")  # Open3D read text as (0, 0, 0), a short row as garbage
    with pytest.raises(PointCloudFileError, match=f"rows.pcd: line 11: {problem} is not 3 numbers \\(x y z\\)"):
        read_points(path)
    if row == "foo bar baz":
        assert_one_error_line(s2h_register(path, path), 2, "line 11", "is not 3 numbers")


def test_ascii_ply_row_of_text_is_an_error(tmp_path):
    path = tmp_path / "text.ply"
    path.write_text(PLY_XYZ.format(fmt="ascii", n=3) + "1 2 3\nfoo 2 3\n4 5 6\n")
    with pytest.raises(PointCloudFileError, match=r"text.ply: line 9: 'foo 2 3' is not 3 numbers \(x y z\)"):
        read_points(path)


def test_pcd_header_counts_must_be_consistent(tmp_path):
    path = tmp_path / "h.pcd"
    path.write_text(PCD_XYZ.replace("POINTS 3", "POINTS -3") + "1 2 3\n7 8 9\n4 5 6\n")
    with pytest.raises(PointCloudFileError, match="header line 'POINTS -3': '-3' is not a whole number >= 0"):
        read_points(path)
    path.write_text(PCD_XYZ.replace("POINTS 3", "POINTS 2") + "1 2 3\n7 8 9\n4 5 6\n")
    with pytest.raises(PointCloudFileError, match="POINTS 2 but WIDTH 3 x HEIGHT 1"):
        read_points(path)


def test_binary_formats_cut_short_are_refused(tmp_path, scan):
    for name in ("cut.ply", "cut.pcd"):
        path = write_points(tmp_path / name, scan[:100])
        path.write_bytes(path.read_bytes()[:-50])
        with pytest.raises(PointCloudFileError, match=f"{name}: truncated (PLY|PCD): 100 (vertices|points) need 1200 bytes"):
            read_points(path)


def test_npy_of_shape_3_by_n_is_refused_with_the_transpose_hint(tmp_path, scan):
    np.save(tmp_path / "t.npy", scan[:500].T)
    hint = r"got shape \(3, 500\).*looks transposed, pass its transpose \(shape \(500, 3\)\)"
    with pytest.raises(PointCloudFileError, match=hint):
        read_points(tmp_path / "t.npy")
    with pytest.raises(RegistrationError, match="source: " + hint):
        register(scan[:500].T, scan)
    assert_one_error_line(s2h_register(tmp_path / "t.npy", tmp_path / "t.npy"), 2, "looks transposed")


def test_zero_size_and_flat_arrays(tmp_path):
    np.save(tmp_path / "zero.npy", np.zeros((0, 3), np.float32))
    with pytest.raises(PointCloudFileError, match="zero.npy: the cloud has no points"):
        read_points(tmp_path / "zero.npy")
    with pytest.raises(RegistrationError, match=r"source has no finite points \(0 given\)"):
        register(np.zeros((0, 3)), np.zeros((10, 3)))
    with pytest.raises(RegistrationError, match=r"expected an \(N, 3\) array.*got shape \(12,\)"):
        register(np.zeros(12), np.zeros((10, 3)))
    with pytest.raises(RegistrationError, match="expected numeric coordinates, got dtype <U1"):
        register(np.full((10, 3), "a"), np.zeros((10, 3)))
    assert_one_error_line(s2h_register(tmp_path / "zero.npy", tmp_path / "zero.npy"), 2, "no points")


def test_nan_and_inf_rows_are_dropped_and_counted(tmp_path, scan):
    points = scan[:200].copy()
    points[[3, 50], 0], points[120, 2] = np.nan, np.inf
    fields = read_point_fields(write_points(tmp_path / "n.pcd", points))
    assert len(fields) == 197 and fields.num_non_finite == 3
    np.save(tmp_path / "nan.npy", np.full((10, 3), np.nan, np.float32))
    with pytest.raises(PointCloudFileError, match="all 10 points are NaN or infinite"):
        read_points(tmp_path / "nan.npy")
    assert_one_error_line(s2h_register(tmp_path / "nan.npy", tmp_path / "n.pcd"), 2, "all 10 points are NaN or infinite")


def test_too_few_points(scan):
    with pytest.raises(RegistrationError, match=r"source has only 2 occupied voxels at 0.3 m \(from 2 points"):
        register(np.array([[0.0, 0.0, 0.0], [10.0, 0.0, 0.0]]), scan)


# ------------------------------------------------------------------- arrays: the pipeline's layer


@pytest.mark.parametrize("bad", [1e9, 1e30, -3e38])
def test_one_absurd_point_is_dropped_counted_and_changes_nothing(small_pair, small_result, bad):
    source, target, _ = small_pair
    result = register(np.vstack([source, [[bad, 0.0, 0.0]]]), target)  # was: ValueError/IndexError in hashing
    assert result.dropped_points["source_out_of_range"] == 1 and result.dropped_points["source_non_finite"] == 0
    np.testing.assert_allclose(result.transform, small_result.transform, atol=1e-6)
    assert result.success


def test_nan_rows_in_an_array_are_dropped_counted_and_change_nothing(small_pair, small_result):
    source, target, _ = small_pair
    result = register(np.vstack([source, [[np.nan, 0, 0], [0, np.inf, 0]]]), target)
    assert result.dropped_points["source_non_finite"] == 2 and result.success
    np.testing.assert_allclose(result.transform, small_result.transform, atol=1e-6)


def test_float32_georeferenced_coordinates_are_refused_not_collapsed(small_pair):
    source, target, _ = small_pair
    offset = np.array([500000.0, 5400000.0, 0.0])  # UTM: float32 steps of 0.03-0.5 m there
    with pytest.raises(RegistrationError, match=r"source: float32 coordinates reach 5\.4e\+06 m, .*0\.5 m steps.*pass float64"):
        register((source + offset).astype(np.float32), target + offset)


def test_cloud_too_wide_for_the_inlier_networks_6d_keys_is_a_clear_error(tmp_path):
    """With user weights that carry DGR's 6-D inlier network (none ship), a cloud wider than its
    kernel-map keys allow is refused by name instead of failing inside the hashing."""
    import torch

    from s2h_ros.config import RegistrationConfig
    from s2h_ros.models.fcgf import build_fcgf
    from s2h_ros.models.inlier import InlierNetwork

    path = tmp_path / "dgr.pth"
    torch.save({"state_dict": build_fcgf("compact").state_dict(),
                "state_dict_inlier": InlierNetwork("compact").state_dict()}, path)
    cloud = np.random.default_rng(4).uniform(-300, 300, size=(3000, 3))  # 2000 voxels a side: 2000^6 > 2^62 keys
    with pytest.raises(RegistrationError, match=r"span \[\d+, .*too wide for the inlier network's 6-D .*use_inlier_model false"):
        register(cloud, cloud, RegistrationConfig(weights=str(path), features="fcgf"))


@pytest.fixture(scope="module")
def loop_pair():
    from s2h_ros.datasets.kitti import kitti_loop_pair

    pair = kitti_loop_pair()
    source, target = pair.source.astype(np.float64), pair.target.astype(np.float64)
    return source, target, register(source, target), pair.T_gt


@pytest.mark.parametrize("offset, same_grid", [
    ((1e6, -1e6, 0.0), True),  # whole multiples of the origin grid: the same local clouds (arccos noise ~1e-6 deg)
    ((1e9, 1e9, 1e3), True),  # 1e9 m: float32 collapsed this to about 10 voxels before
    ((1e6 + 123.45, -2e6 + 67.8, 30.1), False),  # another voxel grid phase: other voxels, same accuracy
])
def test_georeferenced_pair_registers_as_at_the_origin(loop_pair, offset, same_grid):
    """The real KITTI loop pair moved to UTM-like coordinates: the transform in the offset frame,
    carried back (Tr(-o) T Tr(o), the same o for both clouds), equals the un-offset result (the
    same voxels) or is as close to the ground truth as it (the grid falls elsewhere)."""
    source, target, at_origin, T_gt = loop_pair
    o = np.asarray(offset)
    result = register(source + o, target + o)
    assert result.success == at_origin.success and result.success, result.message
    back = geometry.shift_transform(result.transform, -o, -o)
    if same_grid:
        re, te = geometry.transform_errors(back, at_origin.transform)
        assert re < 1e-4 and te < 1e-6, (re, te)
    else:
        (re, te), (re0, te0) = geometry.transform_errors(back, T_gt), geometry.transform_errors(at_origin.transform, T_gt)
        assert re < max(2 * re0, 0.1) and te < max(2 * te0, 0.02), (re, te, re0, te0)
    # The transform itself is in the offset frame: its translation is (I - R) o, far from the origin one's.
    assert np.linalg.norm(result.transform[:3, 3] - at_origin.transform[:3, 3]) > 1e3
    assert result.source_xyz.dtype == np.float64 and np.abs(np.median(result.source_xyz, 0) - o).max() < 50


# ------------------------------------------------------------------- PointCloud2 messages


def _message(xyz: np.ndarray, bigendian: bool = False, **overrides) -> SimpleNamespace:
    fields, point_step, data = create_cloud_fields(xyz.astype(np.float32))
    if bigendian:  # every field is float32: swapping each 4-byte word gives the big-endian bytes
        data = np.frombuffer(data, dtype="<f4").astype(">f4").tobytes()
    msg = SimpleNamespace(height=1, width=len(xyz), point_step=point_step, row_step=point_step * len(xyz),
                          is_bigendian=bigendian, data=data,
                          fields=[SimpleNamespace(name=n, offset=o, datatype=d, count=c) for n, o, d, c in fields])
    for key, value in overrides.items():
        setattr(msg, key, value)
    return msg


def test_big_endian_pointcloud2_decodes_to_the_same_points(scan):
    np.testing.assert_array_equal(read_xyz(_message(scan, bigendian=True))[0], scan)


def test_pointcloud2_whose_byte_order_flag_is_wrong_is_refused_by_the_pipeline(scan):
    swapped, _ = read_xyz(_message(scan, is_bigendian=True))  # little-endian bytes flagged big-endian
    with pytest.raises(RegistrationError, match="not metric coordinates .*byte-swapped"):
        register(swapped, scan)


@pytest.mark.parametrize("overrides, problem", [
    ({"row_step": 16 * 29291}, r"data holds 351492 bytes; height 1 \* row_step 468656 = 468656"),
    ({"row_step": 12}, r"row_step 12 < width 29291 \* point_step 12"),
    ({"height": 2}, r"data holds 351492 bytes; height 2 \* row_step 351492 = 702984"),
    ({"data": b"\0" * 351500}, r"data holds 351500 bytes; height 1 \* row_step 351492"),
    ({"width": -1}, "width is -1; expected >= 0"),
])
def test_inconsistent_pointcloud2_names_the_field(scan, overrides, problem):
    with pytest.raises(PointCloud2Error, match=problem):
        read_xyz(_message(scan, **overrides))


# ------------------------------------------------------------------- the CLI's contract


def test_help_documents_the_exit_status():
    out = subprocess.run([S2H, "register", "--help"], capture_output=True, text=True, timeout=60)
    text = " ".join(out.stdout.split())
    assert out.returncode == 0
    assert "exit status: 0 trusted; 1 registered but not trusted; 2 bad input" in text and "3 internal error" in text


def test_bad_options_are_one_line_and_exit_2(tmp_path, kitti_bin):
    assert_one_error_line(s2h_register(kitti_bin, kitti_bin, "--voxel-size", "-1"), 2, "voxel_size: -1.0 is outside")
    assert_one_error_line(s2h_register(kitti_bin, kitti_bin, "--columns", "x"), 2,
                          "argument --columns: invalid int value", "--help")
    (tmp_path / "gt.txt").write_text("1 0 0\n0 1 0\n")
    assert_one_error_line(s2h_register(kitti_bin, kitti_bin, "--gt", tmp_path / "gt.txt"), 2,
                          "--gt", "expected 16 finite numbers")


def test_unwritable_json_exits_2_naming_it(tmp_path, small_pair):
    """--json where no file can be made (under a regular file): the report on stdout, then exit 2
    with one line naming --json."""
    cloud = write_points(tmp_path / "c.bin", small_pair[1])
    out = s2h_register(cloud, cloud, "--json", cloud / "r.json")
    assert_one_error_line(out, 2, f"cannot write --json {cloud / 'r.json'}")
    assert "success: True" in out.stdout


def test_absurd_point_in_a_file_is_a_warning_and_the_result_is_trusted(tmp_path, small_pair):
    target = small_pair[1]
    good = write_points(tmp_path / "good.bin", target)
    bad = write_points(tmp_path / "bad.bin", np.vstack([target, [[1e9, 0, 0]]]))
    out = s2h_register(bad, good, "--json", tmp_path / "out" / "r.json")
    line = assert_one_error_line(out, 0, "warning: source: dropped 1 points more than")
    assert f"{MAX_RANGE_M:g} m" in line and "success: True" in out.stdout
    result = json.loads((tmp_path / "out" / "r.json").read_text())
    assert result["success"] and result["dropped_points"]["source_out_of_range"] == 1
    np.testing.assert_allclose(result["transform"], np.eye(4), atol=1e-4)
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["r.json"]  # atomic: no temporary left


def test_not_trusted_exits_1_with_the_reason_on_stderr(tmp_path):
    rng = np.random.default_rng(3)
    for name in ("a.npy", "b.npy"):  # two unrelated boxes of points
        np.save(tmp_path / name, rng.uniform(-10, 10, size=(3000, 3)))
    out = s2h_register(tmp_path / "a.npy", tmp_path / "b.npy", "--features", "fpfh", "--ransac-iters", "1000",
                       "--json", tmp_path / "r.json")
    assert_one_error_line(out, 1, "not trusted:")
    assert json.loads((tmp_path / "r.json").read_text())["success"] is False


def test_internal_error_exits_3_without_a_traceback_unless_asked(monkeypatch, capsys, kitti_bin):
    import s2h_ros.pipeline
    from s2h_ros.cli import main

    def broken(*args, **kwargs):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(s2h_ros.pipeline, "register", broken)
    assert main(["register", str(kitti_bin), str(kitti_bin)]) == 3
    err = capsys.readouterr().err
    assert err == "s2h register: internal error: RuntimeError: boom second line\n"
    monkeypatch.setenv("S2H_DEBUG", "1")
    assert main(["register", str(kitti_bin), str(kitti_bin)]) == 3
    err = capsys.readouterr().err
    assert "Traceback" in err and err.endswith("s2h register: internal error: RuntimeError: boom second line\n")
