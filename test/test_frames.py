"""registration_node's odom frame (REP-105): continuous when the extrinsic changes, and the pose
covariance / twist it publishes expressed in the right frames."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from s2h_ros import geometry
from s2h_ros.ros.frames import OdomFrame


def _pose(yaw_deg: float, xyz) -> np.ndarray:
    return geometry.pose_matrix(xyz, [0.0, 0.0, np.sin(np.radians(yaw_deg) / 2), np.cos(np.radians(yaw_deg) / 2)])


# A drive of sensor poses in the first sensor frame: straight, then turning.
DRIVE = [_pose(5.0 * k * (k > 3), [3.0 * k, 0.4 * k * (k > 3), 0.0]) for k in range(8)]
EXTRINSIC = _pose(90.0, [1.2, 0.0, 1.7])  # base <- sensor


def test_odom_is_the_base_frame_at_the_first_scan():
    frames = OdomFrame(EXTRINSIC)
    np.testing.assert_allclose(frames.child_in_odom(np.eye(4)), np.eye(4), atol=1e-12)
    np.testing.assert_allclose(frames.sensor_in_odom(np.eye(4)), EXTRINSIC, atol=1e-12)


def test_without_a_base_frame_the_sensor_pose_is_published():
    frames = OdomFrame(EXTRINSIC, has_base=False)
    np.testing.assert_allclose(frames.child_in_odom(DRIVE[5]), DRIVE[5], atol=1e-12)


def test_a_late_extrinsic_does_not_move_odom_and_later_motion_uses_it():
    frames = OdomFrame(np.eye(4))  # the parameter said identity
    published = [frames.child_in_odom(P) for P in DRIVE[:4]]
    frames.set_extrinsic(EXTRINSIC, last_pose=DRIVE[3])  # /tf_static arrives after scan 3
    # The last published base pose is unchanged...
    np.testing.assert_allclose(frames.child_in_odom(DRIVE[3]), published[3], atol=1e-12)
    # ...and from then on each base increment is the sensor increment seen through the new extrinsic.
    E, Einv = EXTRINSIC, geometry.invert_transform(EXTRINSIC)
    for k in range(4, len(DRIVE)):
        step = geometry.invert_transform(frames.child_in_odom(DRIVE[k - 1])) @ frames.child_in_odom(DRIVE[k])
        expected = E @ geometry.invert_transform(DRIVE[k - 1]) @ DRIVE[k] @ Einv
        np.testing.assert_allclose(step, expected, atol=1e-9)
    # Taking the extrinsic into the old formula instead would have jumped by metres.
    naive = EXTRINSIC @ DRIVE[4] @ Einv
    assert np.linalg.norm(naive[:3, 3] - frames.child_in_odom(DRIVE[4])[:3, 3]) > 1.0


def test_an_extrinsic_before_the_first_scan_just_defines_odom():
    frames = OdomFrame(np.eye(4))
    frames.set_extrinsic(EXTRINSIC, last_pose=None)
    np.testing.assert_allclose(frames.child_in_odom(np.eye(4)), np.eye(4), atol=1e-12)
    np.testing.assert_allclose(frames.anchor, EXTRINSIC, atol=1e-12)


def test_pose_covariance_is_the_odometry_covariance_read_the_ros_way():
    """Published covariance = J cov J^T, with J the derivative of the published pose's error as ROS
    reads it (position in odom, rotation about odom's axes) by a left perturbation of the
    odometry's sensor pose (finite differences, no formula shared with the code)."""
    frames = OdomFrame(EXTRINSIC)
    P = DRIVE[6]
    base = frames.child_in_odom(P)
    A, Ainv = frames.anchor, geometry.invert_transform(frames.anchor)

    def ros_error(x: np.ndarray) -> np.ndarray:
        T = geometry.make_transform(Rotation.from_rotvec(x[3:]).as_matrix(), x[:3])
        moved = A @ T @ Ainv @ base
        return np.concatenate([moved[:3, 3] - base[:3, 3], Rotation.from_matrix(moved[:3, :3] @ base[:3, :3].T).as_rotvec()])

    J = np.stack([(ros_error(e * 1e-6) - ros_error(-e * 1e-6)) / 2e-6 for e in np.eye(6)], axis=1)
    L = np.diag([0.05, 0.02, 0.01, 0.002, 0.003, 0.01]) + 0.001  # correlated
    cov = L @ L.T
    np.testing.assert_allclose(frames.covariance_in_odom(cov, P), J @ cov @ J.T, atol=1e-9, rtol=1e-6)
    # The lever arm matters: the odometry-frame covariance itself is not the answer.
    assert np.abs(frames.covariance_in_odom(cov, P) - cov).max() > 1e-3


def test_twist_of_a_rigidly_mounted_base_from_the_sensor_twist():
    frames = OdomFrame(EXTRINSIC)
    dt = 1e-4
    sensor_twist = np.array([2.0, 0.1, 0.0, 0.0, 0.0, 0.5])  # [v, w] per second, sensor body frame
    step = geometry.make_transform(Rotation.from_rotvec(sensor_twist[3:] * dt).as_matrix(), sensor_twist[:3] * dt)
    # base motion over dt: E step E^-1 (body frame of the base)
    base_step = EXTRINSIC @ step @ geometry.invert_transform(EXTRINSIC)
    twist, cov = frames.twist_in_child(sensor_twist, np.eye(6))
    np.testing.assert_allclose(twist[:3], base_step[:3, 3] / dt, rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(cov, cov.T)
    assert np.linalg.eigvalsh(cov).min() > 0


def test_pose_matrix_rejects_a_zero_or_nan_quaternion():
    with pytest.raises(ValueError, match="quaternion"):
        geometry.pose_matrix([0, 0, 0], [0, 0, 0, 0])
    with pytest.raises(ValueError, match="finite"):
        geometry.pose_matrix([np.nan, 0, 0], [0, 0, 0, 1])
    np.testing.assert_allclose(geometry.pose_matrix([1, 2, 3], [0, 0, 0, 2.0]), geometry.make_transform(np.eye(3), np.array([1.0, 2, 3])))
