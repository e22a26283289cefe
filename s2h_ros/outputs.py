"""Result files: strict JSON (no NaN), written atomically.

Every ``--json`` output, ``metrics.json`` and summary file goes through :func:`write_json` or
:func:`write_text`: the text is written to a temporary file in the same directory, flushed and
renamed over the target, so a full disk, a read-only directory or a kill mid-write leaves either
the previous file or the complete new one, never a truncated one. JSON has no NaN or infinity;
:func:`jsonable` turns them into ``null`` and numpy values into plain Python.
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


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (temporary file + rename); parents are created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def write_json(path: str | os.PathLike, obj: Any, indent: int | None = 2) -> Path:
    """``obj`` as strict JSON (NaN -> null) in ``path``, atomically."""
    return write_text(path, json_text(obj, indent) + "\n")
