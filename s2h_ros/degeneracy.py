"""Degeneracy: does the geometry at a registration's result constrain every direction of the pose?

A straight tunnel or corridor leaves translation along it free, an open flat field leaves the
horizontal translation and the heading free, a long straight street with only the ground and two
parallel facades leaves the motion along the street free. Point-to-plane alignment there returns
whatever its start was along those directions, often with a perfect fitness: fitness cannot tell,
the normal equations can.

At the result each matched source point ``p`` (target frame) with the target normal ``n`` gives the
row ``[n, (p - c) x n / L]`` of the Jacobian of its point-to-plane residual for a small motion
``[translation, rotation about c]``, with ``c`` the matched points' centroid and ``L`` their RMS
distance from it (so that rotation is measured as the displacement it causes, in metres per metre).
The information matrix ``A = J^T J / m`` over the ``m`` rows is scale free: for a pure translation
``d`` (unit), ``d^T A d`` is the mean squared component of the normals along ``d``, 1 when every
surface faces ``d`` and 0 when none does.

**Translation once rotation is free.** The failures this gate is for are slides: along a tunnel,
a highway, a street between two facades, across an open field. The test is the smallest
eigenvalue of the Schur complement ``S = A_tt - A_tr A_rr^+ A_rt``: how well a translation is
constrained when a rotation may absorb what it can. Its eigenvector is the **weakest direction**
(a translation), its eigenvalue the **constraint of the weakest direction**. ``S`` does not depend
on the lever ``L`` used to scale rotations; the rotation eigenvalues of ``A`` do: on a long straight
street of a 64-beam town drive the roll about the street measured 0.006-0.007 at right results
(its ``L`` is the street's length, not the ground's width), and the 6-D smallest eigenvalue refused
12 of 428 right scans of the demo drive (world seed 9), starting three new segments. Free
rotations that matter come with a free translation (a round tunnel's axis, an open field's
heading), so ``S`` still sees them. Unlike the covariance ``s2 H^-1``, ``S`` does not shrink with
the number of points or with the residuals: a clean synthetic tunnel has tiny residuals and so a
tiny covariance along its axis, but a weakest constraint near 0.

**Only surfaces count.** A row's normal is the target surface's only where the voxel's
neighbourhood is a patch of surface. Where it is one scan line (a ring of a sparse lidar beyond
the distance between rings, the edge of the field of view) PCA finds the line, not the surface:
the "normal" is any direction across the line, and such lines move with the sensor. At the
zero-motion alignment each ring of the scan lies on its twin in the keyframe, and the arbitrary
normals of rings crossing a tunnel ahead of the vehicle add a constraint along the tunnel that
the world does not have (VLP-16 tunnel, held-out seed 41: 0.0068-0.0079 at the wrong zero-motion
results, trusted, 2-10 m off, against 0.0020-0.0046 at the truth). So each row is weighted by the
**planarity** of its target voxel's neighbourhood, ``(s2 - s3) / s1`` for the singular values
``s1 >= s2 >= s3`` of the neighbourhood's spread (the neighbourhood of its normal): about 1 on a
sampled surface, about 0 on a line or a blob. With the weights the same tunnel pairs measure
0.0007-0.0029 and streets of the held-out town 0.035-0.16 (plain 0.012-0.07).

``RegistrationConfig.min_constraint`` is the threshold below which a result is not trusted.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Degeneracy:
    """The weakest direction of a registration result (see the module text)."""

    eigenvalue: float  # weakest constraint, 0 (free) .. about 1
    direction: np.ndarray  # (6,) unit [tx, ty, tz, rx, ry, rz]: the weakest translation (rotation part 0)
    eigenvalues: np.ndarray  # (3,) of the translation's Schur complement, ascending
    num_points: int  # matched points the matrix is built from

    def describe(self) -> str:
        """The weakest direction in words: mostly a translation along, or a rotation about, an axis
        (target frame)."""
        t, r = self.direction[:3], self.direction[3:]
        kind, axis = ("translation along", t) if t @ t >= r @ r else ("rotation about", r)
        axis = axis / max(float(np.linalg.norm(axis)), 1e-12)
        axis = axis if axis[np.argmax(np.abs(axis))] > 0 else -axis
        return f"{kind} ({axis[0]:.2f}, {axis[1]:.2f}, {axis[2]:.2f})"

    def to_dict(self) -> dict:
        return {"weakest_constraint": self.eigenvalue, "weakest_direction": self.direction.tolist(),
                "eigenvalues": self.eigenvalues.tolist(), "num_points": self.num_points,
                "weakest": self.describe()}


def surface_planarity(xyz: np.ndarray, radius: float, max_nn: int = 30) -> np.ndarray:
    """``(M,)`` planarity in [0, 1] of each of the ``(M, 3)`` voxels' neighbourhoods (its
    ``max_nn`` nearest within ``radius``: the neighbourhood its normal is estimated from):
    ``(s2 - s3) / s1`` for the square roots ``s1 >= s2 >= s3`` of the eigenvalues of the
    neighbourhood's covariance; 0 where a neighbourhood has no spread (module text)."""
    import open3d as o3d

    pcd = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(np.asarray(xyz, np.float64)))
    pcd.estimate_covariances(o3d.geometry.KDTreeSearchParamHybrid(radius=radius, max_nn=max_nn))
    s = np.sqrt(np.maximum(np.linalg.eigvalsh(np.asarray(pcd.covariances)), 0.0))  # ascending
    with np.errstate(divide="ignore", invalid="ignore"):
        planarity = (s[:, 1] - s[:, 0]) / s[:, 2]
    return np.clip(np.nan_to_num(planarity, nan=0.0, posinf=0.0, neginf=0.0), 0.0, 1.0)


def weakest_direction(points: np.ndarray, normals: np.ndarray, weights: np.ndarray | None = None) -> Degeneracy:
    """The weakest constraint of point-to-plane alignment of ``(m, 3)`` matched points against
    surfaces with ``(m, 3)`` unit ``normals`` (module text), each row weighted by ``(m,)``
    ``weights`` (the target's planarity; None: all 1); fewer than 7 points or no weight:
    eigenvalue 0."""
    m = len(points)
    w = np.ones(m) if weights is None else np.asarray(weights, np.float64)
    if m < 7 or not w.sum() > 0:
        return Degeneracy(0.0, np.zeros(6), np.zeros(3), m)
    p = np.asarray(points, np.float64)
    n = np.asarray(normals, np.float64)
    centred = p - np.average(p, axis=0, weights=w)
    length = max(float(np.sqrt(np.average(np.einsum("ij,ij->i", centred, centred), weights=w))), 1e-9)
    J = np.hstack([n, np.cross(centred, n) / length])
    A = (J * w[:, None]).T @ J / w.sum()
    S = A[:3, :3] - A[:3, 3:] @ np.linalg.pinv(A[3:, 3:], rcond=1e-10, hermitian=True) @ A[3:, :3]
    lam, V = np.linalg.eigh((S + S.T) / 2)
    lam = np.maximum(lam, 0.0)
    return Degeneracy(float(lam[0]), np.concatenate([V[:, 0], np.zeros(3)]), lam, m)
