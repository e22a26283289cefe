"""Time stamps: integer nanoseconds as the one exact form, seconds (float) for arithmetic.

ROS stamps are ``(sec, nanosec)``; anything with those two attributes (builtin_interfaces/Time,
rosbags' message classes) is read by :func:`stamp_ns`. Conversions from float seconds split off the
integer second first, so an epoch-scale stamp (1.7e9 s) keeps nanosecond resolution, and carry a
fraction that rounds to a full second into ``sec`` (100.99999999999994 s -> 101 s 0 ns).
"""
from __future__ import annotations

import math
from typing import Any

NS_PER_SEC = 1_000_000_000


def sec_to_ns(t: float) -> int:
    """Float seconds -> integer nanoseconds, rounded to the nearest nanosecond."""
    if not math.isfinite(t):
        raise ValueError(f"stamp must be finite, got {t!r}")
    sec = math.floor(t)
    return sec * NS_PER_SEC + round((t - sec) * 1e9)


def ns_to_sec(ns: int) -> float:
    """Integer nanoseconds -> the nearest float seconds (a float written by sec_to_ns comes back equal)."""
    return ns // NS_PER_SEC + (ns % NS_PER_SEC) * 1e-9


def split_ns(ns: int) -> tuple[int, int]:
    """Integer nanoseconds -> ``(sec, nanosec)`` with ``0 <= nanosec < 1e9``."""
    return ns // NS_PER_SEC, ns % NS_PER_SEC


def stamp_ns(stamp: Any) -> int:
    """Nanoseconds of a stamp with ``sec`` and ``nanosec`` attributes."""
    return int(stamp.sec) * NS_PER_SEC + int(stamp.nanosec)


def stamp_sec(stamp: Any) -> float:
    """Seconds of a stamp with ``sec`` and ``nanosec`` attributes."""
    return ns_to_sec(stamp_ns(stamp))
