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
        self.last_pose: np.ndarray | None = None
        # Constant-velocity prior: body-frame twist per second (rotation vector, translation), so
        # the prediction stays right when scans were dropped or arrive at an uneven rate.
        self.twist = np.zeros(6)
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
            self._set_keyframe(prepared, pose, stamp)
            self.last_pose, self.last_stamp = pose, stamp
            return OdometryStep(index, stamp, True, "keyframe initialised", pose, np.eye(4), self.keyframe_id,
                                stamp, True, None, prepared.xyz)

        prior = geometry.invert_transform(self.keyframe_pose) @ self._predict(stamp)
        result = self.registrar.register(prepared, self.keyframe, init=prior)
        if not result.success and self.cfg.use_motion_prior:
            result = self._refine_from_prior(prepared, prior, result)
        if not result.success:
            self.failures += 1
            step = self._failed(index, stamp, result.message, result)
            if self.failures >= self.cfg.max_failures:
                # Give up on this keyframe: continue from the prediction with this scan.
                self._set_keyframe(prepared, self._predict(stamp), stamp)
                self.failures = 0
            return step

        self.failures = 0
        pose = self.keyframe_pose @ result.transform
        dt = stamp - self.last_stamp
        if dt > 0:
            delta = geometry.invert_transform(self.last_pose) @ pose
            self.twist = np.concatenate([Rotation.from_matrix(delta[:3, :3]).as_rotvec(), delta[:3, 3]]) / dt
        self.last_pose, self.last_stamp = pose, stamp
        kf_id, kf_stamp, kf_xyz = self.keyframe_id, self.keyframe_stamp, self.keyframe.xyz
        new_kf = self._needs_keyframe(result)
        if new_kf:
            self._set_keyframe(prepared, pose, stamp)
        return OdometryStep(index, stamp, True, "", pose, result.transform, kf_id, kf_stamp, new_kf, result, kf_xyz)

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
        return self.last_pose @ geometry.make_transform(Rotation.from_rotvec(step[:3]).as_matrix(), step[3:])

    def _set_keyframe(self, prepared: PreparedCloud, pose: np.ndarray, stamp: float) -> None:
        self.keyframe, self.keyframe_pose, self.keyframe_stamp = prepared, pose, stamp
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
        from s2h_ros.pipeline import refine_icp, verify

        cfg = self.registrar.config
        T = refine_icp(prepared.xyz, self.keyframe.xyz, prior, cfg)
        n_inl, mask, fitness = verify(prepared.xyz, self.keyframe.xyz, failed.correspondences, T, cfg.inlier_distance)
        if fitness < cfg.min_fitness:
            return failed
        failed.transform, failed.success, failed.fitness = T, True, fitness
        failed.num_inliers, failed.inlier_mask = n_inl, mask
        failed.inlier_ratio = n_inl / max(len(failed.correspondences), 1)
        failed.message = "global registration not trusted; local ICP from the motion prior verified"
        failed.used_fallback = True
        return failed

    def _failed(self, index: int, stamp: float, message: str, result: RegistrationResult | None) -> OdometryStep:
        kf_xyz = self.keyframe.xyz if self.keyframe is not None else None
        return OdometryStep(index, stamp, False, message, None, None, self.keyframe_id, self.keyframe_stamp,
                            False, result, kf_xyz)
