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
surface faces ``d`` and 0 when none does. Its smallest eigenvalue is the **constraint of the weakest
direction**, and its eigenvector that direction. Unlike the covariance ``s2 H^-1``, it does not
shrink with the number of points or with the residuals: a clean synthetic tunnel has tiny residuals
and so a tiny covariance along its axis, but a weakest constraint near 0.

``RegistrationConfig.min_constraint`` is the threshold below which a result is not trusted.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Degeneracy:
    """The weakest direction of a registration result (see the module text)."""

    eigenvalue: float  # weakest constraint, 0 (free) .. about 1
    direction: np.ndarray  # (6,) unit eigenvector [tx, ty, tz, rx, ry, rz] (rotation about the centroid, x L)
    eigenvalues: np.ndarray  # (6,) all of them, ascending
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


def weakest_direction(points: np.ndarray, normals: np.ndarray) -> Degeneracy:
    """The weakest constraint of point-to-plane alignment of ``(m, 3)`` matched points against
    surfaces with ``(m, 3)`` unit ``normals`` (module text); fewer than 7 points: eigenvalue 0."""
    m = len(points)
    if m < 7:
        return Degeneracy(0.0, np.zeros(6), np.zeros(6), m)
    p = np.asarray(points, np.float64)
    n = np.asarray(normals, np.float64)
    centred = p - p.mean(axis=0)
    length = max(float(np.sqrt(np.mean(np.einsum("ij,ij->i", centred, centred)))), 1e-9)
    J = np.hstack([n, np.cross(centred, n) / length])
    lam, V = np.linalg.eigh(J.T @ J / m)
    lam = np.maximum(lam, 0.0)
    return Degeneracy(float(lam[0]), V[:, 0].copy(), lam, m)
