"""The constant-velocity motion prior of the odometry (no ROS, no torch).

The prior is a ``(6,)`` body twist per second ``[vx, vy, vz, wx, wy, wz]`` (sensor frame at the
last trusted pose), measured between two trusted poses (:func:`body_twist`), or after a gap the
mean over it without its turn (:func:`relocalised_twist`). :func:`predicted_pose` extrapolates
it: the velocity over the whole interval, the turn rate over at most a horizon, because a turn
ends. scipy's rotation vectors do the SO(3) part; what is written here is the motion model.
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


def predicted_pose(pose: np.ndarray, twist: np.ndarray, dt: float, turn_horizon: float = math.inf) -> np.ndarray:
    """``(4, 4)`` pose ``dt`` seconds after ``pose`` (4, 4) moving with ``twist`` (6,): the
    velocity over the whole interval, the turn rate over at most ``turn_horizon`` seconds.

    A turn ends: carried on, a corner's rate turned a prediction 3 s stale by 154 deg where the
    sensor had turned 15 (the soak's 10 Hz drive, world 12), and the global search tried the scan
    turned around first (``Registrar.headings``). On the real KITTI odometry trajectories
    (sequences 00-10, ground truth at 10 Hz; horizons of 0.5-2 s compared on 00-04: 0.5 and 1 s
    alike in the heading order, 1 s with the smaller tail of yaw errors; 05-10 alike), predictions
    3 s ahead put a turned heading hypothesis first for 6.5-8.5 % of the scans whose true turn was
    under 45 deg with the rate carried on, 0-0.1 % with it carried
    for 1 s, and the median yaw error fell 4.7-6.2 -> 3.5-4.6 deg (``s2h bench prediction``,
    docs/reliability.md). Within the horizon the prediction is the constant-velocity one."""
    dt = max(dt, 0.0)
    turn = Rotation.from_rotvec(twist[3:] * min(dt, turn_horizon)).as_matrix()
    return pose @ geometry.make_transform(turn, twist[:3] * dt)


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
