"""The odometry's motion prior (s2h_ros.motion_prior): the speed's change, the distance it covers,
and the prediction that carries it (real trajectories: test_bench_prediction.py)."""
from __future__ import annotations

import numpy as np
import pytest

from s2h_ros import geometry
from s2h_ros.motion_prior import MAX_SPEED_CHANGE, predicted_pose, speed_change, travelled


def test_the_speed_change_is_the_slope_of_the_recent_speeds():
    times = np.array([0.05, 0.25, 0.45, 0.65, 0.85])
    assert speed_change(times, 10.0 - 2.0 * times) == pytest.approx(-2.0)  # braking at 2 m/s^2
    noisy = 5.0 + 1.5 * times + np.array([0.05, -0.04, 0.03, -0.05, 0.01])
    assert speed_change(times, noisy) == pytest.approx(1.5, abs=0.15)


def test_no_speed_change_without_two_intervals_apart_or_near_rest_and_at_most_the_clamp():
    assert speed_change(np.array([0.5]), np.array([8.0])) == 0.0
    assert speed_change(np.array([0.50, 0.55]), np.array([8.0, 9.0])) == 0.0  # middles 0.05 s apart
    assert speed_change(np.array([0.1, 0.5]), np.array([0.1, 0.45])) == 0.0  # below 0.5 m/s: noise
    assert speed_change(np.array([0.1, 0.3]), np.array([5.0, 10.0])) == MAX_SPEED_CHANGE  # 25 m/s^2: noise
    assert speed_change(np.array([0.1, 0.3]), np.array([10.0, 5.0])) == -MAX_SPEED_CHANGE


def test_a_braking_vehicle_stops_and_a_speed_change_ends_at_the_horizon():
    assert travelled(10.0, 0.0, 1.5) == pytest.approx(15.0)
    assert travelled(10.0, -2.0, 1.0) == pytest.approx(9.0)
    assert travelled(2.0, -4.0, 3.0) == pytest.approx(0.5)  # stopped after 0.5 s, not reversing
    assert travelled(10.0, 2.0, 3.0, horizon=1.0) == pytest.approx(11.0 + 12.0 * 2.0)  # then 12 m/s


def test_the_prediction_moves_along_the_velocity_by_the_distance_travelled_and_turns_as_before():
    pose = geometry.yaw_transform(30.0)
    twist = np.array([8.0, 0.0, 0.0, 0.0, 0.0, np.radians(10.0)])
    kept = geometry.invert_transform(pose) @ predicted_pose(pose, twist, 1.5, turn_horizon=1.0)
    braking = geometry.invert_transform(pose) @ predicted_pose(pose, twist, 1.5, turn_horizon=1.0, change=-3.0)
    assert kept[:3, 3] == pytest.approx([12.0, 0.0, 0.0])
    assert braking[:3, 3] == pytest.approx([8.0 * 1.5 - 1.5 - 3.0 * 0.5, 0.0, 0.0])  # 1 s braking, then 5 m/s
    assert geometry.yaw_deg(braking) == pytest.approx(geometry.yaw_deg(kept)) == pytest.approx(10.0)
