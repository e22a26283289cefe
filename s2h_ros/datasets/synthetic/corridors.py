"""Line-shaped families along one road axis (``world.centerline``): ``tunnel`` and ``highway``.

Tiles are ``pitch`` long along x; the axis runs through the row of tiles j = 0, and tile i holds
the stretch x in [i pitch, (i + 1) pitch] (cross-sections at the tile ends coincide, so the
stretches join without gaps). Anything repeated along the road (lamps, fans, gantries) sits on a
world-wide lattice of x, so it does not depend on which tiles are built.

A tunnel is a closed tube (arched or boxed, with raised walkways) whose walls are parallel to the
axis: apart from its few lamps and jet fans, nothing pins a translation along it, which is what
the family is for (degenerate geometry). A highway is a wide road with a median barrier, guard
rails, lamp posts, sign gantries, stretches of noise wall, and few buildings or trees beyond.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from s2h_ros.datasets.synthetic.primitives import MeshBuilder
from s2h_ros.datasets.synthetic.town import add_tree

if TYPE_CHECKING:
    from s2h_ros.datasets.synthetic.scene import SyntheticWorld

_STEP = 2.0  # metres between cross-sections


def _stretch(world: SyntheticWorld, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Abscissae, axis points and left normals of tile i's stretch of road."""
    x0 = i * world.pitch
    x = np.linspace(x0, x0 + world.pitch, int(round(world.pitch / _STEP)) + 1)
    axis, left = world.centerline.frame(x)
    return x, axis, left


def _lattice(x0: float, x1: float, spacing: float, phase: float) -> np.ndarray:
    """Positions phase + n spacing inside [x0, x1)."""
    if spacing <= 0:
        return np.zeros(0)
    n = np.arange(np.ceil((x0 - phase) / spacing), np.ceil((x1 - phase) / spacing))
    return phase + n * spacing


def _at(world: SyntheticWorld, x: np.ndarray, lateral: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
    """(K, 2) points ``lateral`` m left of the axis at abscissae x, and the axis heading there."""
    axis, left = world.centerline.frame(x)
    yaw = np.arctan2(-left[:, 0], left[:, 1])
    return axis + np.asarray(lateral, np.float64).reshape(-1, 1) * left, yaw


def tunnel_profile(world: SyntheticWorld) -> np.ndarray:
    """(M, 2) closed cross-section (lateral, height): walkways, walls and an arch or flat roof."""
    half, (ww, wh), wall = world.tube_width / 2, world.walkway, world.wall_height
    floor = np.linspace(-half + ww, half - ww, 7)
    pts = [[-half, wh], [-half + ww, wh], *[[v, 0.0] for v in floor], [half - ww, wh], [half, wh], [half, wall]]
    if world.tube == "arch":
        ang = np.linspace(0.0, np.pi, 15)[1:-1]
        pts += list(np.column_stack([half * np.cos(ang), wall + world.arch_rise * np.sin(ang)]))
    pts.append([-half, wall])
    return np.asarray(pts, np.float64)


def tunnel_top(world: SyntheticWorld) -> float:
    """Height of the tunnel's crown above the road."""
    return world.wall_height + (world.arch_rise if world.tube == "arch" else 0.0)


def build_tunnel(world: SyntheticWorld, mb: MeshBuilder, rng: np.random.Generator, i: int, j: int) -> None:
    """Tile i of the tube (only tiles j = 0 hold anything): shell, wall lamps, jet fans."""
    if j != 0:
        return
    x, axis, left = _stretch(world, i)
    mb.add_sweep(axis, left, tunnel_profile(world), closed=True, albedo=float(rng.uniform(0.3, 0.6)))
    half, wall = world.tube_width / 2, world.wall_height
    lamps = _lattice(x[0], x[-1], world.lamp_spacing, 0.37 * world.lamp_spacing)
    for side in (-1.0, 1.0):
        xy, yaw = _at(world, lamps, side * (half - 0.12))
        mb.add_boxes(np.column_stack([xy, np.full(len(xy), wall - 0.4)]), [[0.8, 0.2, 0.12]], yaw, 0.8)
    fans = _lattice(x[0], x[-1], world.fan_spacing, 0.5 * world.fan_spacing)
    for side in (-1.0, 1.0):
        xy, yaw = _at(world, fans, side * 1.4)
        mb.add_boxes(np.column_stack([xy, np.full(len(xy), tunnel_top(world) - 0.9)]), [[3.5, 1.0, 1.0]], yaw, 0.4)


def build_highway(world: SyntheticWorld, mb: MeshBuilder, rng: np.random.Generator, i: int, j: int) -> None:
    """Ground everywhere; on tiles j = 0 the road with its barriers, rails, lamps and gantries."""
    p = world.pitch
    x0, y0 = i * p, j * p
    mb.add_heightfield(x0, x0 + p, y0, y0 + p, 2.0, world.ground_height, albedo=0.25)  # grass
    half = world.road_half_width
    if j == 0:
        x, axis, left = _stretch(world, i)
        road = np.column_stack([np.linspace(-half, half, 9), np.full(9, 0.02)])
        mb.add_sweep(axis, left, road, world.ground_height, albedo=0.12)
        barrier = [[-0.3, 0.0], [-0.12, 0.25], [-0.1, 0.82], [0.1, 0.82], [0.12, 0.25], [0.3, 0.0]]
        mb.add_sweep(axis, left, barrier, world.ground_height, albedo=0.5)
        for side in (-1.0, 1.0):  # guard rails on posts at both road edges
            v = side * (half + 0.4)
            mb.add_sweep(axis, left, [[v, 0.45], [v, 0.75]], world.ground_height, albedo=0.6)
            posts = _lattice(x[0], x[-1], 4.0, 0.0)
            xy, yaw = _at(world, posts, v + side * 0.1)
            mb.add_boxes(np.column_stack([xy, world.ground_height(xy[:, 0], xy[:, 1]) + 0.4]), [[0.12, 0.12, 0.8]],
                         yaw, 0.5)
        lamps = _lattice(x[0], x[-1], world.lamp_spacing, 0.21 * world.lamp_spacing)
        if len(lamps):
            xy, yaw = _at(world, lamps, 0.0)
            g = world.ground_height(xy[:, 0], xy[:, 1]) + 0.82
            mb.add_cylinders(np.column_stack([xy, g]), 0.12, 10.0, albedo=0.4)
            mb.add_boxes(np.column_stack([xy, g + 9.8]), [[0.3, 5.0, 0.2]], yaw, 0.5)
        for xg in _lattice(x[0], x[-1], world.gantry_spacing, 0.63 * world.gantry_spacing):
            xy, yaw = _at(world, np.array([xg, xg]), np.array([-half - 1.5, half + 1.5]))
            g = world.ground_height(xy[:, 0], xy[:, 1])
            mb.add_boxes(np.column_stack([xy, g + 3.6]), [[0.5, 0.5, 7.2]], yaw, 0.5)
            mid, top = xy.mean(0), float(g.max()) + 7.0
            mb.add_boxes([[*mid, top]], [[0.6, 2 * half + 3.0, 0.6]], yaw[0], 0.5)
            for v in rng.uniform(-half + 2.0, half - 2.0, int(rng.integers(1, 4))):
                c = mid + v * np.array([-np.sin(yaw[0]), np.cos(yaw[0])])
                mb.add_boxes([[*c, top - 1.3]], [[0.1, rng.uniform(3.0, 6.0), 2.2]], yaw[0], 0.9)
        for side in (-1.0, 1.0):
            if rng.uniform() < world.noise_wall_p:
                h = float(rng.uniform(3.0, 5.0))
                v = side * (half + 2.5)
                mb.add_sweep(axis, left, [[v, -0.5], [v, h]], world.ground_height, albedo=0.45)
    # Beyond the road: a few trees and, rarely, a building, at least 12 m off the road edge.
    for _ in range(int(rng.integers(0, 8))):
        xy = np.array([rng.uniform(x0, x0 + p), rng.uniform(y0, y0 + p)])
        if abs(xy[1] - world.centerline.y(xy[0])) > half + 12.0:
            add_tree(mb, rng, np.append(xy, world.ground_height(xy[0], xy[1])))
    if rng.uniform() < world.building_p:
        xy = np.array([rng.uniform(x0 + 15, x0 + p - 15), rng.uniform(y0 + 15, y0 + p - 15)])
        if abs(xy[1] - world.centerline.y(xy[0])) > half + 25.0:
            size = rng.uniform([10.0, 10.0, 5.0], [40.0, 25.0, 14.0])
            mb.add_boxes([[*xy, float(world.ground_height(*xy)) + size[2] / 2 - 0.5]], [size + [0, 0, 1.0]],
                         rng.uniform(0, np.pi), rng.uniform(0.2, 0.6))
