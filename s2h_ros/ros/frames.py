"""The odom frame of registration_node (REP-105): continuous, whatever the extrinsic does.

The odometry (s2h_ros.odometry) tracks sensor poses ``P`` in the first scan's sensor frame. odom
is the base frame at the first scan, where the sensor sits at the extrinsic ``E`` (base <- sensor),
so a sensor pose is ``A P`` in odom with the anchor ``A = E`` and the base pose ``A P E^-1``.

The extrinsic can arrive late: from /tf_static or tf2 after the first scans, when the parameter
gave another value. Taking the new ``E`` into the formula as it stands would move the published
base pose at once (a jump in odom). Instead the anchor is re-chosen so the base pose of the last
published scan stays where it was: ``A' = (A P E^-1) E' P^-1``; later motion then goes through the
right extrinsic. Pure numpy, no ROS, so it is tested on its own.
"""
from __future__ import annotations

import numpy as np

from s2h_ros import geometry


class OdomFrame:
    """Sensor poses of the odometry -> poses in odom, for a robot with or without a base frame."""

    def __init__(self, sensor_to_base: np.ndarray, has_base: bool = True) -> None:
        self.has_base = has_base
        self.sensor_to_base = np.asarray(sensor_to_base, dtype=np.float64) if has_base else np.eye(4)
        self.anchor = self.sensor_to_base.copy()  # odom <- the odometry's frame (first sensor frame)

    def sensor_in_odom(self, P: np.ndarray) -> np.ndarray:
        """(4, 4) sensor pose in odom of the odometry's sensor pose ``P``."""
        return self.anchor @ P

    def child_in_odom(self, P: np.ndarray) -> np.ndarray:
        """(4, 4) pose of the published child (base, or the sensor without a base frame) in odom."""
        return self.anchor @ P @ geometry.invert_transform(self.sensor_to_base)

    def set_extrinsic(self, sensor_to_base: np.ndarray, last_pose: np.ndarray | None) -> None:
        """Use a new base <- sensor extrinsic from now on; odom does not move.

        ``last_pose``: the odometry's last published sensor pose (None before the first scan,
        where odom is simply defined with the new extrinsic).
        """
        if not self.has_base:
            return
        E = np.asarray(sensor_to_base, dtype=np.float64)
        if last_pose is None:
            self.anchor = E.copy()
        else:
            base_now = self.child_in_odom(last_pose)
            self.anchor = base_now @ E @ geometry.invert_transform(last_pose)
        self.sensor_to_base = E

    def covariance_in_odom(self, cov: np.ndarray, P: np.ndarray) -> np.ndarray:
        """(6, 6) ROS pose covariance of the child in odom from the odometry's covariance of ``P``
        (a left perturbation in the odometry frame, see OdometryStep.covariance)."""
        Ad = geometry.adjoint(self.anchor)
        return geometry.covariance_to_ros(Ad @ cov @ Ad.T, self.child_in_odom(P))

    def twist_in_child(self, twist: np.ndarray, twist_cov: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The sensor's body twist [v, w] and its covariance, expressed for the child frame
        (rigidly mounted: ``Ad_E`` with E = base <- sensor)."""
        Ad = geometry.adjoint(self.sensor_to_base)
        return Ad @ twist, Ad @ twist_cov @ Ad.T
