"""Open outdoor families on the tile grid: ``open_field`` and ``parking_lot``.

The vehicle drives along the tile borders. An open field is rolling ground with grass-clump
relief and almost nothing standing on it (a tree, a few bushes and rocks, now and then a fence),
so the ground plane dominates every scan. A parking lot is flat asphalt with rows of parked cars
facing the aisles, planted islands, lamp posts, and now and then a store building.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from s2h_ros.datasets.synthetic.primitives import MeshBuilder
from s2h_ros.datasets.synthetic.town import add_cars, add_tree

if TYPE_CHECKING:
    from s2h_ros.datasets.synthetic.scene import SyntheticWorld

_TRACK = 3.0  # metres kept free on each side of the tile borders (the tracks)


def build_open_field(world: SyntheticWorld, mb: MeshBuilder, rng: np.random.Generator, i: int, j: int) -> None:
    """Rolling grass with a sparse scatter of bushes, rocks, a tree and sometimes a fence."""
    p = world.pitch
    x0, y0 = i * p, j * p
    mb.add_heightfield(x0, x0 + p, y0, y0 + p, 1.0, world.ground_height, albedo=0.2)

    def spot() -> np.ndarray:
        xy = rng.uniform([x0 + _TRACK, y0 + _TRACK], [x0 + p - _TRACK, y0 + p - _TRACK])
        return np.append(xy, world.ground_height(xy[0], xy[1]))

    for _ in range(int(rng.poisson(2.0 * world.clutter))):
        mb.add_foliage(spot() + [0, 0, 0.4], rng.uniform(0.4, 1.2, 3) * [1.2, 1.2, 0.7], rng, n_leaves=50,
                       leaf_size=0.3, albedo=0.22)
    for _ in range(int(rng.poisson(1.5 * world.clutter))):
        size = rng.uniform(0.3, 1.0, 3)
        mb.add_boxes([spot() + [0, 0, 0.25 * size[2]]], [size], rng.uniform(0, np.pi), 0.35)
    if rng.uniform() < 0.3 * world.clutter:
        add_tree(mb, rng, spot())
    if rng.uniform() < 0.1:  # a post-and-wire fence parallel to one tile border
        along_x = rng.uniform() < 0.5
        t = np.arange(x0 + _TRACK, x0 + p - _TRACK, 3.0) if along_x else np.arange(y0 + _TRACK, y0 + p - _TRACK, 3.0)
        c = float((y0 if along_x else x0) + _TRACK + rng.uniform(0.0, 2.0))
        xy = np.column_stack([t, np.full(len(t), c)] if along_x else [np.full(len(t), c), t])
        g = world.ground_height(xy[:, 0], xy[:, 1])
        mb.add_cylinders(np.column_stack([xy, g]), 0.06, 1.2, albedo=0.35, sides=6)
        mid = np.array([x0 + p / 2, c] if along_x else [c, y0 + p / 2])
        length = len(t) * 3.0
        for h in (0.6, 1.05):
            mb.add_boxes([[*mid, float(world.ground_height(*mid)) + h]],
                         [[length, 0.02, 0.02] if along_x else [0.02, length, 0.02]], 0.0, 0.4)


def build_parking_lot(world: SyntheticWorld, mb: MeshBuilder, rng: np.random.Generator, i: int, j: int) -> None:
    """One lot section between four aisles: stall rows facing the aisles, a middle row or island."""
    p, w = world.pitch, world.road_half_width
    x0, y0 = i * p, j * p
    ground = world.ground_height
    mb.add_heightfield(x0, x0 + p, y0, y0 + p, 2.0, ground, albedo=0.12)
    if rng.uniform() < world.building_p:  # a store filling the section
        side = p - 2 * w - 4.0
        h = float(rng.uniform(5.0, 12.0))
        c = np.array([x0 + p / 2, y0 + p / 2])
        mb.add_boxes([[*c, float(ground(*c)) + h / 2 - 0.5]], [[side, side, h + 1.0]], 0.0, rng.uniform(0.3, 0.7))
        return
    along_x = rng.uniform() < 0.5  # rows run along x (cars face +-y) or along y
    stall = float(rng.uniform(2.4, 2.8))
    fill = float(rng.uniform(*world.occupancy))
    u = np.arange(w + 1.0 + stall / 2, p - w - 1.0, stall)
    inner = p - 2 * w - 11.0  # width left between the two edge rows
    rows = [w + 2.8, p - w - 2.8]
    if inner >= 20.0:  # a double row back to back in the middle, facing inner aisles
        rows += [p / 2 - 2.6, p / 2 + 2.6]
    else:  # a planted island with a curb
        c = np.array([x0 + p / 2, y0 + p / 2])
        size = [p - 2 * w - 6.0, 2.0, 0.15] if along_x else [2.0, p - 2 * w - 6.0, 0.15]
        mb.add_boxes([[*c, float(ground(*c)) + 0.07]], [size], 0.0, 0.35)
        for t in u[1:-1:3]:
            xy = np.array([x0 + t, y0 + p / 2] if along_x else [x0 + p / 2, y0 + t])
            add_tree(mb, rng, np.append(xy, ground(*xy) + 0.15))
    for v in rows:
        keep = u[rng.uniform(size=len(u)) < fill]
        xy = np.column_stack([x0 + keep, np.full(len(keep), y0 + v)] if along_x
                             else [np.full(len(keep), x0 + v), y0 + keep])
        xy = xy + rng.normal(0, 0.12, xy.shape)
        yaw = (np.pi / 2 if along_x else 0.0) + rng.normal(0, 0.04, len(xy)) + np.pi * rng.integers(0, 2, len(xy))
        add_cars(mb, xy, yaw, ground(xy[:, 0], xy[:, 1]), rng)
    lamps = u[1::max(1, int(round(20.0 / stall)))]
    lv = p / 2 if len(rows) == 2 else w + 5.6
    xy = np.column_stack([x0 + lamps, np.full(len(lamps), y0 + lv)] if along_x
                         else [np.full(len(lamps), x0 + lv), y0 + lamps])
    mb.add_cylinders(np.column_stack([xy, ground(xy[:, 0], xy[:, 1])]), 0.15, rng.uniform(7.0, 10.0, len(xy)),
                     albedo=0.4)
