"""Scan-to-keyframe odometry on top of the SHM_DGR registrar (no ROS).

Each scan is registered against the current keyframe, whose features are computed once. A new
keyframe is taken after enough travel or rotation, or when the inlier ratio drops; after
``max_failures`` failed scans in a row the keyframe is re-initialised. A failed scan yields no
pose: callers (the ROS node, replay evaluation) publish nothing they cannot trust.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.spatial.transform import Rotation

from s2h_ros import geometry
from s2h_ros.config import OdometryConfig, RegistrationConfig
from s2h_ros.pipeline import PreparedCloud, Registrar, RegistrationError, RegistrationResult


@dataclass
class OdometryStep:
    """Outcome of one scan."""

    index: int
    stamp: float
    success: bool
    message: str
    pose: np.ndarray | None  # (4, 4) sensor pose in the odometry frame; None when not trusted
    T_keyframe_scan: np.ndarray | None  # (4, 4) maps scan points into the keyframe frame
    keyframe_id: int
    keyframe_stamp: float
    new_keyframe: bool
    result: RegistrationResult | None  # None for the first scan of a keyframe chain or bad input
    keyframe_xyz: np.ndarray | None = None  # (M, 3) keyframe voxels (for markers)
    # (6, 6) covariance of ``pose`` as a left perturbation [translation, rotation] in the odometry
    # frame: the keyframe's, plus this registration's (RegistrationResult.covariance) carried over.
    covariance: np.ndarray | None = None
    # (6,) body twist of the sensor [vx, vy, vz, wx, wy, wz] per second (constant-velocity prior)
    # and its (6, 6) covariance (two registrations' uncertainty over the time step).
    twist: np.ndarray | None = None
    twist_covariance: np.ndarray | None = None


class KeyframeOdometry:
    """Online odometry: ``step(points, stamp)`` per scan, poses in the first keyframe's frame."""

    def __init__(
        self,
        registration: RegistrationConfig | None = None,
        odometry: OdometryConfig | None = None,
        registrar: Registrar | None = None,
    ) -> None:
        self.cfg = odometry or OdometryConfig()
        self.registrar = registrar or Registrar(registration)
        self.keyframe: PreparedCloud | None = None
        self.keyframe_pose = np.eye(4)
        self.keyframe_id = -1
        self.keyframe_stamp = 0.0
        self.keyframe_cov = np.zeros((6, 6))  # covariance of keyframe_pose (see OdometryStep)
        self.last_pose: np.ndarray | None = None
        # Constant-velocity prior: body-frame twist per second [v, w], so the prediction stays
        # right when scans were dropped or arrive at an uneven rate.
        self.twist = np.zeros(6)
        self.twist_cov = np.zeros((6, 6))
        self.last_stamp: float | None = None
        self.failures = 0
        self.count = 0

    def step(self, points: np.ndarray, stamp: float) -> OdometryStep:
        index = self.count
        self.count += 1
        try:
            self._check(points)
            prepared = self.registrar.prepare(points)
        except RegistrationError as exc:
            return self._failed(index, stamp, f"bad scan: {exc}", None)
        if self.keyframe is None:
            pose = np.eye(4) if self.last_pose is None else self._predict(stamp)
            self._set_keyframe(prepared, pose, stamp, self.keyframe_cov)
            self.last_pose, self.last_stamp = pose, stamp
            return OdometryStep(index, stamp, True, "keyframe initialised", pose, np.eye(4), self.keyframe_id,
                                stamp, True, None, prepared.input_frame_xyz(), self.keyframe_cov.copy(), self.twist.copy(),
                                self.twist_cov.copy())

        prior = geometry.invert_transform(self.keyframe_pose) @ self._predict(stamp)
        result = self.registrar.register(prepared, self.keyframe, init=prior)
        if not result.success and self.cfg.use_motion_prior:
            result = self._refine_from_prior(prepared, prior, result)
        if not result.success:
            self.failures += 1
            step = self._failed(index, stamp, result.message, result)
            if self.failures >= self.cfg.max_failures:
                # Give up on this keyframe: continue from the prediction with this scan, as uncertain
                # as the whole extrapolated motion (one standard deviation per twist component).
                dt = max(stamp - self.last_stamp, 0.0)
                self._set_keyframe(prepared, self._predict(stamp), stamp,
                                   self.keyframe_cov + np.diag((self.twist * dt) ** 2))
                self.failures = 0
            return step

        self.failures = 0
        pose = self.keyframe_pose @ result.transform
        cov_rel = result.covariance if result.covariance is not None else np.diag([1e6] * 6)
        Ad = geometry.adjoint(self.keyframe_pose)
        covariance = self.keyframe_cov + Ad @ cov_rel @ Ad.T
        dt = stamp - self.last_stamp
        if dt > 0:
            delta = geometry.invert_transform(self.last_pose) @ pose
            self.twist = np.concatenate([delta[:3, 3], Rotation.from_matrix(delta[:3, :3]).as_rotvec()]) / dt
            body = geometry.adjoint(geometry.invert_transform(result.transform))  # keyframe -> scan body frame
            self.twist_cov = 2.0 * (body @ cov_rel @ body.T) / dt**2
        self.last_pose, self.last_stamp = pose, stamp
        kf_id, kf_stamp, kf_xyz = self.keyframe_id, self.keyframe_stamp, self.keyframe.input_frame_xyz()
        new_kf = self._needs_keyframe(result)
        if new_kf:
            self._set_keyframe(prepared, pose, stamp, covariance)
        return OdometryStep(index, stamp, True, "", pose, result.transform, kf_id, kf_stamp, new_kf, result, kf_xyz,
                            covariance, self.twist.copy(), self.twist_cov.copy())

    # ------------------------------------------------------------------ helpers
    def _check(self, points: np.ndarray) -> None:
        pts = np.asarray(points)
        if pts.ndim != 2 or pts.shape[1] < 3:
            raise RegistrationError(f"expected (N, 3) points, got shape {pts.shape}")
        n = int(np.isfinite(pts[:, :3]).all(axis=1).sum())
        if n < self.cfg.min_points:
            raise RegistrationError(f"{n} finite points (need {self.cfg.min_points})")

    def _predict(self, stamp: float) -> np.ndarray:
        """Pose at ``stamp`` extrapolated from the last trusted pose with the last twist."""
        dt = max(stamp - self.last_stamp, 0.0) if self.last_stamp is not None else 0.0
        step = self.twist * dt
        return self.last_pose @ geometry.make_transform(Rotation.from_rotvec(step[3:]).as_matrix(), step[:3])

    def _set_keyframe(self, prepared: PreparedCloud, pose: np.ndarray, stamp: float, covariance: np.ndarray) -> None:
        self.keyframe, self.keyframe_pose, self.keyframe_stamp = prepared, pose, stamp
        self.keyframe_cov = covariance
        self.keyframe_id += 1

    def _needs_keyframe(self, result: RegistrationResult) -> bool:
        T = result.transform
        moved = float(np.linalg.norm(T[:3, 3]))
        angle = math.degrees(math.acos(np.clip((np.trace(T[:3, :3]) - 1) / 2, -1.0, 1.0)))
        return (
            moved >= self.cfg.keyframe_distance
            or angle >= self.cfg.keyframe_rotation_deg
            or result.inlier_ratio < self.cfg.keyframe_min_inlier_ratio
        )

    def _refine_from_prior(self, prepared: PreparedCloud, prior: np.ndarray, failed: RegistrationResult):
        """Local ICP from the motion prior, accepted only if it passes the same verification."""
        refined = self.registrar.refine(prepared, self.keyframe, prior, failed.correspondences)
        if not refined.success:
            return failed
        refined.message = "global registration not trusted; local ICP from the motion prior verified"
        refined.used_fallback = True
        refined.num_candidates = failed.num_candidates
        extra = {f"prior_{k}": v for k, v in refined.timings.items() if k != "total"}
        refined.timings = {**failed.timings, **extra,
                           "total": failed.timings.get("total", 0.0) + refined.timings.get("total", 0.0)}
        return refined

    def _failed(self, index: int, stamp: float, message: str, result: RegistrationResult | None) -> OdometryStep:
        kf_xyz = self.keyframe.input_frame_xyz() if self.keyframe is not None else None
        return OdometryStep(index, stamp, False, message, None, None, self.keyframe_id, self.keyframe_stamp,
                            False, result, kf_xyz)
