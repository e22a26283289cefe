"""Result files: strict JSON (no NaN), written atomically.

Every ``--json`` output, ``metrics.json``, summary file and plot goes through :func:`write_json`,
:func:`write_text` or :func:`write_bytes`: the data is written to a temporary file in the same
directory, flushed and renamed over the target, so a full disk, a read-only directory or a kill
mid-write leaves either the previous file or the complete new one, never a truncated one; the
OSError then names the target. JSON has no NaN or infinity; :func:`jsonable` turns them into
``null`` and numpy values into plain Python. :func:`check_writable` tries an output folder before
the work that fills it.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np


def jsonable(obj: Any) -> Any:
    """Plain JSON types: numpy to lists/scalars, paths to strings, NaN/inf to None."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def json_text(obj: Any, indent: int | None = 2) -> str:
    """Strict JSON text of ``obj`` (after :func:`jsonable`); raises on anything else unserialisable."""
    return json.dumps(jsonable(obj), indent=indent, allow_nan=False)


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temporary file + rename); parents are created.

    An OSError (read-only or full file system, no permission) names ``path`` itself in
    ``filename``, not the temporary file, and leaves no temporary file behind."""
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        if isinstance(exc, OSError):
            raise OSError(exc.errno, exc.strerror or str(exc), os.fspath(path)) from exc
        raise
    return path


def check_writable(directory: str | os.PathLike) -> Path:
    """``directory`` (created if missing) if a file can be made in it, else the OSError naming it:
    a command checks its output folders before hours of work, not after. (A full disk shows only
    when the files are written; :func:`write_bytes` then names them.)"""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror or str(exc), os.fspath(directory)) from exc
    return directory


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically, as :func:`write_bytes`."""
    return write_bytes(path, text.encode("utf-8"))


def write_json(path: str | os.PathLike, obj: Any, indent: int | None = 2) -> Path:
    """``obj`` as strict JSON (NaN -> null) in ``path``, atomically."""
    return write_text(path, json_text(obj, indent) + "\n")
