"""The registration's pose covariance (point-to-plane normal equations at the result): large along
directions the geometry leaves free, small where it constrains the pose."""
from __future__ import annotations

import numpy as np

from s2h_ros.cloud import PreparedCloud
from s2h_ros.config import RegistrationConfig
from s2h_ros.verification import alignment_covariance


def _prepared(xyz: np.ndarray) -> PreparedCloud:
    return PreparedCloud(xyz.astype(np.float32), None, len(xyz), "none")


def _plane(rng, n, origin, u, v, size) -> np.ndarray:
    a, b = rng.uniform(-size, size, (2, n))
    return origin + a[:, None] * u + b[:, None] * v + rng.normal(0, 0.01, (n, 3)) * np.cross(u, v)


def _corridor(rng) -> np.ndarray:
    x, y, z = np.eye(3)
    walls = [_plane(rng, 3000, [0, 2, 0], x, z, 20.0), _plane(rng, 3000, [0, -2, 0], x, z, 20.0)]
    floor = _plane(rng, 3000, [0, 0, -1], x, 2 * y / 20.0, 20.0)
    return np.concatenate(walls + [floor])


def test_a_corridor_leaves_translation_along_it_unconstrained(rng):
    # Two scans of the same corridor: independent samples with independent noise.
    source, target = _corridor(rng), _corridor(rng)
    cfg = RegistrationConfig(voxel_size=0.3)
    cov = alignment_covariance(source, _prepared(target), np.eye(4), cfg)
    np.testing.assert_allclose(cov, cov.T, atol=1e-15)
    var = np.diag(cov)
    # Only the noise in the estimated normals ties x at all: along the corridor the pose is far
    # less certain than across it or vertically, and that is the least certain translation.
    assert var[0] > 20 * max(var[1], var[2])
    lam, vec = np.linalg.eigh(cov[:3, :3])
    assert abs(vec[0, -1]) > 0.95


def test_a_closed_room_constrains_every_direction(rng):
    x, y, z = np.eye(3)

    def room() -> np.ndarray:
        return np.concatenate([_plane(rng, 2000, [0, 3, 0], x, z, 3.0), _plane(rng, 2000, [0, -3, 0], x, z, 3.0),
                               _plane(rng, 2000, [4, 0, 0], y, z, 3.0), _plane(rng, 2000, [-4, 0, 0], y, z, 3.0),
                               _plane(rng, 2000, [0, 0, -1.5], x, y, 3.0)])

    cfg = RegistrationConfig(voxel_size=0.3)
    cov = alignment_covariance(room(), _prepared(room()), np.eye(4), cfg)
    assert np.linalg.eigvalsh(cov).min() > 0
    sd = np.sqrt(np.diag(cov))
    assert sd[:3].max() < 0.01 and sd[3:].max() < 0.01  # noise 1 cm over 10k points: mm and mrad


def test_too_few_overlapping_points_give_a_huge_not_a_false_small_covariance():
    far = np.random.default_rng(1).uniform(-1, 1, (50, 3))
    cov = alignment_covariance(far + 100.0, _prepared(far), np.eye(4), RegistrationConfig(voxel_size=0.3))
    assert np.diag(cov).min() >= 1e6
