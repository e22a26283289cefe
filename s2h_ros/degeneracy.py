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

**A slide the sensor's pattern hides.** Between that threshold and ``weak_constraint`` the
measure cannot tell a 16-beam slide from the truth: on a highway of guardrails, verges and a few
poles, the zero-motion result of a scan 2-7 m on (the rings on the road and on the rails lie on
their twins) measured 0.0078-0.0097, the truth 0.0085-0.015, right trusted results elsewhere from
0.0075 (development worlds, never used for evaluation). What does tell is the structure that
would show the slide: the voxels off the ground that are **not extended along the weakest
direction** ``d`` (poles, sign posts, the ends of walls: no other structure voxel within half the
inlier distance ``D`` of their copies ``2 D`` ahead and behind along ``d``). A guardrail or a wall
along the road is extended along it and fits under any slide; a pole fits only where it is. The
**slide evidence** of a result is the profile of those voxels along ``d``: the fraction of them
that land within ``D / 2`` (as ``fitness_fine``) of the keyframe's structure when moved by ``s``
along ``d``, for ``s`` every ``D / 4`` up to ``SLIDE_SHIFT_RANGE`` inlier distances either way,
counted in 3-D and in plan (x, y only: a pole's voxels sit at the heights where the sparse rings
hit it, different in each scan). A right result is the profile's peak; a slide is not: its
structure fits clearly better (by ``slide_margin``) at some other position at least ``D / 2``
away, and that position is where the truth is. Comparing positions, not an absolute fraction,
keeps what a viewpoint change hides (structure the keyframe did not see) out of the decision: it
hides it at every position alike. A result off sideways as well fits that structure nowhere
along ``d``, so at least ``MIN_SLIDE_FIT`` of it must also lie within ``D`` where the result is.
On development worlds (VLP-16, OS1-64 and Livox highways and parking lots) the best other
position gained -0.13 to 0.00 at right results and +0.14 to +0.79 at slides of 0.7-9.9 m, each
found within 0.5 m of its true offset; slides of about ``D / 2`` (0.3 m) are within the test's
blur. The ground is the lowest layer of each plan cell (``above_ground``, z up), not a normal
test: PCA on a single ring on the road gives any normal.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from s2h_ros import geometry

# The ground for the slide test: the voxels within half the inlier distance of the lowest one in
# their plan cell of GROUND_CELL_DISTANCES inlier distances (1.8 m at the outdoor 0.6 m).
GROUND_CELL_DISTANCES = 3.0
# A structure voxel is extended along d when a copy SLIDE_SHIFT_DISTANCES inlier distances ahead or
# behind lands within half the inlier distance of another one.
SLIDE_SHIFT_DISTANCES = 2.0
# Fewer structure voxels not extended along d than this: nothing in the scene would show the slide.
MIN_SLIDE_STRUCTURES = 10
# Less than this fraction of them within the inlier distance of the keyframe's structure at the
# result: the result is not where that structure says (development worlds: right results
# 0.47-0.89; a global result 1.3 m off sideways and 10.4 m along the road, trusted without this, 0.04).
MIN_SLIDE_FIT = 0.2
# The profile is counted over at most this many of them (a fixed-seed subset), at every quarter
# inlier distance up to SLIDE_SHIFT_RANGE inlier distances either way (30 m outdoors: the slides
# seen were 1-22 m).
SLIDE_POINTS = 1000
SLIDE_SHIFT_RANGE = 50.0


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


@dataclass
class SlideEvidence:
    """Where along the weakest direction the structure that would show a slide fits (module text)."""

    at_result: float  # fraction of those voxels of the scan within D / 2 of the keyframe's structure, at the result
    best: float  # the same, at the best position at least D / 2 along d from the result
    shift: float  # metres along d (target frame) from the result to that position
    structures: int  # how many voxels the fractions are over
    in_plan: bool  # counted in plan (x, y), not in 3-D
    fits: float = 0.0  # fraction of them within D of the keyframe's structure at the result (the higher view)
    # the same as best, at the best position at least SLIDE_SHIFT_DISTANCES inlier distances from
    # the best one (same view): another peak, e.g. the next of evenly spaced poles
    elsewhere: float = 0.0

    @property
    def gain(self) -> float:
        """How much better the structure fits at the best other position than at the result."""
        return self.best - self.at_result

    @property
    def peak_margin(self) -> float:
        """How much better the structure fits at the best other position than anywhere clearly apart
        from it: how much that position stands out as the one where the structure fits."""
        return self.best - self.elsewhere

    def to_dict(self) -> dict:
        return {"at_result": self.at_result, "best": self.best, "shift_m": self.shift, "structures": self.structures,
                "in_plan": self.in_plan, "fits": self.fits, "elsewhere": self.elsewhere}


def above_ground(xyz: np.ndarray, cell: float, height: float) -> np.ndarray:
    """``(N,)`` bool: the ``(N, 3)`` points more than ``height`` above the lowest point of their plan
    cell (``cell`` metres square in x, y; z up): structure, not the ground under it."""
    keys = np.floor(np.asarray(xyz)[:, :2] / cell).astype(np.int64)
    _, cells = np.unique(keys, axis=0, return_inverse=True)
    cells = cells.reshape(-1)
    lowest = np.full(int(cells.max()) + 1 if len(cells) else 0, np.inf)
    np.minimum.at(lowest, cells, xyz[:, 2])
    return xyz[:, 2] - lowest[cells] > height


def _not_extended(points: np.ndarray, direction: np.ndarray, shift: float, radius: float) -> np.ndarray:
    """``(N,)`` bool: the ``(N, k)`` points whose copies ``shift`` ahead and behind along the unit
    ``direction`` have no point within ``radius``."""
    from scipy.spatial import cKDTree

    tree = cKDTree(points)
    ahead = np.isinf(tree.query(points + shift * direction, distance_upper_bound=radius)[0])
    behind = np.isinf(tree.query(points - shift * direction, distance_upper_bound=radius)[0])
    return ahead & behind


def _slide_profile(points: np.ndarray, target_tree, direction: np.ndarray, shifts: np.ndarray,
                   distance: float) -> np.ndarray:
    """``(S,)`` the fraction of the ``(n, k)`` ``points`` within ``distance`` of a target point (its
    k-dimensional cKDTree ``target_tree``) when moved by each of ``shifts`` (S,) along the unit
    ``direction`` (k,)."""
    moved = points[None, :, :] + shifts[:, None, None] * direction
    near = target_tree.query(moved.reshape(-1, points.shape[1]), distance_upper_bound=distance)[0] < distance
    return near.reshape(len(shifts), len(points)).mean(axis=1)


def _plateau_middle(f: np.ndarray, shifts: np.ndarray, k: int) -> float:
    """The middle of the run of equal values of ``f`` around its peak ``k``: a structure fits within
    the inlier distance over a range of shifts, and the peak is the middle of that range."""
    lo = hi = k
    while lo > 0 and f[lo - 1] == f[k]:
        lo -= 1
    while hi < len(f) - 1 and f[hi + 1] == f[k]:
        hi += 1
    return float((shifts[lo] + shifts[hi]) / 2)


def slide_evidence(source: np.ndarray, target: np.ndarray, T: np.ndarray, direction: np.ndarray,
                   distance: float) -> SlideEvidence:
    """The slide evidence (module text) of the result ``T`` (4, 4), mapping the ``(N, 3)`` ``source``
    voxels onto the ``(M, 3)`` ``target`` voxels, along its weakest ``direction`` (3,) (a unit
    translation in the target frame), at the inlier ``distance``, for positions up to
    ``SLIDE_SHIFT_RANGE`` inlier distances along it: counted in 3-D and, when ``d`` is mostly
    horizontal, in plan; the count whose best other position gains most is returned."""
    from scipy.spatial import cKDTree

    source, target = np.asarray(source, np.float64), np.asarray(target, np.float64)
    direction = np.asarray(direction, np.float64)
    cell, height = GROUND_CELL_DISTANCES * distance, distance / 2
    structure = source[above_ground(source, cell, height)]
    target_structure = target[above_ground(target, cell, height)]
    none = SlideEvidence(0.0, 0.0, 0.0, 0, False)
    if len(structure) == 0 or len(target_structure) == 0:
        return none
    d_source = T[:3, :3].T @ direction  # the direction in the source frame
    moved = geometry.apply_transform(T, structure)
    tolerance = distance / 2  # as fitness_fine: a slide of about the inlier distance shows
    steps = np.floor(SLIDE_SHIFT_RANGE * distance / (tolerance / 2))
    shifts = np.arange(-steps, steps + 1) * (tolerance / 2)
    other = np.abs(shifts) >= tolerance
    views = [(False, slice(0, 3), d_source, direction)]
    horizontal = float(np.linalg.norm(d_source[:2]))
    if horizontal >= 0.7:  # a slide across the ground: its plan view too
        views.append((True, slice(0, 2), d_source[:2] / horizontal, direction[:2] / np.linalg.norm(direction[:2])))
    best, fits = none, 0.0
    for in_plan, axes, d_own, d_target in views:
        lone = _not_extended(structure[:, axes], d_own, SLIDE_SHIFT_DISTANCES * distance, distance / 2)
        points = moved[lone][:, axes]
        if len(points) > SLIDE_POINTS:  # a fixed-seed subset: the fractions are proportions
            points = points[geometry.fixed_subset(len(points), SLIDE_POINTS)]
        if len(points) == 0:
            continue
        tree = cKDTree(target_structure[:, axes])  # one per view, for both counts
        fits = max(fits, float(_slide_profile(points, tree, d_target, np.zeros(1), distance)[0]))
        f = _slide_profile(points, tree, d_target, shifts, tolerance)
        k = int(np.argmax(np.where(other, f, -1.0)))
        peak = _plateau_middle(f, shifts, k)
        apart = np.abs(shifts - peak) >= SLIDE_SHIFT_DISTANCES * distance
        here = SlideEvidence(float(f[len(shifts) // 2]), float(f[k]), peak, int(lone.sum()), in_plan,
                             elsewhere=float(f[apart].max()) if apart.any() else 0.0)
        if best.structures == 0 or here.gain > best.gain:
            best = here
    return dataclasses.replace(best, fits=fits)
