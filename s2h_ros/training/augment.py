"""Training augmentation of a pair: random yaw and small tilt per side, noise, subsampling, range crop.

Every change keeps ``T_gt`` exact: rotating the source by ``R_s`` and the target by ``R_t`` turns
``x_t = T x_s`` into ``R_t x_t = (R_t T R_s^T)(R_s x_s)``. Lidar scans are gravity-aligned, so
rotations are about z with a few degrees of tilt. FCGF/DGR rotate KITTI pairs by any angle; the
default yaw range here is +-45 deg because pairs along a drive differ by far less; on an H200,
1.7k steps of the compact FCGF reached a 2.4 % validation inlier ratio at +-45 deg against 0.6 %
at +-180 deg (each validated in its own range; ``max_yaw_deg=180`` restores the full range).
Depth-camera fragments (3DMatch) come in camera frames with no known gravity: ``any_orientation``
turns both sides of a pair by one common, uniformly random rotation on top of their own yaw and
tilt, so the features see every absolute orientation while relative rotations stay those of a
moving sensor.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.spatial.transform import Rotation

from s2h_ros.training.data import CachedPair


@dataclass
class AugmentConfig:
    """Ranges of the random changes (defaults suit 0.3 m voxels of outdoor lidar)."""

    max_yaw_deg: float = 45.0  # rotation about z, uniform in [-max, max] (180: any heading)
    max_tilt_deg: float = 3.0  # roll and pitch, uniform in [-max, max]
    any_orientation: bool = False  # one common uniformly random rotation of both sides (gravity unknown)
    noise_sigma: float = 0.01  # metres, Gaussian jitter per point
    keep_min: float = 1.0  # each side keeps a random fraction in [keep_min, 1] of its points (1: off;
    # random voxel dropout makes the occupancy-driven descriptors of one place differ between sides)
    crop_min_range: float = 40.0  # each side drops points beyond a random range in [this, crop_max_range]
    crop_max_range: float = 120.0


def augment_from_args(args) -> AugmentConfig | None:
    """The trainers' ``--max-yaw`` / ``--max-tilt`` / ``--any-orientation`` / ``--crop-range`` /
    ``--no-augment`` options (``None``: no augmentation)."""
    if args.no_augment:
        return None
    return AugmentConfig(max_yaw_deg=args.max_yaw, max_tilt_deg=args.max_tilt, any_orientation=args.any_orientation,
                         crop_min_range=args.crop_range[0], crop_max_range=args.crop_range[1])


def random_gravity_rotation(rng: np.random.Generator, max_yaw_deg: float, max_tilt_deg: float) -> np.ndarray:
    """``(3, 3)`` float64: yaw in [-max_yaw, max_yaw] after roll/pitch in [-max_tilt, max_tilt] (degrees)."""
    yaw = rng.uniform(-max_yaw_deg, max_yaw_deg)
    roll, pitch = rng.uniform(-max_tilt_deg, max_tilt_deg, size=2)
    return Rotation.from_euler("zyx", [yaw, pitch, roll], degrees=True).as_matrix()


def _thin(xyz: np.ndarray, rng: np.random.Generator, cfg: AugmentConfig) -> np.ndarray:
    """Random subset and range crop, never below 3 points."""
    keep = rng.uniform(size=len(xyz)) < rng.uniform(cfg.keep_min, 1.0)
    keep &= np.linalg.norm(xyz[:, :2], axis=1) < rng.uniform(cfg.crop_min_range, cfg.crop_max_range)
    return xyz[keep] if keep.sum() >= 3 else xyz


def augment_pair(pair: CachedPair, rng: np.random.Generator, cfg: AugmentConfig | None = None) -> CachedPair:
    """A randomly rotated, noised, thinned copy of ``pair`` with its exact ground truth."""
    cfg = cfg or AugmentConfig()
    R_s = random_gravity_rotation(rng, cfg.max_yaw_deg, cfg.max_tilt_deg)
    R_t = random_gravity_rotation(rng, cfg.max_yaw_deg, cfg.max_tilt_deg)
    if cfg.any_orientation:
        common = Rotation.random(random_state=rng).as_matrix()
        R_s, R_t = common @ R_s, common @ R_t
    sides = []
    for xyz, R in ((pair.source, R_s), (pair.target, R_t)):
        xyz = _thin(xyz, rng, cfg)  # crop in the sensor frame, before rotating
        xyz = xyz @ R.T.astype(np.float32) + rng.normal(0.0, cfg.noise_sigma, xyz.shape).astype(np.float32)
        sides.append(xyz.astype(np.float32))
    A_s, A_t = np.eye(4), np.eye(4)
    A_s[:3, :3], A_t[:3, :3] = R_s, R_t
    T = A_t @ pair.T_gt @ np.linalg.inv(A_s)
    return CachedPair(sides[0], sides[1], T, pair.name)
