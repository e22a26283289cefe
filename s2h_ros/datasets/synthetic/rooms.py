"""Indoor tiles: the ``rooms`` family, ``office`` floors and ``warehouse`` halls.

Each tile is a room (or a bay of a hall) that the robot crosses along its two centre lines:
walls have doors in their middles, and furniture, desks or racks stay off those lines.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from s2h_ros.datasets.synthetic.primitives import MeshBuilder

if TYPE_CHECKING:
    from s2h_ros.datasets.synthetic.scene import SyntheticWorld


def build_room(world: SyntheticWorld, mb: MeshBuilder, rng: np.random.Generator, i: int, j: int,
               furnish=None) -> None:
    """One room: floor, ceiling, its west and south walls (with doors at their centres), furniture."""
    p, H = world.pitch, world.room_height
    x0, y0 = i * p, j * p
    mb.add_boxes([[x0 + p / 2, y0 + p / 2, -0.05]], [[p, p, 0.1]], 0.0, 0.35)  # floor
    mb.add_boxes([[x0 + p / 2, y0 + p / 2, H + 0.05]], [[p, p, 0.1]], 0.0, 0.7)  # ceiling
    for wall in range(2):  # 0: west wall x = x0 (runs along y), 1: south wall y = y0 (runs along x)
        kind = rng.choice(["door", "wide", "open"], p=world.door_p)
        if kind == "open":
            continue
        door = float(rng.uniform(1.0, 1.6)) if kind == "door" else float(rng.uniform(2.5, 0.6 * p))
        seg = (p - door) / 2
        alb = float(rng.uniform(0.4, 0.8))
        for a, b in ((0.0, seg), (p - seg, p)):
            c = (a + b) / 2
            if wall == 0:
                mb.add_boxes([[x0, y0 + c, H / 2]], [[0.15, b - a, H]], 0.0, alb)
            else:
                mb.add_boxes([[x0 + c, y0, H / 2]], [[b - a, 0.15, H]], 0.0, alb)
        lintel = [x0, y0 + p / 2] if wall == 0 else [x0 + p / 2, y0]
        size = [0.15, door, H - 2.1] if wall == 0 else [door, 0.15, H - 2.1]
        mb.add_boxes([[*lintel, (H + 2.1) / 2]], [size], 0.0, alb)
    # Furniture in the four quadrants, off the centre cross (the driving lines) by 1 m.
    free = 1.0
    for qx in (0, 1):
        for qy in (0, 1):
            lo_x = x0 + (0.15 if qx == 0 else p / 2 + free)
            hi_x = x0 + (p / 2 - free if qx == 0 else p - 0.15)
            lo_y = y0 + (0.15 if qy == 0 else p / 2 + free)
            hi_y = y0 + (p / 2 - free if qy == 0 else p - 0.15)
            (furnish or _furnish)(mb, rng, lo_x, hi_x, lo_y, hi_y)
    if rng.uniform() < 0.3:  # a column at a room corner
        mb.add_cylinders([[x0 + 0.4, y0 + 0.4, 0.0]], 0.25, H, albedo=0.6, sides=12)


def _furnish(mb: MeshBuilder, rng: np.random.Generator, x0: float, x1: float, y0: float, y1: float) -> None:
    """Shelves, tables with legs and clutter, cabinets and plants inside an axis-aligned quadrant."""
    wx, wy = x1 - x0, y1 - y0
    if wx < 0.8 or wy < 0.8:
        return
    for _ in range(int(rng.integers(1, 4))):
        item = rng.choice(["shelf", "table", "cabinet", "plant", "boxes"])
        sx = float(rng.uniform(0.5, min(2.0, wx)))
        sy = float(rng.uniform(0.4, min(1.5, wy)))
        cx = float(rng.uniform(x0 + sx / 2, x1 - sx / 2))
        cy = float(rng.uniform(y0 + sy / 2, y1 - sy / 2))
        if item == "shelf":
            h = float(rng.uniform(1.2, 2.2))
            mb.add_boxes([[cx, cy, h / 2]], [[sx, min(sy, 0.5), h]], 0.0, rng.uniform(0.3, 0.7))
        elif item == "table":
            h = float(rng.uniform(0.7, 0.8))
            mb.add_boxes([[cx, cy, h - 0.02]], [[sx, sy, 0.04]], 0.0, 0.5)
            legs = np.array([[cx + a * (sx / 2 - 0.05), cy + b * (sy / 2 - 0.05), (h - 0.04) / 2]
                             for a in (-1, 1) for b in (-1, 1)])
            mb.add_boxes(legs, np.tile([0.05, 0.05, h - 0.04], (4, 1)), 0.0, 0.3)
            k = int(rng.integers(0, 4))
            if k:
                s = rng.uniform(0.1, 0.4, (k, 3))
                c = np.column_stack([rng.uniform(cx - sx / 3, cx + sx / 3, k), rng.uniform(cy - sy / 3, cy + sy / 3, k),
                                     h + s[:, 2] / 2])
                mb.add_boxes(c, s, rng.uniform(0, np.pi, k), rng.uniform(0.2, 0.8, k))
        elif item == "cabinet":
            h = float(rng.uniform(0.6, 1.1))
            mb.add_boxes([[cx, cy, h / 2]], [[sx, sy, h]], float(rng.uniform(-0.2, 0.2)), rng.uniform(0.3, 0.8))
        elif item == "plant":
            mb.add_cylinders([[cx, cy, 0.0]], 0.2, 0.4, albedo=0.4)
            mb.add_foliage([cx, cy, 0.9], [0.4, 0.4, 0.5], rng, n_leaves=50, leaf_size=0.15, albedo=0.3)
        else:
            k = int(rng.integers(2, 6))
            s = rng.uniform(0.2, 0.6, (k, 3))
            c = np.column_stack([rng.uniform(x0 + 0.3, x1 - 0.3, k), rng.uniform(y0 + 0.3, y1 - 0.3, k), s[:, 2] / 2])
            mb.add_boxes(c, s, rng.uniform(0, np.pi, k), rng.uniform(0.2, 0.8, k))


def _furnish_office(mb: MeshBuilder, rng: np.random.Generator, x0: float, x1: float, y0: float, y1: float) -> None:
    """Desks with privacy screens and chairs, filing cabinets, bookcases, printers, plants."""
    wx, wy = x1 - x0, y1 - y0
    if wx < 0.8 or wy < 0.8:
        return
    for _ in range(int(rng.integers(1, 4))):
        item = rng.choice(["desk", "desk", "cabinet", "bookcase", "printer", "plant"])
        sx = float(rng.uniform(0.6, min(1.8, wx)))
        sy = float(rng.uniform(0.5, min(0.9, wy)))
        cx = float(rng.uniform(x0 + sx / 2, x1 - sx / 2))
        cy = float(rng.uniform(y0 + sy / 2, y1 - sy / 2))
        if item == "desk":
            mb.add_boxes([[cx, cy, 0.73]], [[sx, sy, 0.03]], 0.0, 0.55)  # top
            mb.add_boxes([[cx - sx / 2 + 0.03, cy, 0.36], [cx + sx / 2 - 0.03, cy, 0.36]],
                         [[0.04, sy, 0.72]] * 2, 0.0, 0.4)  # side panels
            if rng.uniform() < 0.7:  # a screen along the back edge
                h = float(rng.uniform(1.2, 1.6))
                mb.add_boxes([[cx, cy + sy / 2, h / 2]], [[sx, 0.04, h]], 0.0, rng.uniform(0.3, 0.7))
            if rng.uniform() < 0.8:  # a chair in front
                c = [cx + rng.uniform(-0.2, 0.2), cy - sy / 2 - 0.3]
                mb.add_boxes([[*c, 0.47]], [[0.5, 0.5, 0.08]], rng.uniform(-0.5, 0.5), 0.15)
                mb.add_boxes([[c[0], c[1] - 0.22, 0.8]], [[0.45, 0.06, 0.6]], 0.0, 0.15)
                mb.add_cylinders([[*c, 0.0]], 0.04, 0.45, albedo=0.2, sides=6)
        elif item == "cabinet":
            h = float(rng.uniform(0.7, 1.35))
            mb.add_boxes([[cx, cy, h / 2]], [[min(sx, 0.9), 0.6, h]], 0.0, rng.uniform(0.4, 0.8))
        elif item == "bookcase":
            h = float(rng.uniform(1.5, 2.2))
            mb.add_boxes([[cx, cy, h / 2]], [[sx, 0.35, h]], 0.0, rng.uniform(0.3, 0.6))
        elif item == "printer":
            mb.add_boxes([[cx, cy, 0.5]], [[0.6, 0.5, 1.0]], rng.uniform(-0.3, 0.3), 0.7)
        else:
            mb.add_cylinders([[cx, cy, 0.0]], 0.2, 0.45, albedo=0.4)
            mb.add_foliage([cx, cy, 1.0], [0.4, 0.4, 0.55], rng, n_leaves=50, leaf_size=0.15, albedo=0.3)


def build_office(world: SyntheticWorld, mb: MeshBuilder, rng: np.random.Generator, i: int, j: int) -> None:
    """An office room or open-plan bay: the room shell with office furniture, ceiling light panels."""
    build_room(world, mb, rng, i, j, furnish=_furnish_office)
    p, H = world.pitch, world.room_height
    for cx in (0.25, 0.75):
        for cy in (0.25, 0.75):
            if rng.uniform() < 0.7:
                mb.add_boxes([[(i + cx) * p, (j + cy) * p, H - 0.04]], [[1.2, 0.6, 0.08]], 0.0, 0.9)


def build_warehouse(world: SyntheticWorld, mb: MeshBuilder, rng: np.random.Generator, i: int, j: int) -> None:
    """One bay of a closed hall: floor, roof with beams, a column, outer walls at the hall's edge,
    and pallet racks (or floor stacks of pallets) in the four quadrants off the driving lines."""
    i0, i1, j0, j1 = world.bounds
    if not (i0 <= i <= i1 and j0 <= j <= j1):
        return
    p, H = world.pitch, world.room_height
    x0, y0 = i * p, j * p
    mb.add_boxes([[x0 + p / 2, y0 + p / 2, -0.05]], [[p, p, 0.1]], 0.0, 0.3)  # floor
    mb.add_boxes([[x0 + p / 2, y0 + p / 2, H + 0.1]], [[p, p, 0.2]], 0.0, 0.5)  # roof
    mb.add_boxes([[x0 + p / 2, y0, H - 0.5], [x0, y0 + p / 2, H - 0.5]], [[p, 0.3, 0.8], [0.3, p, 0.8]], 0.0, 0.4)
    mb.add_boxes([[x0, y0, H / 2]], [[0.45, 0.45, H]], 0.0, 0.5)  # column at the bay corner
    walls = {(0, i == i0): x0, (0, i == i1): x0 + p, (1, j == j0): y0, (1, j == j1): y0 + p}
    for (axis, edge), at in walls.items():
        if not edge:
            continue
        c = [at, y0 + p / 2, H / 2] if axis == 0 else [x0 + p / 2, at, H / 2]
        mb.add_boxes([c], [[0.3, p, H] if axis == 0 else [p, 0.3, H]], 0.0, 0.55)
        if rng.uniform() < 0.5:  # a dock door, set into the wall
            d = [at, y0 + p / 2, 2.2] if axis == 0 else [x0 + p / 2, at, 2.2]
            mb.add_boxes([d], [[0.5, 3.2, 4.4] if axis == 0 else [3.2, 0.5, 4.4]], 0.0, 0.25)
    along_x = rng.uniform() < 0.5  # rack rows of this bay run along x or along y
    free = 1.6  # half-width of the driving lines kept clear
    for qx in (0, 1):
        for qy in (0, 1):
            lo = np.array([x0 + (0.4 if qx == 0 else p / 2 + free), y0 + (0.4 if qy == 0 else p / 2 + free)])
            hi = np.array([x0 + (p / 2 - free if qx == 0 else p - 0.4), y0 + (p / 2 - free if qy == 0 else p - 0.4)])
            if rng.uniform() < 0.8:
                _racks(mb, rng, lo, hi, along_x, H, world.rack_fill)
            else:
                _pallet_stacks(mb, rng, lo, hi)


def _racks(mb: MeshBuilder, rng: np.random.Generator, lo: np.ndarray, hi: np.ndarray, along_x: bool,
           H: float, fill: float) -> None:
    """Pallet-rack rows in the rectangle [lo, hi]: uprights per bay, beams per level, loads."""
    u_ax, v_ax = (0, 1) if along_x else (1, 0)
    depth, bay = float(rng.uniform(0.9, 1.2)), float(rng.uniform(2.4, 2.9))
    level = float(rng.uniform(1.4, 2.0))
    levels = np.arange(level, min(H - 1.5, 6 * level) + 1e-6, level)
    ends = np.arange(lo[u_ax], hi[u_ax] + 1e-6, bay)
    if len(ends) < 2 or hi[v_ax] - lo[v_ax] < depth:
        return
    top = float(levels[-1]) + 0.1 if len(levels) else 1.0

    def box(u, v, z, su, sv, sz):
        c = np.column_stack([u, v, z])[:, [0, 1, 2] if along_x else [1, 0, 2]]
        s = np.column_stack([su, sv, sz])[:, [0, 1, 2] if along_x else [1, 0, 2]]
        mb.add_boxes(c, s, 0.0, rng.uniform(0.2, 0.7, len(c)))

    for v in np.arange(lo[v_ax] + depth / 2, hi[v_ax] - depth / 2 + 1e-6, depth + float(rng.uniform(2.8, 3.5))):
        n = len(ends)
        for dv in (-depth / 2 + 0.05, depth / 2 - 0.05):  # uprights on both faces
            box(ends, np.full(n, v + dv), np.full(n, top / 2), np.full(n, 0.1), np.full(n, 0.1), np.full(n, top))
        mid, span = (ends[:-1] + ends[1:]) / 2, np.diff(ends)
        for z in levels:
            for dv in (-depth / 2 + 0.05, depth / 2 - 0.05):  # beams
                box(mid, np.full(n - 1, v + dv), np.full(n - 1, z), span, np.full(n - 1, 0.08), np.full(n - 1, 0.12))
        for z in np.concatenate([[0.0], levels]):  # two loads per bay and level, some missing
            for off in (-0.25, 0.25):
                keep = rng.uniform(size=n - 1) < fill
                k = int(keep.sum())
                if k:
                    h = rng.uniform(0.5, min(1.3, level - 0.25), k)
                    box(mid[keep] + off * span[keep], np.full(k, v), z + 0.08 + h / 2, 0.45 * span[keep],
                        np.full(k, 0.9 * depth), h)


def _pallet_stacks(mb: MeshBuilder, rng: np.random.Generator, lo: np.ndarray, hi: np.ndarray) -> None:
    """Stacks of pallet loads standing on the floor in a loose grid."""
    xs = np.arange(lo[0] + 0.7, hi[0] - 0.6, float(rng.uniform(1.4, 2.2)))
    ys = np.arange(lo[1] + 0.7, hi[1] - 0.6, float(rng.uniform(1.4, 2.2)))
    X, Y = np.meshgrid(xs, ys, indexing="ij")
    keep = rng.uniform(size=X.size) < 0.6
    k = int(keep.sum())
    if k:
        h = rng.uniform(0.5, 2.5, k)
        mb.add_boxes(np.column_stack([X.ravel()[keep], Y.ravel()[keep], h / 2]),
                     np.column_stack([np.full(k, 1.2), np.full(k, 1.0), h]), rng.normal(0, 0.05, k),
                     rng.uniform(0.2, 0.7, k))
