"""Point-cloud files: read and write KITTI ``.bin``, PLY, PCD and NPY (plus 3DMatch ``.pth``).

One entry, :func:`read_points`, returns ``(N, 3)`` metres whatever the format (float32, or
float64 where the file stores float64 coordinates: georeferenced clouds keep their precision
until the pipeline centres them); :func:`read_point_fields` also returns intensity / normals /
colours when the file has them. PLY and PCD go through Open3D's tensor I/O (``o3d.t.io``: ASCII,
binary and, for PCD, binary compressed). Open3D crashes on a negative element count, logs a
warning and hands back a half-filled cloud when a body is cut short, and reads an ASCII row of
text as (0, 0, 0) and a short ASCII row as uninitialised memory, so the readers check the
header and body themselves first (:func:`_check_complete`) and raise instead.

KITTI ``.bin`` files are headerless float32 rows: raw scans are ``N x 4`` (x, y, z,
reflectance); the bundled, grid-averaged sample is ``N x 6`` (x, y, z, nx, ny, nz). ``columns=4``
or ``6`` fixes the layout; with ``columns=None`` the rule (:func:`bin_columns`) is:

* ``N x 6`` only when the file reads as whole 24-byte rows whose columns 4-6 are normals: at
  least 99 % of them with norm <= 1.001 and a median norm >= 0.9 (unit or grid-averaged
  normals). A raw scan read that way puts coordinates and reflectance in those columns, which
  never pass (it would need almost every point on the unit circle around the sensor);
* else ``N x 4`` when the size is a whole number of 16-byte rows;
* else an error: a truncated ``N x 4`` file whose size happens to divide by 24 is refused, not
  read as ``N x 6`` garbage.

Rows whose x, y or z is NaN/inf are dropped and counted (``PointFields.num_non_finite``;
organised PCD files use NaN for "no return"); a file left with no point raises. Arrays
(``.npy``, ``.pth``) must be ``(N, >=3)``, one point a row: a ``(3, N)`` array is refused with
a hint to transpose it (:func:`points_shape_problem`, shared with the pipeline).

Errors: every problem raises :class:`PointCloudFileError`, a ``ValueError`` naming the file and,
where it applies, the header line, body line or field; a missing file raises its subclass
:class:`PointCloudFileNotFound`, which is also a ``FileNotFoundError``. (The pipeline raises
``RegistrationError`` and the PointCloud2 codec ``PointCloud2Error``: one type per layer.)

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
NORMAL_ROW_FRACTION = 0.99  # share of rows within that bound
NORMAL_MEDIAN_MIN = 0.9  # and their median norm (bundled sample: 0.9999; 5 % of rows below 0.72)
NEGATIVE_INTENSITY_LIMIT = 0.01  # share of negative 4th-column values an N x 4 .bin file may have (x, y, z rows: ~half)


class PointCloudFileError(ValueError):
    """A point-cloud file is missing, unreadable, truncated, empty or of an unknown kind."""


class PointCloudFileNotFound(PointCloudFileError, FileNotFoundError):
    """The point-cloud file does not exist."""


def points_shape_problem(shape: tuple[int, ...]) -> str | None:
    """Why an array of ``shape`` is not ``(N, >=3)`` points (one point a row), or None when it is.

    A ``(K, M)`` array with ``3 <= K < M`` has fewer points than coordinates per point: it is
    taken to be transposed (the ``(3, N)`` layout of column-major tools) and refused with that
    hint, never silently read as K points nor silently transposed.
    """
    shape = tuple(int(s) for s in shape)
    if len(shape) != 2 or shape[1] < 3:
        return f"expected an (N, 3) array, one point a row (>= 3 columns), got shape {shape}"
    if 3 <= shape[0] < shape[1]:
        return (f"got shape {shape}, {shape[0]} points of {shape[1]} coordinates each: points must be rows; "
                f"this looks transposed, pass its transpose (shape {shape[::-1]})")
    return None


def _coordinate_dtype(dtype: np.dtype) -> type:
    """float64 for coordinates stored as float64 (or as integers too wide for float32), else float32."""
    dtype = np.dtype(dtype)
    wide = dtype == np.float64 or (dtype.kind in "iu" and dtype.itemsize >= 4)
    return np.float64 if wide else np.float32


@dataclass
class PointFields:
    """A cloud read from a file: positions plus whatever per-point fields the file carries."""

    points: np.ndarray  # (N, 3) metres: float32, or float64 where the file stores float64
    intensity: np.ndarray | None = None  # (N,) float32 (KITTI reflectance, PCD/PLY intensity)
    normals: np.ndarray | None = None  # (N, 3) float32
    colors: np.ndarray | None = None  # (N, 3) float32 in [0, 1]
    num_non_finite: int = 0  # rows dropped because x, y or z was NaN or infinite

    def __len__(self) -> int:
        return len(self.points)


# --------------------------------------------------------------------------- reading


def read_points(path: str | Path, columns: int | None = None) -> np.ndarray:
    """Read a point-cloud file into ``(N, 3)`` float32 (float64 where stored so; see the module docstring)."""
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
    try:
        fields = reader(path, columns) if suffix in (".bin", ".npy", ".pth") else reader(path)
    except OSError as error:  # permissions, I/O errors: still a file problem, not a crash
        raise PointCloudFileError(f"cannot read {path}: {error.strerror or error}") from error
    return _drop_nonfinite(fields, path)


def bin_columns(path: str | Path) -> int:
    """Row width (4 or 6 float32) of a KITTI-style ``.bin`` file by the module's rule: 6 only when
    columns 4-6 read as normals, else 4 when the size allows, else :class:`PointCloudFileError`."""
    path = Path(path)
    size = path.stat().st_size
    if size % 24 == 0 and _reads_as_normals(path):
        return 6
    if size % 16 == 0:
        negative = float(np.mean(np.fromfile(path, dtype=np.float32).reshape(-1, 4)[:, 3] < 0))
        if negative <= NEGATIVE_INTENSITY_LIMIT:
            return 4
        raise PointCloudFileError(
            f"{path}: as N x 4 float32 rows, {100 * negative:.0f} % of the 4th column (reflectance) is "
            f"negative: not a KITTI .bin file; raw x, y, z rows need columns=3 (--columns 3)"
        )
    why = " and, as N x 6 rows, its columns 4-6 are not normals" if size % 24 == 0 else ""
    raise PointCloudFileError(
        f"{path}: {size} bytes is not a whole number of N x 4 float32 rows (16 bytes: x, y, z, "
        f"reflectance){why}: truncated or not a KITTI .bin file (columns=6 reads x, y, z, normal rows; columns=3 raw x, y, z rows)"
    )


def _reads_as_normals(path: Path) -> bool:
    """Columns 4-6 of the file read as ``N x 6`` float32 rows are unit or averaged normals."""
    rows = np.fromfile(path, dtype=np.float32).reshape(-1, 6)
    with np.errstate(invalid="ignore", over="ignore"):
        norms = np.linalg.norm(rows[:, 3:].astype(np.float64), axis=1)
    norms[~np.isfinite(norms)] = np.inf
    return bool(np.mean(norms <= NORMAL_NORM_LIMIT) >= NORMAL_ROW_FRACTION and np.median(norms) >= NORMAL_MEDIAN_MIN)


def _read_bin(path: Path, columns: int | None) -> PointFields:
    if columns is None:
        columns = bin_columns(path)
    if columns not in (3, 4, 6):  # 3 (x, y, z) only when asked for: sizes cannot tell it from 4 or 6
        raise PointCloudFileError(f"{path}: a .bin file has 3, 4 or 6 float32 columns, not {columns}")
    data = np.fromfile(path, dtype=np.float32)
    if data.size % columns:
        raise PointCloudFileError(
            f"{path}: {data.size} float32 values do not fill rows of {columns}: truncated file?"
        )
    rows = data.reshape(-1, columns)
    if columns == 3:
        return PointFields(rows.copy())
    if columns == 4:
        return PointFields(rows[:, :3].copy(), intensity=rows[:, 3].copy())
    return PointFields(rows[:, :3].copy(), normals=rows[:, 3:6].copy())


def _fields_from_array(array: np.ndarray, path: Path, columns: int | None) -> PointFields:
    """``(N, >=3)`` array -> fields: a 4th column is intensity, 6 columns are xyz + normals."""
    problem = points_shape_problem(array.shape)
    if problem:
        raise PointCloudFileError(f"{path}: {problem}")
    if array.dtype.kind not in "fiu":
        raise PointCloudFileError(f"{path}: expected a real-valued numeric array, got dtype {array.dtype}")
    if columns is not None:
        if not 3 <= columns <= array.shape[1]:
            raise PointCloudFileError(f"{path}: columns={columns} but the array has {array.shape[1]}")
        array = array[:, :columns]
    fields = PointFields(np.ascontiguousarray(array[:, :3], dtype=_coordinate_dtype(array.dtype)))
    if array.shape[1] == 4:
        fields.intensity = array[:, 3].astype(np.float32)
    elif array.shape[1] == 6:
        fields.normals = array[:, 3:6].astype(np.float32)
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
    positions = cloud.point.positions.numpy()
    return PointFields(
        positions.astype(_coordinate_dtype(positions.dtype), copy=False),
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

    return PointFields(take(fields.points), take(fields.intensity), take(fields.normals), take(fields.colors),
                       num_non_finite=int(n - keep.sum()))


# --------------------------------------------------------------- header completeness

_PLY_SIZES = {"char": 1, "uchar": 1, "int8": 1, "uint8": 1, "short": 2, "ushort": 2, "int16": 2,
              "uint16": 2, "int": 4, "uint": 4, "int32": 4, "uint32": 4, "float": 4,
              "float32": 4, "double": 8, "float64": 8}


def _check_complete(path: Path) -> None:
    """Raise unless the PLY/PCD header is sound and the body holds what it announces (every ASCII
    row a full row of numbers), before Open3D sees the file."""
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


def _count(path: Path, word: str, line: str) -> int:
    """A header count: a whole number >= 0, else :class:`PointCloudFileError` quoting the line."""
    if not word.isdigit():
        raise PointCloudFileError(f"{path}: header line {line!r}: {word!r} is not a whole number >= 0")
    return int(word)


_PLY_FORMATS = ("ascii", "binary_little_endian", "binary_big_endian")


def _check_ply(path: Path, head: bytes) -> None:
    if not head.startswith(b"ply"):
        raise PointCloudFileError(f"{path}: not a PLY file (no 'ply' magic)")
    lines, body_start = _header(path, head, re.compile(rb"end_header\r?\n"))
    fmt = next((line.split()[1] for line in lines if line.startswith("format") and len(line.split()) > 1), "")
    if fmt not in _PLY_FORMATS:
        raise PointCloudFileError(f"{path}: PLY format {fmt!r} is not one of {', '.join(_PLY_FORMATS)}")
    body = path.stat().st_size - body_start
    elements: list[list] = []  # [name, count, row bytes (None with a list property), property names]
    for line in lines:
        words = line.split()
        if words[0] == "element":
            if len(words) != 3:
                raise PointCloudFileError(f"{path}: header line {line!r}: expected 'element NAME COUNT'")
            count = _count(path, words[2], line)
            if count > body:  # every element takes at least one byte
                raise PointCloudFileError(
                    f"{path}: header line {line!r} announces {count} elements; the body has {body} bytes")
            elements.append([words[1], count, 0, []])
        elif words[0] == "property" and elements:
            size = None if words[1] == "list" else _PLY_SIZES.get(words[1])
            elements[-1][2] = None if size is None or elements[-1][2] is None else elements[-1][2] + size
            elements[-1][3].append(words[-1])
    at = next((i for i, e in enumerate(elements) if e[0] == "vertex"), None)
    if at is None or elements[at][1] == 0:
        raise PointCloudFileError(f"{path}: the PLY header declares no vertices")
    _, n, row_size, names = elements[at]
    if fmt == "ascii":
        width = len(names) if row_size is not None else None
        _check_ascii_rows(path, head[:body_start].count(b"\n"), body_start,
                          sum(e[1] for e in elements[:at]), n, width, names)
    elif at == 0 and row_size is not None and body < n * row_size:
        raise PointCloudFileError(
            f"{path}: truncated PLY: {n} vertices need {n * row_size} bytes, body has {body}"
        )


def _check_pcd(path: Path, head: bytes) -> None:
    lines, body_start = _header(path, head, re.compile(rb"DATA[ \t]+\w+[^\n]*\n"))
    fields = {line.split()[0].upper(): line.split()[1:] for line in lines if not line.startswith("#")}
    lookup = {line.split()[0].upper(): line for line in lines if not line.startswith("#")}
    try:
        names, sizes = fields["FIELDS"], [_count(path, s, lookup["SIZE"]) for s in fields["SIZE"]]
        counts = [_count(path, c, lookup["COUNT"]) for c in fields["COUNT"]] if "COUNT" in fields else [1] * len(sizes)
        width = _count(path, fields["WIDTH"][0], lookup["WIDTH"]) if "WIDTH" in fields else None
        height = _count(path, fields["HEIGHT"][0], lookup["HEIGHT"]) if "HEIGHT" in fields else 1
        n = _count(path, fields["POINTS"][0], lookup["POINTS"]) if "POINTS" in fields else None
        data = fields["DATA"][0].lower()
    except (KeyError, IndexError) as error:
        raise PointCloudFileError(f"{path}: malformed PCD header (missing {error})") from error
    if n is None and width is None:
        raise PointCloudFileError(f"{path}: malformed PCD header (neither POINTS nor WIDTH)")
    n = width * height if n is None else n
    if not len(names) == len(sizes) == len(counts) == len(fields.get("TYPE", names)):
        raise PointCloudFileError(f"{path}: PCD header lists {len(names)} FIELDS but {len(sizes)} SIZE, "
                                  f"{len(counts)} COUNT and {len(fields.get('TYPE', names))} TYPE values")
    if width is not None and n != width * height:
        raise PointCloudFileError(f"{path}: PCD header says POINTS {n} but WIDTH {width} x HEIGHT {height}")
    if n == 0:
        raise PointCloudFileError(f"{path}: the PCD header declares no points")
    if data == "ascii":
        columns = [f"{name}[{i}]" if c > 1 else name for name, c in zip(names, counts) for i in range(c)]
        _check_ascii_rows(path, head[:body_start].count(b"\n"), body_start, 0, n, sum(counts), columns)
    elif data == "binary":
        need = n * sum(s * c for s, c in zip(sizes, counts))
        body = path.stat().st_size - body_start
        if body < need:
            raise PointCloudFileError(f"{path}: truncated PCD: {n} points need {need} bytes, body has {body}")
    elif data != "binary_compressed":
        raise PointCloudFileError(f"{path}: PCD DATA {data!r} is not ascii, binary or binary_compressed")


def _check_ascii_rows(path: Path, header_lines: int, body_start: int, skip: int, n: int,
                      width: int | None, names: list[str]) -> None:
    """Rows ``skip .. skip + n`` of an ASCII body (blank lines aside) must exist and hold ``width``
    numbers each (any count when ``width`` is None); else an error quoting the first bad line."""
    with open(path, "rb") as f:
        f.seek(body_start)
        lines = f.read().split(b"\n")
    rows = [(number, line) for number, line in enumerate(lines, header_lines + 1) if line.strip()]
    if len(rows) < skip + n:
        raise PointCloudFileError(
            f"{path}: truncated file: header announces {n} points, body has {max(len(rows) - skip, 0)} rows")
    rows = rows[skip : skip + n]
    tokens = [line.split() for _, line in rows]
    try:
        if width is not None and any(len(t) != width for t in tokens):
            raise ValueError
        np.array([w for t in tokens for w in t]).astype(np.float64)
    except ValueError:
        for (number, line), words in zip(rows, tokens):
            try:
                if width is not None and len(words) != width:
                    raise ValueError
                [float(w) for w in words]
            except ValueError:
                want = f"{width} numbers ({' '.join(names)})" if width is not None else "numbers"
                text = line.decode("utf-8", errors="replace").strip()
                raise PointCloudFileError(f"{path}: line {number}: {text[:80]!r} is not {want}") from None
        raise PointCloudFileError(f"{path}: the body rows are not all numbers") from None


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
