"""Gravity from the ground: the up direction of a cloud whose sensor is tilted, and the rotation
that levels it.

Learned features are not rotation invariant. The shipped FCGF was trained on clouds tilted by at
most a few degrees, and its matches fade beyond about 20 deg: held-out OS1-64 town pairs with the
source tilted by 30 deg keep their pose but lose most inlier matches, at 45 deg 3 of 8 are lost.
Handheld rigs, robots on slopes and sensors mounted at an angle give exactly such clouds (the real
Newer College OS1-64 scans here are 17-27 deg from level, and two of them 41 deg apart).

A cloud's ground says where up is: along the true up, the ground is one thin dense slab of points
below the sensor; along any other direction it smears over many heights. :func:`ground_up` looks
for the direction, within ``MAX_TILT_DEG`` (45) of the sensor's z, whose densest slab (below the sensor,
within ``GROUND_BELOW`` metres) holds the most points, refines it by a few local steps, and fits the
slab's plane. Features are then computed on the cloud turned by :func:`levelling_rotation`, which
takes that up to z without turning the heading more than the tilt requires.

Why by hand: no maintained library here estimates gravity from a single point cloud without an
IMU (Open3D's ``segment_plane`` finds the largest plane, which in a street canyon or a room is as
often a wall as the floor, and takes no prior on where up lies); what is written here is a
histogram of heights over a cap of directions and one SVD (the levelling turn itself is SciPy's).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from s2h_ros.geometry import fixed_subset

GROUND_BELOW = (-5.0, -0.1)  # metres along up: where the ground may lie relative to the sensor
SLAB = 0.2  # metres: the histogram bin; the ground slab is two bins
MAX_POINTS = 3000  # points sampled (fixed seed) for the search; the ground is a large share of any scan
COARSE_DIRECTIONS = 200  # directions on the cap for the first search (about 5.5 deg apart over 45 deg)
MIN_SLAB_SHARE = 0.08  # a ground holding fewer of the points is no ground: the cloud is left as given
MAX_TILT_DEG = 45.0  # the cap searched around the sensor's z
REACH_DEG = 5.0  # how far beyond the cap the refinement may take the up before it is given up


@dataclass(frozen=True)
class Up:
    """Where a cloud's ground says up is."""

    direction: np.ndarray  # (3,) float64 unit vector in the cloud's frame (z when no ground was found)
    tilt_deg: float  # angle between direction and the cloud's z
    share: float  # fraction of the sampled points in the ground slab (0 when none was found)
    height: float  # metres: the ground's height along direction, relative to the origin (0 when none)

    @property
    def found(self) -> bool:
        return self.share > 0.0


def cap_directions(max_tilt_deg: float, n: int) -> np.ndarray:
    """``(n, 3)`` unit vectors spread evenly (Fibonacci spiral) over the cap within
    ``max_tilt_deg`` of +z, the first one nearest z."""
    i = np.arange(n) + 0.5
    z = 1.0 - i / n * (1.0 - np.cos(np.radians(max_tilt_deg)))
    phi = i * np.pi * (3.0 - np.sqrt(5.0))
    r = np.sqrt(np.clip(1.0 - z * z, 0.0, None))
    return np.column_stack([r * np.cos(phi), r * np.sin(phi), z])


def ground_slabs(xyz: np.ndarray, directions: np.ndarray, width: float = SLAB,
                 below: tuple[float, float] = GROUND_BELOW) -> tuple[np.ndarray, np.ndarray]:
    """For each of ``directions (D, 3)``: the largest share of ``xyz (N, 3)`` within one slab of
    height ``2 width`` whose heights along the direction lie in ``below``, and that slab's middle
    height. ``(D,)`` float64 each."""
    lo, hi = below
    bins = int(np.ceil((hi - lo) / width))
    # Per direction bins + 2 counters: one below the slab range, the bins, one above (counted and
    # dropped, cheaper than masking the (N, D) heights outside it).
    index = np.floor((xyz @ directions.T - lo) / width)  # (N, D)
    np.clip(index, -1, bins, out=index)
    index = index.astype(np.int64) + 1 + np.arange(len(directions)) * (bins + 2)
    counts = np.bincount(index.ravel(), minlength=len(directions) * (bins + 2))
    counts = counts.reshape(len(directions), bins + 2)[:, 1:-1]
    pairs = counts[:, :-1] + counts[:, 1:]
    best = pairs.argmax(1)
    return pairs[np.arange(len(directions)), best] / len(xyz), lo + (best + 1) * width


def _around(up: np.ndarray, step_deg: float) -> np.ndarray:
    """``up`` and its 8 neighbours ``step_deg`` away (a 3 x 3 grid in the plane normal to it)."""
    a = np.cross(up, [1.0, 0.0, 0.0] if abs(up[0]) < 0.9 else [0.0, 1.0, 0.0])
    a /= np.linalg.norm(a)
    b = np.cross(up, a)
    t = np.tan(np.radians(step_deg))
    grid = [up + t * (i * a + j * b) for i in (0, -1, 1) for j in (0, -1, 1)]
    return np.array([g / np.linalg.norm(g) for g in grid])


def ground_up(xyz: np.ndarray, max_tilt_deg: float = MAX_TILT_DEG) -> Up:
    """The up direction of ``xyz (N, 3)`` (sensor frame, metres, roughly z up): the normal of its
    ground, the densest slab below the sensor, searched within ``max_tilt_deg`` of z.
    ``Up.found`` is False (direction z) when no slab holds ``MIN_SLAB_SHARE`` of the points, or
    when the slab's plane lies more than ``REACH_DEG`` beyond the cap: a cloud whose z is far from
    up (a camera's optical frame, a 3DMatch fragment) has no ground there, only whatever surface
    leans toward the cap's edge, and is left as given."""
    xyz = np.asarray(xyz, dtype=np.float64)
    if len(xyz) > MAX_POINTS:
        xyz = xyz[fixed_subset(len(xyz), MAX_POINTS)]
    none = Up(np.array([0.0, 0.0, 1.0]), 0.0, 0.0, 0.0)
    if len(xyz) < 10:
        return none
    directions = cap_directions(max_tilt_deg, COARSE_DIRECTIONS)
    share, _ = ground_slabs(xyz, directions)
    up = directions[int(share.argmax())]
    for step in (2.0, 0.7):  # local refinement: move while a neighbour holds more
        for _ in range(6):
            around = _around(up, step)
            share_around, _ = ground_slabs(xyz, around, width=SLAB / 2)
            if share_around.argmax() == 0:
                break
            up = around[int(share_around.argmax())]
    share_at, height = ground_slabs(xyz, up[None], width=SLAB / 2)
    if share_at[0] < MIN_SLAB_SHARE:
        return none
    slab = xyz[np.abs(xyz @ up - height[0]) < SLAB]
    centred = slab - slab.mean(0)
    normal = np.linalg.svd(centred, full_matrices=False)[2][2]
    normal = normal if normal @ up > 0 else -normal
    if np.degrees(np.arccos(np.clip(normal @ up, -1.0, 1.0))) > 5.0:  # the slab is no plane: keep the search's
        normal = up
    tilt = float(np.degrees(np.arccos(np.clip(normal[2], -1.0, 1.0))))
    if tilt > max_tilt_deg + REACH_DEG:
        return none
    return Up(normal, tilt, float(share_at[0]), float(slab.mean(0) @ normal))


def levelling_rotation(up: np.ndarray) -> np.ndarray:
    """``(3, 3)`` float64 rotation ``R`` with ``R @ up = z``: the smallest turn that does it (SciPy's
    ``align_vectors`` for one pair), so a cloud's heading changes no more than its tilt requires."""
    from scipy.spatial.transform import Rotation

    up = np.asarray(up, dtype=np.float64) / np.linalg.norm(up)
    return Rotation.align_vectors([[0.0, 0.0, 1.0]], [up])[0].as_matrix()
