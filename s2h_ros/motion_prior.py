"""The motion prior of the odometry (no ROS, no torch).

The prior is a ``(6,)`` body twist per second ``[vx, vy, vz, wx, wy, wz]`` (sensor frame at the
last trusted pose), measured between two trusted poses (:func:`body_twist`), or after a gap the
mean over it without its turn (:func:`relocalised_twist`), and the rate at which the speed changes
(:func:`speed_change`: braking, pulling away). :func:`predicted_pose` extrapolates them: the
velocity over the whole interval, its speed changing and the turn rate kept over at most a
horizon, because a manoeuvre ends. scipy's rotation vectors do the SO(3) part and numpy's
least-squares line the speed change; what is written here is the motion model.
"""
from __future__ import annotations

import math

import numpy as np
from scipy.spatial.transform import Rotation

from s2h_ros import geometry


def body_twist(delta: np.ndarray, dt: float) -> np.ndarray:
    """``(6,)`` body twist per second of the motion ``delta`` (4, 4) (the last trusted pose to
    this one) over ``dt`` seconds: translation and rotation vector, each divided by ``dt``."""
    return np.concatenate([delta[:3, 3], Rotation.from_matrix(delta[:3, :3]).as_rotvec()]) / dt


# A speed change is estimated only from this speed on (m/s): near rest the direction of the
# velocity is noise, and a speed's norm is biased upwards by that noise. (1 m/s kept a held-out
# HDL-64 drive pulling away from 0.65 m/s at constant speed, 0.998 m/s, 2.0 m short 1.3 s on.)
MIN_SPEED_FOR_CHANGE = 0.5
# The largest speed change taken (m/s^2): beyond a car's ordinary braking and pulling away (2-4),
# below an emergency stop; a larger estimate is noise.
MAX_SPEED_CHANGE = 5.0


def speed_change(times: np.ndarray, speeds: np.ndarray) -> float:
    """Rate of change of the speed (m/s^2, positive: faster) from ``speeds`` (K,) in m/s, each the
    mean over an interval whose middle is at ``times`` (K,) seconds: the slope of their
    least-squares line, clamped to ``MAX_SPEED_CHANGE``; 0 with fewer than two intervals, or where
    their middles span less than 0.1 s, or where the last speed is below ``MIN_SPEED_FOR_CHANGE``.

    A node that falls behind its sensor predicts over 1-1.5 s, where a constant speed is off by
    half the speed's change times the interval squared. On the real KITTI odometry trajectories
    (sequences 00-10, ground truth at 10 Hz, twist and speeds over 0.3 s intervals, speeds of the
    last second), predictions 1.3 s ahead more than 1.5 m off (tracking's ``prior_radius``: a
    correction beyond it costs a global search) fell from 0-33 % to 0-18 % of the poses per
    sequence (00: 32.7 -> 14.1 %, 05: 21.0 -> 4.5 %), the median error from 0.25-0.92 to 0.16-0.67 m
    (``s2h bench prediction``, docs/performance.md, "A prediction that brakes")."""
    times, speeds = np.asarray(times, dtype=float), np.asarray(speeds, dtype=float)
    if len(times) < 2 or np.ptp(times) < 0.1 or speeds[-1] < MIN_SPEED_FOR_CHANGE:
        return 0.0
    slope = np.polyfit(times, speeds, 1)[0]
    return float(np.clip(slope, -MAX_SPEED_CHANGE, MAX_SPEED_CHANGE))


# The speeds the speed change is measured from span at least this many typical scan intervals
# (``speed_window``), so that a caller taking scans slower than the window has two of them.
SPEED_WINDOW_INTERVALS = 2.0


def speed_window(window: float, interval: float) -> float:
    """Seconds before the last trusted scan whose interval speeds (by their middles) give the speed
    change: ``window``, or ``SPEED_WINDOW_INTERVALS`` typical scan intervals ``interval`` when scans
    come slower (0: ``window`` off stays off). With the window alone a node taking a scan every
    1.2 s had one speed in it and predicted at constant speed; with the last two intervals, on the
    real KITTI odometry trajectories (sequences 00-10, twist over 1.2 s, 1.2 s ahead), predictions
    more than 1.5 m off (tracking's ``prior_radius``) fell from 14-43 % to 8-34 % of the poses per
    sequence (00: 42.8 -> 34.4 %, 05: 29.7 -> 17.6 %), the p95 error from 1.9-3.6 to 1.6-2.7 m
    (``s2h bench prediction --twist-over 1.2 --ahead 1.2``, docs/performance.md). At 10 Hz nothing
    changes (two intervals are 0.2 s)."""
    if window <= 0:
        return 0.0
    return max(window, SPEED_WINDOW_INTERVALS * interval)


def travelled(speed: float, change: float, dt: float, horizon: float = math.inf) -> float:
    """Metres covered in ``dt`` seconds from ``speed`` (m/s), the speed changing by ``change`` m/s^2
    for at most ``horizon`` seconds and then kept; a vehicle that brakes stops, it does not reverse."""
    dt = max(dt, 0.0)
    t = min(dt, horizon)
    if change < 0.0:
        t = min(t, speed / -change)
    after = speed + change * t
    return speed * t + 0.5 * change * t * t + after * (dt - t)


def predicted_pose(pose: np.ndarray, twist: np.ndarray, dt: float, turn_horizon: float = math.inf,
                   change: float = 0.0) -> np.ndarray:
    """``(4, 4)`` pose ``dt`` seconds after ``pose`` (4, 4) moving with ``twist`` (6,): the
    velocity over the whole interval, its speed changing by ``change`` m/s^2 (``speed_change``) and
    the turn rate kept over at most ``turn_horizon`` seconds.

    A turn ends: carried on, a corner's rate turned a prediction 3 s stale by 154 deg where the
    sensor had turned 15 (the soak's 10 Hz drive, world 12), and the global search tried the scan
    turned around first (``Registrar.headings``). On the real KITTI odometry trajectories
    (sequences 00-10, ground truth at 10 Hz; horizons of 0.5-2 s compared on 00-04: 0.5 and 1 s
    alike in the heading order, 1 s with the smaller tail of yaw errors; 05-10 alike), predictions
    3 s ahead put a turned heading hypothesis first for 6.5-8.5 % of the scans whose true turn was
    under 45 deg with the rate carried on, 0-0.1 % with it carried
    for 1 s, and the median yaw error fell 4.7-6.2 -> 3.5-4.6 deg (``s2h bench prediction``,
    docs/reliability.md). The speed's change is kept over the same horizon (a driver brakes to a
    speed, or pulls away to one) and does not reverse the motion (``travelled``)."""
    dt = max(dt, 0.0)
    turn = Rotation.from_rotvec(twist[3:] * min(dt, turn_horizon)).as_matrix()
    speed = float(np.linalg.norm(twist[:3]))
    moved = twist[:3] * dt
    if change and speed > 0.0 and dt > 0.0:
        moved = moved * (travelled(speed, change, dt, turn_horizon) / (speed * dt))
    return pose @ geometry.make_transform(turn, moved)


def relocalised_twist(delta: np.ndarray, dt: float) -> np.ndarray:
    """The prior's ``(6,)`` body twist after a relocalisation: ``delta`` (4, 4) is the motion since
    the last trusted pose, over ``dt`` seconds. Its speed is kept (without it the next scan is
    predicted at the relocalised pose and searched globally again), along the direction the sensor
    moves in at the end of the gap: on an arc turning by ``theta``, the chord ``t`` lies ``theta / 2``
    behind the end's tangent and is ``sin(theta / 2) / (theta / 2)`` of the arc's length (the chord
    itself, taken as the direction, put predictions after a corner 3.9 m off at the median, the
    tangent 2.3 m: gaps of 0.8-2 s after turns of more than 20 deg, predicted 0.2-2 s on, ten held-out
    simulated drives). Its mean turn rate is not kept (a turn ends: the mean yaw rate over 1.5 s of a
    corner, extrapolated on, put the next prediction 69.5 deg off on a held-out HDL-64 drive
    emulated at 10 Hz; predictions without rotation after relocalisations there: 0.5-1.3 deg)."""
    half = Rotation.from_matrix(delta[:3, :3]).as_rotvec() / 2.0
    angle = float(np.linalg.norm(half))
    arc = angle / math.sin(angle) if angle > 1e-9 else 1.0
    tangent = Rotation.from_rotvec(half).as_matrix().T @ delta[:3, 3]
    return np.concatenate([arc * tangent / dt, np.zeros(3)])
