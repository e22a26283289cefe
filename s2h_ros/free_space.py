"""Free space: whether a result lays the scan's structure where the target's sensor saw through.

A return at range r along a ray says the space along that ray up to r is empty. A result that
puts a surface of the source scan in that ray's direction clearly nearer than r contradicts the
target's own observation: the target's sensor would have seen that surface. Right results do
not do that, whatever the overlap (a pair that shares little leaves most of the source where the
target saw nothing, or behind what it saw); wrong ones that the ground, rows of cars or facades
running the same way carry past the other tests do (s2h_ros.pipeline, ``max_free_space``).

The target's view is a spherical range image of its voxels seen from its frame's origin (the
sensor of one sweep: a raw lidar scan, a depth image, a deskewed sweep), each cell holding its
nearest return, then the nearest of its neighbours too: a source voxel at the edge of an object
whose cell's rays all passed just beside it is not counted as seen through. A fused map or a
fragment built from many viewpoints has no such single view: switch the test off for those.

Written here because no maintained library does it on point clouds: Open3D's ``RaycastingScene``
casts rays against a mesh, and the test needs only the nearest return per direction (a few numpy
operations and scipy's minimum filter).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.ndimage import minimum_filter

# Cell size of the range image: about the ring spacing of a 32-beam lidar; a 16-beam one's empty
# rows in between are unknown, not free. A cell spans 1.7 cm per metre of range across.
RANGE_IMAGE_CELL_DEG = 1.0
# A surface counts as seen through when the target's nearest return in its direction (and the
# neighbouring directions) lies this much beyond it: the inlier distance plus this much per metre
# of range (a cell's width at a grazing angle, the voxel's offset from the surface).
THROUGH_MARGIN_PER_M = 0.02


@dataclass(frozen=True)
class FreeSpace:
    """How much of a result's source structure lies where the target's sensor saw through."""

    through: float  # fraction of the seen voxels that lie in the target's free space
    seen: int  # source voxels in directions the target's sensor saw (a return there or next to it)

    def to_dict(self) -> dict:
        return {"through": self.through, "seen": self.seen}


def _cells(xyz: np.ndarray, cell_deg: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[int, int]]:
    """Range ``(N,)``, azimuth and elevation cell indices ``(N,)`` of points ``(N, 3)`` seen from
    the origin, and the image's shape (azimuth, elevation)."""
    r = np.linalg.norm(xyz, axis=1)
    azimuth = np.degrees(np.arctan2(xyz[:, 1], xyz[:, 0])) + 180.0
    elevation = np.degrees(np.arcsin(np.clip(xyz[:, 2] / np.maximum(r, 1e-9), -1.0, 1.0))) + 90.0
    shape = (int(np.ceil(360.0 / cell_deg)), int(np.ceil(180.0 / cell_deg)))
    ia = np.minimum((azimuth / cell_deg).astype(np.int64), shape[0] - 1)
    ie = np.minimum((elevation / cell_deg).astype(np.int64), shape[1] - 1)
    return r, ia, ie, shape


def range_image(xyz: np.ndarray, cell_deg: float = RANGE_IMAGE_CELL_DEG) -> np.ndarray:
    """``(360 / cell_deg, 180 / cell_deg)`` float64: the nearest return of ``xyz`` ``(N, 3)`` (the
    sensor's frame, sensor at the origin) per azimuth x elevation cell, then the nearest over each
    cell and its eight neighbours (azimuth wraps around); inf where no ray returned."""
    r, ia, ie, shape = _cells(np.asarray(xyz, np.float64), cell_deg)
    nearest = np.full(shape, np.inf)
    np.minimum.at(nearest, (ia, ie), r)
    return minimum_filter(nearest, size=3, mode=("wrap", "nearest"))


def free_space(points: np.ndarray, image: np.ndarray, inlier_distance: float,
               cell_deg: float = RANGE_IMAGE_CELL_DEG) -> FreeSpace:
    """Of ``points`` ``(M, 3)`` (source voxels moved into the target sensor's frame by a result),
    those in directions the target saw (``image``: ``range_image`` of the target), and the
    fraction of them nearer than the target's nearest return there by more than
    ``inlier_distance`` plus ``THROUGH_MARGIN_PER_M`` per metre: surfaces where its rays passed."""
    r, ia, ie, _ = _cells(np.asarray(points, np.float64), cell_deg)
    nearest = image[ia, ie]
    seen = np.isfinite(nearest)
    through = seen & (nearest > r + inlier_distance + THROUGH_MARGIN_PER_M * r)
    n_seen = int(seen.sum())
    return FreeSpace(through=float(through.sum() / n_seen) if n_seen else 0.0, seen=n_seen)
