"""sensor_msgs/PointCloud2 <-> numpy, without ROS.

Works on any object with PointCloud2's attributes (``height, width, fields, is_bigendian,
point_step, row_step, data``; each field with ``name, offset, datatype, count``), so the same
code decodes rclpy messages, messages deserialised by ``rosbags`` and plain test objects.

The message's byte layout becomes one numpy structured dtype (named fields at their offsets,
``itemsize = point_step``, byte order from ``is_bigendian``) laid over the buffer with strides
``(row_step, point_step)``: padding inside a point and at the end of a row costs nothing and no
per-point Python code runs. Written here because ``sensor_msgs_py`` (ROS's own converter) is not
on PyPI and ``rosbags`` has no PointCloud2 conversion.

A message is decoded only when it is consistent: every size non-negative, each field inside
``point_step``, ``row_step >= width * point_step`` and ``len(data) == height * row_step`` (the
size sensor_msgs/PointCloud2 specifies); anything else raises :class:`PointCloud2Error` naming
the field. Big-endian data (``is_bigendian``) decode to native values. Coordinates keep float64
when the message carries FLOAT64 x, y, z (georeferenced clouds); the pipeline centres them.
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

import numpy as np

from s2h_ros.deskew import DeskewError, relative_times, time_field

# sensor_msgs/PointField datatype constants -> numpy scalar type (byte order added later).
INT8, UINT8, INT16, UINT16, INT32, UINT32, FLOAT32, FLOAT64 = range(1, 9)
DATATYPES: dict[int, str] = {
    INT8: "i1", UINT8: "u1", INT16: "i2", UINT16: "u2",
    INT32: "i4", UINT32: "u4", FLOAT32: "f4", FLOAT64: "f8",
}
_DATATYPE_OF: dict[str, int] = {code: dt for dt, code in DATATYPES.items()}
XYZ = ("x", "y", "z")

Field = tuple[str, int, int, int]  # (name, offset, datatype, count) as in sensor_msgs/PointField


class PointCloud2Error(ValueError):
    """A PointCloud2 message (or the arrays to encode into one) is malformed."""


def _attr(msg: Any, name: str) -> Any:
    try:
        return getattr(msg, name)
    except AttributeError:
        raise PointCloud2Error(f"not a PointCloud2: object has no attribute {name!r}") from None


def fields_of(msg: Any) -> list[Field]:
    """The message's fields as ``(name, offset, datatype, count)`` tuples."""
    return [(str(f.name), int(f.offset), int(f.datatype), int(f.count)) for f in _attr(msg, "fields")]


def point_dtype(fields: Iterable[Field], point_step: int, bigendian: bool = False) -> np.dtype:
    """Structured dtype of one point: each field at its offset, ``itemsize = point_step``.

    ``count > 1`` fields become sub-arrays of shape ``(count,)``. Raises PointCloud2Error for an
    unknown datatype, ``count < 1``, a repeated name or a field that ends past ``point_step``.
    """
    order = ">" if bigendian else "<"
    names, formats, offsets = [], [], []
    for name, offset, datatype, count in fields:
        if datatype not in DATATYPES:
            raise PointCloud2Error(
                f"field {name!r} has unsupported datatype {datatype} (PointField allows 1..8)")
        if count < 1:
            raise PointCloud2Error(f"field {name!r} has count {count}; expected >= 1")
        if name in names:
            raise PointCloud2Error(f"field {name!r} appears twice")
        scalar = np.dtype(order + DATATYPES[datatype])
        end = offset + scalar.itemsize * count
        if offset < 0 or end > point_step:
            raise PointCloud2Error(
                f"field {name!r} spans bytes [{offset}, {end}) outside point_step {point_step}")
        names.append(name)
        formats.append(scalar if count == 1 else (scalar, (count,)))
        offsets.append(offset)
    return np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": point_step})


def _buffer(data: Any) -> np.ndarray:
    """The message's ``data`` as a flat uint8 array without copying (bytes, array.array, ndarray)."""
    if isinstance(data, np.ndarray):
        return data.reshape(-1).view(np.uint8)
    try:
        return np.frombuffer(data, dtype=np.uint8)
    except TypeError:  # a plain list of ints
        pass
    try:
        return np.asarray(data, dtype=np.uint8).reshape(-1)
    except (TypeError, ValueError):
        raise PointCloud2Error(f"data is not a byte buffer: {type(data).__name__}") from None


def point_array(msg: Any) -> np.ndarray:
    """``(height, width)`` structured view of the message's points (no copy)."""
    sizes = {}
    for name in ("height", "width", "point_step", "row_step"):
        try:
            sizes[name] = int(_attr(msg, name))
        except (TypeError, ValueError):
            raise PointCloud2Error(f"{name} is not an integer: {_attr(msg, name)!r}") from None
        if sizes[name] < 0:
            raise PointCloud2Error(f"{name} is {sizes[name]}; expected >= 0")
    height, width, point_step, row_step = sizes.values()
    dtype = point_dtype(fields_of(msg), point_step, bool(_attr(msg, "is_bigendian")))
    buf = _buffer(_attr(msg, "data"))
    if height == 0 or width == 0:
        return np.empty((height, width), dtype=dtype)
    if point_step == 0:
        raise PointCloud2Error(f"point_step 0 for a cloud of {height} x {width} points")
    if row_step < width * point_step:
        raise PointCloud2Error(
            f"row_step {row_step} < width {width} * point_step {point_step}")
    if buf.size != height * row_step:
        raise PointCloud2Error(
            f"data holds {buf.size} bytes; height {height} * row_step {row_step} = {height * row_step} "
            f"(width {width}, point_step {point_step})")
    return np.ndarray((height, width), dtype=dtype, buffer=buf, strides=(row_step, point_step))


def _check_xyz(dtype: np.dtype) -> None:
    missing = [c for c in XYZ if c not in dtype.names]
    if missing:
        raise PointCloud2Error(f"PointCloud2 has no field {', '.join(missing)} (fields: {list(dtype.names)})")
    for c in XYZ:
        if dtype[c].shape:
            raise PointCloud2Error(f"field {c!r} has count {dtype[c].shape[0]}; coordinates need count 1")


def _finite_mask(points: np.ndarray) -> np.ndarray:
    """(N,) bool: x, y and z all finite."""
    mask = np.ones(points.shape[0], dtype=bool)
    for c in XYZ:
        if points.dtype[c].kind == "f":
            mask &= np.isfinite(points[c])
    return mask


def read_points(
    msg: Any, fields: Sequence[str] | None = None, skip_nans: bool = True
) -> tuple[dict[str, np.ndarray], int]:
    """Decode the message into ``{name: array}`` and the number of points dropped.

    Arrays are native-endian copies, rows first (``N = height * width`` when nothing is dropped,
    so ``a.reshape(height, width)`` recovers an organized cloud); ``count > 1`` fields are
    ``(N, count)``. ``fields=None`` returns every field. With ``skip_nans`` points whose x, y
    or z is NaN or inf are dropped and counted.
    """
    points = point_array(msg).reshape(-1)
    _check_xyz(points.dtype)
    names = list(points.dtype.names) if fields is None else list(fields)
    unknown = [n for n in names if n not in points.dtype.names]
    if unknown:
        raise PointCloud2Error(f"PointCloud2 has no field {unknown} (fields: {list(points.dtype.names)})")
    dropped = 0
    if skip_nans:
        mask = _finite_mask(points)
        dropped = int(mask.size - np.count_nonzero(mask))
        if dropped:
            points = points[mask]
    out = {}
    for n in names:
        a = points[n]
        out[n] = a.astype(a.dtype.newbyteorder("="), copy=True)
    return out, dropped


def _xyz_columns(points: np.ndarray) -> np.ndarray:
    """``(N, 3)`` copy of x, y, z from ``(N,)`` structured points: float64 when any of them is
    FLOAT64, else float32."""
    dt = points.dtype
    x_dtype, x_offset = dt.fields["x"][:2]
    packed = x_dtype.char == "f" and x_dtype.itemsize == 4 and all(
        dt.fields[c][0] == x_dtype and dt.fields[c][1] == x_offset + 4 * i for i, c in enumerate(XYZ))
    if packed:  # common case: x, y, z adjacent float32 -> copy 12-byte records in one pass
        triple = np.dtype({"names": ["xyz"], "formats": ["V12"], "offsets": [x_offset],
                           "itemsize": dt.itemsize})
        raw = np.ascontiguousarray(points.view(triple)["xyz"])
        return raw.view(x_dtype).reshape(-1, 3).astype(np.float32, copy=False)
    wide = any(dt.fields[c][0].kind == "f" and dt.fields[c][0].itemsize == 8 for c in XYZ)
    xyz = np.empty((points.shape[0], 3), dtype=np.float64 if wide else np.float32)
    for i, c in enumerate(XYZ):
        xyz[:, i] = points[c]
    return xyz


def finite_rows(xyz: np.ndarray) -> np.ndarray:
    """(N,) bool: rows of ``(N, 3)`` points whose coordinates are all finite."""
    return np.isfinite(xyz[:, 0]) & np.isfinite(xyz[:, 1]) & np.isfinite(xyz[:, 2])


def read_xyz(msg: Any, skip_nans: bool = True) -> tuple[np.ndarray, int]:
    """``(N, 3)`` coordinates (float32; float64 for FLOAT64 fields) and the number of non-finite
    points dropped."""
    xyz, _, dropped = read_xyz_field(msg, None, skip_nans)
    return xyz, dropped


def read_xyz_field(msg: Any, field: str | None, skip_nans: bool = True) -> tuple[np.ndarray, np.ndarray | None, int]:
    """As :func:`read_xyz`, and the ``(N,)`` native-endian values of one more ``field`` (e.g. a
    per-point time) for the same points (None for ``field`` None)."""
    points = point_array(msg).reshape(-1)
    _check_xyz(points.dtype)
    if field is not None and field not in points.dtype.names:
        raise PointCloud2Error(f"PointCloud2 has no field {field!r} (fields: {list(points.dtype.names)})")
    xyz = _xyz_columns(points)
    values = None if field is None else points[field]
    mask = finite_rows(xyz) if skip_nans else None
    kept = xyz.shape[0] if mask is None else int(np.count_nonzero(mask))
    if kept < xyz.shape[0]:
        # Select whole rows as one void item (several times faster than boolean indexing an (N, 3) array).
        rows = xyz.view(np.dtype((np.void, 3 * xyz.itemsize))).reshape(-1)
        xyz = rows[mask].view(xyz.dtype).reshape(-1, 3)
        values = None if values is None else values[mask]
    if values is not None:
        values = values.astype(values.dtype.newbyteorder("="), copy=True)
    return xyz, values, int(len(mask) - kept) if mask is not None else 0


def read_xyz_times(msg: Any, stamp: float, skip_nans: bool = True) -> tuple[np.ndarray, np.ndarray | None, str | None, str]:
    """``(N, 3)`` coordinates as :func:`read_xyz`; each point's seconds relative to ``stamp``
    (seconds) from the cloud's time field (``s2h_ros.deskew.time_field``, read by
    ``deskew.relative_times``), None without one or where its times cannot be one sweep's; the
    field's name (None without one); and why its times were not used ("" otherwise)."""
    field = time_field([name for name, *_ in fields_of(msg)])
    xyz, values, _ = read_xyz_field(msg, field, skip_nans)
    if field is None:
        return xyz, None, None, ""
    try:
        return xyz, relative_times(values, stamp), field, ""
    except DeskewError as exc:
        return xyz, None, field, str(exc)


def _datatype_of(name: str, array: np.ndarray) -> int:
    code = array.dtype.kind + str(array.dtype.itemsize)
    if code not in _DATATYPE_OF:
        raise PointCloud2Error(
            f"field {name!r} has dtype {array.dtype}; PointCloud2 holds int8..int32, uint8..uint32, "
            f"float32 or float64")
    return _DATATYPE_OF[code]


def create_cloud_fields(
    xyz: np.ndarray,
    extra: dict[str, np.ndarray] | None = None,
    shape: tuple[int, int] | None = None,
) -> tuple[list[Field], int, bytes]:
    """Encode ``(N, 3)`` float32/float64 points plus ``{name: (N,) or (N, count)}`` extra fields.

    Fields are packed in order (x, y, z, then ``extra``'s order) without padding, little-endian.
    ``shape=(height, width)`` with ``height * width == N`` marks an organized cloud (the bytes are
    the same; the caller writes it into the message). Returns ``(fields, point_step, data)``.
    NaN points are kept: organized clouds need them as placeholders.
    """
    xyz = np.asarray(xyz)
    if xyz.ndim != 2 or xyz.shape[1] != 3:
        raise PointCloud2Error(f"xyz must be (N, 3); got shape {xyz.shape}")
    if xyz.dtype not in (np.float32, np.float64):
        xyz = xyz.astype(np.float32)
    n = xyz.shape[0]
    if shape is not None and (len(shape) != 2 or int(shape[0]) * int(shape[1]) != n):
        raise PointCloud2Error(f"organized shape {tuple(shape)} does not hold {n} points")
    columns: list[tuple[str, np.ndarray]] = [(c, xyz[:, i]) for i, c in enumerate(XYZ)]
    for name, values in (extra or {}).items():
        values = np.asarray(values)
        if name in XYZ or not name:
            raise PointCloud2Error(f"extra field name {name!r} is empty or clashes with x, y, z")
        if values.ndim not in (1, 2) or values.shape[0] != n:
            raise PointCloud2Error(f"extra field {name!r} must be ({n},) or ({n}, count); got {values.shape}")
        columns.append((name, values))
    fields: list[Field] = []
    offset = 0
    for name, values in columns:
        datatype = _datatype_of(name, values)
        count = 1 if values.ndim == 1 else values.shape[1]
        fields.append((name, offset, datatype, count))
        offset += values.dtype.itemsize * count
    points = np.zeros(n, dtype=point_dtype(fields, offset))
    for name, values in columns:
        points[name] = values
    return fields, offset, points.tobytes()
