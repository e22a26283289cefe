"""Point-cloud files: read and write KITTI ``.bin``, PLY, PCD and NPY (plus 3DMatch ``.pth``).

One entry, :func:`read_points`, returns ``(N, 3) float32`` metres whatever the format;
:func:`read_point_fields` also returns intensity / normals / colours when the file has them.
PLY and PCD go through Open3D's tensor I/O (``o3d.t.io``: ASCII, binary and, for PCD, binary
compressed). Open3D only logs a warning and hands back a half-filled cloud when a PLY body or
an ASCII PCD body is cut short, so the readers check the header's point count against the body
themselves (:func:`_check_complete`) and raise instead of returning garbage.

KITTI ``.bin`` files are headerless float32 rows: raw scans are ``N x 4`` (x, y, z,
reflectance); the bundled, grid-averaged sample is ``N x 6`` (x, y, z, nx, ny, nz). With
``columns=None`` the layout is decided by this rule:

* file size divisible by 16 only -> ``N x 4``; by 24 only -> ``N x 6``; by neither -> error;
* divisible by both (every multiple of 48 bytes): ``N x 6`` when, read that way, at least 99 %
  of the rows have ``|(c3, c4, c5)| <= 1.001`` (unit or averaged normals), else ``N x 4``. Read
  as ``N x 6``, a raw scan puts x/y coordinates into those columns, which are rarely all within
  1 m of the sensor; pass ``columns=4`` or ``6`` when a file defeats the rule.

Rows whose x, y or z is NaN/inf are dropped (organised PCD files use NaN for "no return"); a
file left with no point raises.

Errors: every problem raises :class:`PointCloudFileError`, a ``ValueError`` (bad input, like
the rest of the library); a missing file raises its subclass :class:`PointCloudFileNotFound`,
which is also a ``FileNotFoundError``.

ROS bags are sequences, not single clouds: :func:`read_points` refuses ``.mcap``/``.db3`` and
bag folders and names ``s2h_ros.datasets.rosbag.read_pointcloud_bag`` instead.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

POINT_EXTENSIONS = (".bin", ".ply", ".pcd", ".npy", ".pth")
BAG_EXTENSIONS = (".mcap", ".db3")
NORMAL_NORM_LIMIT = 1.001  # |normal| bound used to recognise an N x 6 .bin file
NORMAL_ROW_FRACTION = 0.99


class PointCloudFileError(ValueError):
    """A point-cloud file is missing, unreadable, truncated, empty or of an unknown kind."""


class PointCloudFileNotFound(PointCloudFileError, FileNotFoundError):
    """The point-cloud file does not exist."""


@dataclass
class PointFields:
    """A cloud read from a file: positions plus whatever per-point fields the file carries."""

    points: np.ndarray  # (N, 3) float32, metres
    intensity: np.ndarray | None = None  # (N,) float32 (KITTI reflectance, PCD/PLY intensity)
    normals: np.ndarray | None = None  # (N, 3) float32
    colors: np.ndarray | None = None  # (N, 3) float32 in [0, 1]

    def __len__(self) -> int:
        return len(self.points)


# --------------------------------------------------------------------------- reading


def read_points(path: str | Path, columns: int | None = None) -> np.ndarray:
    """Read a point-cloud file into ``(N, 3) float32`` (see the module docstring for formats)."""
    return read_point_fields(path, columns=columns).points


def read_point_fields(path: str | Path, columns: int | None = None) -> PointFields:
    """Read positions and the extra fields present (intensity, normals, colours).

    ``columns`` fixes the row width of a KITTI ``.bin`` file (4 or 6) or selects how many
    leading columns of an ``.npy`` array are used; ``None`` detects it.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix in BAG_EXTENSIONS or (path.is_dir() and (path / "metadata.yaml").exists()):
        raise PointCloudFileError(
            f"{path} is a ROS bag (a scan sequence): use "
            "s2h_ros.datasets.rosbag.read_pointcloud_bag(path, topic)"
        )
    if not path.exists():
        raise PointCloudFileNotFound(f"point-cloud file not found: {path}")
    if path.is_dir():
        raise PointCloudFileError(f"{path} is a directory, not a point-cloud file")
    if suffix not in POINT_EXTENSIONS:
        raise PointCloudFileError(
            f"unknown point-cloud extension {suffix!r} of {path} (known: {', '.join(POINT_EXTENSIONS)})"
        )
    if path.stat().st_size == 0:
        raise PointCloudFileError(f"{path} is an empty file")
    reader = {
        ".bin": _read_bin,
        ".ply": _read_open3d,
        ".pcd": _read_open3d,
        ".npy": _read_npy,
        ".pth": _read_pth,
    }[suffix]
    fields = reader(path, columns) if suffix in (".bin", ".npy", ".pth") else reader(path)
    return _drop_nonfinite(fields, path)


def bin_columns(path: str | Path) -> int:
    """Row width (4 or 6 float32) of a KITTI-style ``.bin`` file, by the module's rule."""
    path = Path(path)
    size = path.stat().st_size
    by16, by24 = size % 16 == 0, size % 24 == 0
    if not (by16 or by24):
        raise PointCloudFileError(
            f"{path}: {size} bytes is a whole number of neither N x 4 (16-byte) nor "
            "N x 6 (24-byte) float32 rows: truncated or not a KITTI .bin file"
        )
    if by16 != by24:
        return 4 if by16 else 6
    rows = np.fromfile(path, dtype=np.float32).reshape(-1, 6)
    with np.errstate(invalid="ignore", over="ignore"):
        norms = np.linalg.norm(rows[:, 3:].astype(np.float64), axis=1)
    return 6 if np.mean(norms <= NORMAL_NORM_LIMIT) >= NORMAL_ROW_FRACTION else 4


def _read_bin(path: Path, columns: int | None) -> PointFields:
    if columns is None:
        columns = bin_columns(path)
    if columns not in (4, 6):
        raise PointCloudFileError(f"{path}: a .bin file has 4 or 6 float32 columns, not {columns}")
    data = np.fromfile(path, dtype=np.float32)
    if data.size % columns:
        raise PointCloudFileError(
            f"{path}: {data.size} float32 values do not fill rows of {columns}: truncated file?"
        )
    rows = data.reshape(-1, columns)
    if columns == 4:
        return PointFields(rows[:, :3].copy(), intensity=rows[:, 3].copy())
    return PointFields(rows[:, :3].copy(), normals=rows[:, 3:6].copy())


def _fields_from_array(array: np.ndarray, path: Path, columns: int | None) -> PointFields:
    """``(N, >=3)`` array -> fields: a 4th column is intensity, 6 columns are xyz + normals."""
    if array.ndim != 2 or array.shape[1] < 3:
        raise PointCloudFileError(f"{path}: expected an (N, >=3) array, got shape {array.shape}")
    if not np.issubdtype(array.dtype, np.number):
        raise PointCloudFileError(f"{path}: expected a numeric array, got dtype {array.dtype}")
    if columns is not None:
        if not 3 <= columns <= array.shape[1]:
            raise PointCloudFileError(f"{path}: columns={columns} but the array has {array.shape[1]}")
        array = array[:, :columns]
    array = np.asarray(array, dtype=np.float32)
    fields = PointFields(np.ascontiguousarray(array[:, :3]))
    if array.shape[1] == 4:
        fields.intensity = array[:, 3].copy()
    elif array.shape[1] == 6:
        fields.normals = array[:, 3:6].copy()
    return fields


def _read_npy(path: Path, columns: int | None) -> PointFields:
    try:
        array = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as error:
        raise PointCloudFileError(f"{path}: not a readable .npy array ({error})") from error
    return _fields_from_array(array, path, columns)


def _read_pth(path: Path, columns: int | None) -> PointFields:
    """3DMatch fragments as FCGF/Predator users have them: a torch-saved (N, 3) array."""
    import torch

    numpy_globals = [np.ndarray, np.dtype]
    if hasattr(np, "dtypes"):  # numpy >= 1.25 pickles dtypes through these classes
        numpy_globals += [np.dtypes.Float32DType, np.dtypes.Float64DType]
    try:
        reconstruct = np._core.multiarray._reconstruct  # numpy 2
    except AttributeError:  # pragma: no cover - numpy 1.x
        reconstruct = np.core.multiarray._reconstruct
    try:
        with torch.serialization.safe_globals([reconstruct, *numpy_globals]):
            data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises many types for a bad archive
        raise PointCloudFileError(f"{path}: not a readable .pth point array ({error})") from error
    if isinstance(data, dict):
        data = next((data[k] for k in ("points", "xyz", "pcd") if k in data), None)
    if isinstance(data, torch.Tensor):
        data = data.detach().cpu().numpy()
    if not isinstance(data, np.ndarray):
        raise PointCloudFileError(f"{path}: a .pth file must hold an (N, 3) array or tensor")
    return _fields_from_array(data, path, columns)


def _read_open3d(path: Path) -> PointFields:
    import open3d as o3d

    _check_complete(path)
    cloud = o3d.t.io.read_point_cloud(str(path))
    if "positions" not in cloud.point or len(cloud.point.positions) == 0:
        raise PointCloudFileError(f"{path}: Open3D read no points (corrupt file or empty cloud)")
    def attribute(name: str) -> np.ndarray | None:
        return cloud.point[name].numpy().astype(np.float32) if name in cloud.point else None

    intensity = attribute("intensity")
    colors = attribute("colors")
    if colors is not None and cloud.point.colors.dtype == o3d.core.uint8:
        colors = colors / np.float32(255.0)
    return PointFields(
        attribute("positions"),
        intensity=None if intensity is None else intensity.reshape(-1),
        normals=attribute("normals"),
        colors=colors,
    )


def _drop_nonfinite(fields: PointFields, path: Path) -> PointFields:
    n = len(fields.points)
    if n == 0:
        raise PointCloudFileError(f"{path}: the cloud has no points")
    keep = np.isfinite(fields.points).all(axis=1)
    if not keep.any():
        raise PointCloudFileError(f"{path}: all {n} points are NaN or infinite")
    if keep.all():
        return fields
    def take(a: np.ndarray | None) -> np.ndarray | None:
        return None if a is None else np.ascontiguousarray(a[keep])

    return PointFields(take(fields.points), take(fields.intensity), take(fields.normals), take(fields.colors))


# --------------------------------------------------------------- header completeness

_PLY_SIZES = {"char": 1, "uchar": 1, "int8": 1, "uint8": 1, "short": 2, "ushort": 2, "int16": 2,
              "uint16": 2, "int": 4, "uint": 4, "int32": 4, "uint32": 4, "float": 4,
              "float32": 4, "double": 8, "float64": 8}


def _check_complete(path: Path) -> None:
    """Raise when a PLY/PCD body holds fewer points than its header announces."""
    with open(path, "rb") as f:
        head = f.read(65536)
    if path.suffix.lower() == ".ply":
        _check_ply(path, head)
    else:
        _check_pcd(path, head)


def _header(path: Path, head: bytes, end: re.Pattern) -> tuple[list[str], int]:
    """Header lines and the byte offset of the body; ``end`` matches the last header line."""
    match = end.search(head)
    if match is None:
        raise PointCloudFileError(f"{path}: no complete {path.suffix[1:].upper()} header")
    text = head[: match.end()].decode("ascii", errors="replace")
    return [line.strip() for line in text.splitlines() if line.strip()], match.end()


def _check_ply(path: Path, head: bytes) -> None:
    if not head.startswith(b"ply"):
        raise PointCloudFileError(f"{path}: not a PLY file (no 'ply' magic)")
    lines, body_start = _header(path, head, re.compile(rb"end_header\r?\n"))
    fmt = next((line.split()[1] for line in lines if line.startswith("format")), "")
    elements: list[list] = []  # [name, count, row size or None when a list property]
    for line in lines:
        words = line.split()
        if words[0] == "element" and len(words) == 3:
            elements.append([words[1], int(words[2]), 0])
        elif words[0] == "property" and elements:
            size = None if words[1] == "list" else _PLY_SIZES.get(words[1])
            elements[-1][2] = None if size is None or elements[-1][2] is None else elements[-1][2] + size
    vertex = next((e for e in elements if e[0] == "vertex"), None)
    if vertex is None or vertex[1] == 0:
        raise PointCloudFileError(f"{path}: the PLY header declares no vertices")
    body = path.stat().st_size - body_start
    if fmt == "ascii":
        _check_ascii_rows(path, body_start, vertex[1])
    elif elements[0] is vertex and vertex[2] is not None and body < vertex[1] * vertex[2]:
        raise PointCloudFileError(
            f"{path}: truncated PLY: {vertex[1]} vertices need {vertex[1] * vertex[2]} bytes, body has {body}"
        )


def _check_pcd(path: Path, head: bytes) -> None:
    lines, body_start = _header(path, head, re.compile(rb"DATA[ \t]+\w+[^\n]*\n"))
    fields = {line.split()[0].upper(): line.split()[1:] for line in lines if not line.startswith("#")}
    try:
        if "POINTS" in fields:
            n = int(fields["POINTS"][0])
        else:
            n = int(fields["WIDTH"][0]) * int(fields.get("HEIGHT", ["1"])[0])
        sizes = [int(s) for s in fields["SIZE"]]
        counts = [int(c) for c in fields.get("COUNT", ["1"] * len(sizes))]
    except (KeyError, ValueError, IndexError) as error:
        raise PointCloudFileError(f"{path}: malformed PCD header ({error})") from error
    if n == 0:
        raise PointCloudFileError(f"{path}: the PCD header declares no points")
    data = fields["DATA"][0].lower()
    if data == "ascii":
        _check_ascii_rows(path, body_start, n)
    elif data == "binary":
        need = n * sum(s * c for s, c in zip(sizes, counts))
        body = path.stat().st_size - body_start
        if body < need:
            raise PointCloudFileError(f"{path}: truncated PCD: {n} points need {need} bytes, body has {body}")


def _check_ascii_rows(path: Path, body_start: int, n: int) -> None:
    with open(path, "rb") as f:
        f.seek(body_start)
        rows = sum(1 for line in f if line.strip())
    if rows < n:
        raise PointCloudFileError(f"{path}: truncated file: header announces {n} points, body has {rows} rows")


# --------------------------------------------------------------------------- writing


def write_points(
    path: str | Path,
    points: np.ndarray,
    intensity: np.ndarray | None = None,
    normals: np.ndarray | None = None,
    colors: np.ndarray | None = None,
    binary: bool = True,
) -> Path:
    """Write ``(N, 3)`` points (and optional fields) as ``.bin``/``.ply``/``.pcd``/``.npy``.

    ``.bin`` writes KITTI rows: ``N x 4`` (intensity, zeros when absent) or ``N x 6`` when
    normals are given; ``.npy`` writes ``(N, 3)``, ``(N, 4)`` with intensity or ``(N, 6)`` with
    normals; PLY/PCD keep every field, ASCII when ``binary=False``. Returns the path.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".bin", ".ply", ".pcd", ".npy"):
        raise PointCloudFileError(f"cannot write {suffix!r} ({path}); use .bin, .ply, .pcd or .npy")
    points = _checked(points, "points", 3)
    n = len(points)
    if n == 0:
        raise PointCloudFileError(f"refusing to write an empty cloud to {path}")
    intensity = None if intensity is None else _checked(np.reshape(intensity, (-1, 1)), "intensity", 1, n)
    normals = None if normals is None else _checked(normals, "normals", 3, n)
    colors = None if colors is None else _checked(colors, "colors", 3, n)
    path.parent.mkdir(parents=True, exist_ok=True)
    if suffix in (".bin", ".npy"):
        if intensity is not None and normals is not None:
            raise PointCloudFileError(f"{suffix} rows hold intensity or normals, not both")
        if suffix == ".bin" and intensity is None and normals is None:
            intensity = np.zeros((n, 1), np.float32)
        extra = [a for a in (intensity, normals) if a is not None]
        rows = np.ascontiguousarray(np.hstack([points, *extra]), dtype=np.float32)
        if suffix == ".bin":
            rows.tofile(path)
        else:
            np.save(path, rows)
        return path
    import open3d as o3d

    cloud = o3d.t.geometry.PointCloud()
    cloud.point.positions = o3d.core.Tensor(points)
    for name, value in (("intensity", intensity), ("normals", normals), ("colors", colors)):
        if value is not None:
            cloud.point[name] = o3d.core.Tensor(value)
    if not o3d.t.io.write_point_cloud(str(path), cloud, write_ascii=not binary):
        raise PointCloudFileError(f"Open3D could not write {path}")
    return path


def _checked(array: np.ndarray, name: str, width: int, n: int | None = None) -> np.ndarray:
    array = np.asarray(array, dtype=np.float32)
    if array.ndim != 2 or array.shape[1] != width or (n is not None and len(array) != n):
        want = f"({n if n is not None else 'N'}, {width})"
        raise PointCloudFileError(f"{name} must have shape {want}, got {array.shape}")
    return np.ascontiguousarray(array)
