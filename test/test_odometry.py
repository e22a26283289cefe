"""Scan-to-keyframe odometry: tracks a drive, rejects bad scans without losing track, takes
keyframes by the policy and re-initialises after repeated failures."""
from __future__ import annotations

import numpy as np

from s2h_ros import geometry
from s2h_ros.config import OdometryConfig, RegistrationConfig
from s2h_ros.odometry import KeyframeOdometry

FAST = RegistrationConfig(voxel_size=0.5, features="fpfh", matcher="mutual_nn", inlier_distance=1.0)


def _gt(drive) -> np.ndarray:
    poses = drive.poses
    return np.einsum("ij,njk->nik", geometry.invert_transform(poses[0]), poses)


def test_drive_is_tracked_within_half_a_voxel(vlp16_drive):
    odo = KeyframeOdometry(FAST)
    gt = _gt(vlp16_drive)
    for i, scan in enumerate(vlp16_drive):
        step = odo.step(scan.points, scan.stamp)
        assert step.success, step.message
        re, te = geometry.transform_errors(step.pose, gt[i])
        assert te < 0.25 and re < 1.5, (i, re, te)  # voxel 0.5 m, 16 beams


def test_bad_scan_fails_alone_and_tracking_continues(vlp16_drive):
    odo = KeyframeOdometry(FAST)
    gt = _gt(vlp16_drive)
    assert odo.step(vlp16_drive[0].points, 0.0).success
    bad = odo.step(np.full((500, 3), np.nan, np.float32), 0.05)
    assert not bad.success and bad.pose is None and "finite points" in bad.message
    step = odo.step(vlp16_drive[1].points, 0.1)
    assert step.success
    assert geometry.transform_errors(step.pose, gt[1])[1] < 0.25


def test_keyframes_follow_the_distance_policy(vlp16_drive):
    odo = KeyframeOdometry(FAST, OdometryConfig(keyframe_distance=0.3, keyframe_min_inlier_ratio=0.0))
    steps = [odo.step(s.points, s.stamp) for s in vlp16_drive]
    new = [s.index for s in steps if s.new_keyframe]
    # The drive starts from rest and covers 0.9 m in 8 scans: keyframes at 0 and at least twice more.
    assert new[0] == 0 and len(new) >= 3
    gt = _gt(vlp16_drive)
    travelled = [np.linalg.norm(gt[b, :3, 3] - gt[a, :3, 3]) for a, b in zip(new, new[1:])]
    assert all(d >= 0.3 - 0.05 for d in travelled), travelled
    # Scans between keyframes are registered to the last keyframe, not chained.
    assert all(s.keyframe_id == sum(1 for k in new if k < s.index) - 1 for s in steps[1:])


def test_repeated_failures_reinitialise_the_keyframe(vlp16_drive, rng):
    odo = KeyframeOdometry(FAST.replace(min_fitness=0.9), OdometryConfig(max_failures=2, use_motion_prior=False))
    odo.step(vlp16_drive[0].points, 0.0)
    first_id = odo.keyframe_id
    noise = [rng.uniform(-30, 30, (3000, 3)).astype(np.float32) for _ in range(2)]
    steps = [odo.step(n, 0.1 * (i + 1)) for i, n in enumerate(noise)]
    assert not any(s.success for s in steps)
    assert odo.keyframe_id == first_id + 1 and odo.failures == 0


def test_motion_prior_scales_with_the_time_between_scans(vlp16_drive):
    odo = KeyframeOdometry(FAST)
    scans = list(vlp16_drive)
    for s in scans[:4]:
        odo.step(s.points, s.stamp)
    # Predicting three scan periods ahead lands near the true pose three scans later.
    gt = _gt(vlp16_drive)
    predicted = odo._predict(scans[3].stamp + 0.3)
    err_pred = np.linalg.norm(predicted[:3, 3] - gt[6, :3, 3])
    err_hold = np.linalg.norm(odo.last_pose[:3, 3] - gt[6, :3, 3])
    assert err_pred < 0.5 * err_hold
