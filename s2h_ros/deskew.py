"""Motion compensation of a sweep from its per-point times (no ROS, no torch).

A spinning lidar fires its columns over the whole sweep (0.1 s at 10 Hz): a sensor moving at
10 m/s draws the last column 1 m from where it drew the first, and one turning at 30 deg/s turns
it by 3 deg. Each point was measured in the sensor frame of its own time ``stamp + t``; deskewing
moves it into the frame of ``stamp`` with the odometry's constant-velocity prior, the motion model
of :func:`s2h_ros.motion_prior.predicted_pose` (the pose ``t`` seconds on is the translation
``v t`` and the rotation ``exp(w t)``, ``twist = [v, w]`` in the body frame):
``p' = exp(t w) p + t v``. scipy's rotation vectors do the SO(3) part.

Drivers write the times in several ways; :func:`relative_times` reads each of them as seconds
relative to the message's stamp:

- Ouster (``t``, UINT32 nanoseconds since the first column) and Livox (``offset_time``, UINT32
  nanoseconds): integer fields are nanoseconds;
- Velodyne (``time``, FLOAT32 seconds relative to the stamp): float fields are seconds;
- Hesai and Robosense (``timestamp``, FLOAT64 seconds since the epoch): values more than
  ``ABSOLUTE_AFTER_S`` from zero are absolute and the stamp is subtracted; float values beyond
  1e15 are nanoseconds since the epoch.

Times that would span more than ``MAX_SWEEP_S`` or lie further than that from the stamp are not a
sweep's: :class:`DeskewError`, and the caller registers the scan as given and says so.
"""
from __future__ import annotations

import numpy as np
from scipy.spatial.transform import Rotation

# Field names drivers give per-point times, in the order they are looked for.
TIME_FIELDS = ("t", "time", "timestamp", "time_stamp", "offset_time")
# A value further than this from zero (seconds) is a time since the epoch, not within the sweep.
ABSOLUTE_AFTER_S = 1e6
# Float values beyond this are nanoseconds since the epoch (1e15 s would be 30 million years).
NANOSECONDS_AFTER = 1e15
# Per-point times further than this from the stamp (seconds) are not one sweep's (a 5 Hz sensor
# sweeps in 0.2 s).
MAX_SWEEP_S = 1.0


class DeskewError(ValueError):
    """Per-point times that cannot be a sweep's."""


def time_field(names: list[str] | tuple[str, ...]) -> str | None:
    """The first of ``TIME_FIELDS`` among a cloud's field ``names``, None when there is none."""
    return next((name for name in TIME_FIELDS if name in names), None)


def relative_times(values: np.ndarray, stamp: float) -> np.ndarray:
    """``(N,)`` float64 seconds of each point relative to ``stamp`` (seconds) from a time field's
    raw ``values`` (N,): integers are nanoseconds, floats seconds (nanoseconds beyond 1e15), and
    values since the epoch have the stamp subtracted. Non-finite values count as the stamp.
    Raises DeskewError when the times do not fit within ``MAX_SWEEP_S`` of the stamp."""
    values = np.asarray(values).reshape(-1)
    if values.dtype.kind in "iu":
        seconds = values.astype(np.float64) * 1e-9
    elif values.dtype.kind == "f":
        seconds = values.astype(np.float64)
        finite = np.isfinite(seconds)
        if finite.any() and np.median(np.abs(seconds[finite])) > NANOSECONDS_AFTER:
            seconds = seconds * 1e-9
    else:
        raise DeskewError(f"per-point times of dtype {values.dtype} (need integers or floats)")
    finite = np.isfinite(seconds)
    if finite.any() and np.median(np.abs(seconds[finite])) > ABSOLUTE_AFTER_S:
        seconds = seconds - stamp
    seconds = np.where(finite, seconds, 0.0)
    if len(seconds) and (np.abs(seconds).max() > MAX_SWEEP_S or np.ptp(seconds) > MAX_SWEEP_S):
        raise DeskewError(f"per-point times span {seconds.min():+.3f} .. {seconds.max():+.3f} s around the stamp "
                          f"(a sweep lies within {MAX_SWEEP_S:g} s of it)")
    return seconds


def deskew(points: np.ndarray, times: np.ndarray, twist: np.ndarray) -> np.ndarray:
    """``points (N, 3+)`` (sensor frame at each point's time) moved into the sensor frame at the
    stamp: ``p' = exp(t w) p + t v`` for each point's ``times`` (N,) seconds relative to the stamp
    and the body ``twist`` (6,) ``[v, w]`` per second. Columns past x, y, z are kept; the coordinates
    keep their dtype."""
    points = np.asarray(points)
    times = np.asarray(times, np.float64).reshape(-1)
    if points.ndim != 2 or points.shape[1] < 3 or len(times) != len(points):
        raise DeskewError(f"need (N, 3+) points and (N,) times, got {points.shape} and {times.shape}")
    twist = np.asarray(twist, np.float64).reshape(6)
    xyz = points[:, :3].astype(np.float64)
    moved = Rotation.from_rotvec(times[:, None] * twist[None, 3:]).apply(xyz) + times[:, None] * twist[None, :3]
    out = points.copy()
    out[:, :3] = moved.astype(points.dtype)
    return out
