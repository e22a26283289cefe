"""Town blocks: the outdoor ``town`` family and its greener ``suburban`` variant.

Roads run along the tile borders; each tile holds one city block (sidewalk with curbs on gently
sloping ground, then buildings, houses, fences, parks or a parking lot, plus poles, trees and
parked cars). The land-use mix is the world's (``world.land_use``); suburban worlds add back
gardens full of trees and bushes behind the houses.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from s2h_ros.datasets.synthetic.primitives import MeshBuilder

if TYPE_CHECKING:
    from s2h_ros.datasets.synthetic.scene import SyntheticWorld


def build_block(world: SyntheticWorld, mb: MeshBuilder, rng: np.random.Generator, i: int, j: int) -> None:
    """One tile: road surface around a raised block with curbs, street furniture and a land use."""
    p, w = world.pitch, world.road_half_width
    x0, y0 = i * p, j * p
    h, surface = world.terrain_height, world.ground_height
    mb.add_heightfield(x0, x0 + p, y0, y0 + p, 1.5, surface, albedo=0.12)  # asphalt
    curb = float(rng.uniform(0.1, 0.18))
    bx0, bx1, by0, by1 = x0 + w, x0 + p - w, y0 + w, y0 + p - w
    mb.add_heightfield(bx0, bx1, by0, by1, 1.5, lambda X, Y: surface(X, Y) + curb, albedo=0.3)
    # Curbs: a vertical face around the block (closed loop).
    loop = _rect_loop(bx0, bx1, by0, by1, 1.5)
    zb = surface(loop[:, 0], loop[:, 1])
    mb.add_curtain(loop, zb, zb + curb, albedo=0.35)

    side = bx1 - bx0
    sidewalk = float(rng.uniform(2.5, 4.5))
    land_use = rng.choice(["urban", "residential", "park", "parking"], p=world.land_use)

    def ground(x, y):
        return h(x, y) + curb

    for edge in range(4):
        frame = _EdgeFrame(bx0, bx1, by0, by1, edge)
        _street_furniture(mb, rng, frame, side, ground, h, w)
        if land_use == "urban":
            _buildings(mb, rng, frame, side, sidewalk, ground)
        elif land_use == "residential":
            _houses(mb, rng, frame, side, sidewalk, ground)
        elif land_use == "park":
            _park_edge(mb, rng, frame, side, sidewalk, ground)
    if land_use == "parking":
        _parking_lot(mb, rng, bx0, bx1, by0, by1, sidewalk, ground)
    if world.family == "suburban":
        _gardens(mb, rng, bx0, bx1, by0, by1, sidewalk, ground)


def _rect_loop(x0: float, x1: float, y0: float, y1: float, step: float) -> np.ndarray:
    """(K, 2) closed polyline around a rectangle, sampled every ~step metres."""
    def seg(a, b):
        n = max(2, int(np.ceil(np.linalg.norm(np.subtract(b, a)) / step)) + 1)
        return np.linspace(a, b, n)[:-1]

    c = [(x0, y0), (x1, y0), (x1, y1), (x0, y1)]
    return np.concatenate([seg(c[k], c[(k + 1) % 4]) for k in range(4)] + [np.array([c[0]])])


class _EdgeFrame:
    """Coordinates along one block edge: u along the edge, v inward from the curb."""

    def __init__(self, bx0: float, bx1: float, by0: float, by1: float, edge: int) -> None:
        corners = [(bx0, by0), (bx1, by0), (bx1, by1), (bx0, by1)]
        self.origin = np.array(corners[edge], np.float64)
        end = np.array(corners[(edge + 1) % 4], np.float64)
        self.u = (end - self.origin) / np.linalg.norm(end - self.origin)
        self.v = np.array([-self.u[1], self.u[0]])  # inward (blocks are traversed counter-clockwise)
        self.yaw = float(np.arctan2(self.u[1], self.u[0]))

    def xy(self, u: np.ndarray, v: np.ndarray) -> np.ndarray:
        u, v = np.broadcast_arrays(np.asarray(u, np.float64), np.asarray(v, np.float64))
        return self.origin + u[..., None] * self.u + v[..., None] * self.v


def _place(frame: _EdgeFrame, u, v, z_of, dz) -> np.ndarray:
    """(K, 3) centres at edge coordinates (u, v), standing on the ground with centre height dz."""
    xy = frame.xy(u, v).reshape(-1, 2)
    return np.column_stack([xy, z_of(xy[:, 0], xy[:, 1]) + np.asarray(dz, np.float64).reshape(-1)])


def add_cars(mb: MeshBuilder, center_xy: np.ndarray, yaw: np.ndarray, ground_z: np.ndarray,
          rng: np.random.Generator) -> None:
    """Car-like shapes: a body box plus a cabin box, sized like hatchbacks to vans."""
    k = len(center_xy)
    if k == 0:
        return
    length = rng.uniform(3.8, 5.2, k)
    width = rng.uniform(1.7, 2.0, k)
    body_h = rng.uniform(0.7, 1.0, k)
    cabin_h = rng.uniform(0.45, 0.7, k)
    albedo = rng.choice([0.08, 0.2, 0.45, 0.7], size=k)
    base = ground_z + 0.25
    mb.add_boxes(np.column_stack([center_xy, base + body_h / 2]), np.column_stack([length, width, body_h]),
                 yaw, albedo)
    fwd = np.column_stack([np.cos(yaw), np.sin(yaw)]) * (-0.1 * length)[:, None]
    mb.add_boxes(np.column_stack([center_xy + fwd, base + body_h + cabin_h / 2]),
                 np.column_stack([0.55 * length, 0.9 * width, cabin_h]), yaw, 0.1)
    # Wheels as short dark boxes at the four corners: the gap under the body stays visible.
    for su in (-0.32, 0.32):
        for sv in (-0.45, 0.45):
            off = np.column_stack([np.cos(yaw) * su * length - np.sin(yaw) * sv * width,
                                   np.sin(yaw) * su * length + np.cos(yaw) * sv * width])
            mb.add_boxes(np.column_stack([center_xy + off, ground_z + 0.32]),
                         np.column_stack([np.full(k, 0.62), np.full(k, 0.22), np.full(k, 0.62)]), yaw, 0.05)


def _street_furniture(mb, rng, frame: _EdgeFrame, side: float, ground, road, w: float) -> None:
    """Poles and lamps on the sidewalk, signs, and cars parked along the curb in the road."""
    n = int(side // rng.uniform(14.0, 28.0))
    u = np.sort(rng.uniform(3.0, side - 3.0, n))
    centres = _place(frame, u, np.full(n, 0.6), ground, 0.0)
    heights = rng.uniform(4.0, 9.0, n)
    mb.add_cylinders(centres, rng.uniform(0.08, 0.18, n), heights, albedo=0.4)
    arm = _place(frame, u, np.full(n, -0.6), ground, 0.0)
    arm[:, 2] = centres[:, 2] + heights - 0.2
    mb.add_boxes(arm, np.column_stack([np.full(n, 0.25), np.full(n, 2.2), np.full(n, 0.2)]), frame.yaw, 0.5)
    m = rng.integers(0, 3)
    if m:
        us = rng.uniform(3.0, side - 3.0, m)
        base = _place(frame, us, np.full(m, 1.0), ground, 0.0)
        mb.add_cylinders(base, 0.05, 2.6, albedo=0.4)
        plate = base + np.array([0.0, 0.0, 2.3])
        mb.add_boxes(plate, np.column_stack([np.full(m, 0.7), np.full(m, 0.04), np.full(m, 0.7)]),
                     frame.yaw, 0.9)
    # Small street clutter on the sidewalk: bins, bollards, boxes, low bushes.
    k = int(rng.integers(3, 12))
    uc, vc = rng.uniform(2.0, side - 2.0, k), rng.uniform(0.4, 2.2, k)
    kind = rng.integers(0, 4, k)
    for u_, v_, c_ in zip(uc, vc, kind):
        base = _place(frame, u_, v_, ground, 0.0)[0]
        if c_ == 0:
            mb.add_boxes(base + [0, 0, 0.5], [[0.6, 0.6, 1.0]], frame.yaw, rng.uniform(0.1, 0.6))
        elif c_ == 1:
            mb.add_cylinders(base[None], 0.1, 0.9, albedo=0.5, sides=8)
        elif c_ == 2:
            mb.add_boxes(base + [0, 0, 0.7], [[rng.uniform(0.8, 2.0), 0.5, 1.4]], frame.yaw, rng.uniform(0.2, 0.7))
        else:
            mb.add_foliage(base + [0, 0, 0.5], [0.7, 0.7, 0.5], rng, n_leaves=45, leaf_size=0.3, albedo=0.25)
    if rng.uniform() < 0.6:  # a row of street trees along the curb
        ut = np.arange(rng.uniform(3.0, 8.0), side - 3.0, rng.uniform(7.0, 14.0))
        for u_tree in ut:
            add_tree(mb, rng, _place(frame, u_tree, 1.3, ground, 0.0)[0])
    # Parked cars in the road next to the curb (v < 0 is the road side).
    gaps = np.cumsum(rng.uniform(5.0, 12.0, 40))
    u = gaps[gaps < side - 8.0] + 4.0
    u = u[rng.uniform(size=len(u)) < rng.uniform(0.4, 0.9)]
    if len(u):
        xy = frame.xy(u, np.full(len(u), -1.15))
        add_cars(mb, xy, frame.yaw + rng.normal(0, 0.03, len(u)), road(xy[:, 0], xy[:, 1]), rng)


def _buildings(mb, rng, frame: _EdgeFrame, side: float, sidewalk: float, ground) -> None:
    """A row of building facades with gaps, setbacks, balconies and shop awnings."""
    u = float(rng.uniform(0.0, 4.0))
    while u < side - 6.0:
        width = min(float(rng.uniform(8.0, 30.0)), side - u)
        depth = float(rng.uniform(10.0, 20.0))
        height = float(rng.uniform(6.0, 30.0))
        setback = sidewalk + float(rng.choice([0.0, 0.0, rng.uniform(0.5, 4.0)]))
        c = _place(frame, u + width / 2, setback + depth / 2, ground, height / 2 - 0.5)
        mb.add_boxes(c, [[width, depth, height + 1.0]], frame.yaw, rng.uniform(0.2, 0.6))
        # Facade relief: balconies / ledges protruding towards the street.
        k = int(rng.integers(0, 6))
        if k:
            bu = u + rng.uniform(1.0, width - 1.0, k)
            bz = rng.uniform(3.0, max(3.5, height - 1.0), k)
            bd = rng.uniform(0.3, 1.2, k)
            bc = _place(frame, bu, setback - bd / 2, ground, bz)
            mb.add_boxes(bc, np.column_stack([rng.uniform(1.5, 5.0, k), bd, rng.uniform(0.15, 1.1, k)]),
                         frame.yaw, 0.5)
        if rng.uniform() < 0.4:  # ground-floor awning
            aw = _place(frame, u + width / 2, setback - 0.8, ground, 2.8)
            mb.add_boxes(aw, [[0.8 * width, 1.6, 0.1]], frame.yaw, 0.6)
        u += width + float(rng.choice([0.0, 0.0, rng.uniform(2.0, 8.0)]))


def _houses(mb, rng, frame: _EdgeFrame, side: float, sidewalk: float, ground) -> None:
    """Detached houses behind front fences, with garden trees, bushes and cars in driveways."""
    u = float(rng.uniform(1.0, 5.0))
    while u < side - 10.0:
        width = float(rng.uniform(8.0, 13.0))
        depth = float(rng.uniform(8.0, 11.0))
        height = float(rng.uniform(5.0, 9.0))
        front = sidewalk + float(rng.uniform(4.0, 8.0))
        c = _place(frame, u + width / 2, front + depth / 2, ground, height / 2)
        mb.add_boxes(c, [[width, depth, height]], frame.yaw, rng.uniform(0.3, 0.7))
        # Front fence, garden wall or hedge, with a driveway gap.
        gap = float(rng.uniform(2.5, 3.5))
        fence_len = width + 3.0 - gap
        front_kind = rng.choice(["fence", "wall", "hedge"])
        if front_kind == "hedge":
            for uh in np.arange(0.6, fence_len, 1.2):
                c = _place(frame, u + uh, sidewalk + 0.5, ground, 0.8)[0]
                mb.add_foliage(c, [0.8, 0.5, 0.8], rng, n_leaves=40, leaf_size=0.3, albedo=0.25)
        else:
            tall = 1.2 if front_kind == "fence" else float(rng.uniform(0.8, 2.0))
            fc = _place(frame, u + fence_len / 2, sidewalk + 0.1, ground, tall / 2)
            mb.add_boxes(fc, [[fence_len, 0.05 if front_kind == "fence" else 0.25, tall]], frame.yaw,
                         0.35 if front_kind == "fence" else 0.5)
            posts = np.arange(0.0, fence_len, 2.5)
            mb.add_boxes(_place(frame, u + posts, np.full(len(posts), sidewalk + 0.1), ground, 0.7),
                         np.tile([0.12, 0.12, 1.4], (len(posts), 1)), frame.yaw, 0.3)
        if rng.uniform() < 0.7:
            add_tree(mb, rng, _place(frame, u + rng.uniform(0, width), sidewalk + rng.uniform(1.0, 3.5), ground, 0)[0])
        if rng.uniform() < 0.5:
            bc = _place(frame, u + rng.uniform(0, width), sidewalk + 1.2, ground, 0.5)[0]
            mb.add_foliage(bc, [0.9, 0.9, 0.6], rng, n_leaves=70, leaf_size=0.35, albedo=0.25)
        if rng.uniform() < 0.4:
            xy = frame.xy(np.array([u + fence_len + gap / 2]), np.array([sidewalk + 3.0]))
            add_cars(mb, xy, np.array([frame.yaw + np.pi / 2]), ground(xy[:, 0], xy[:, 1]), rng)
        u += width + 3.0


def add_tree(mb: MeshBuilder, rng: np.random.Generator, base: np.ndarray) -> None:
    """Trunk cylinder and a porous foliage crown."""
    trunk_h = float(rng.uniform(1.8, 4.0))
    crown = float(rng.uniform(1.5, 3.5))
    mb.add_cylinders(base[None], [float(rng.uniform(0.12, 0.3))], [trunk_h + crown], albedo=0.25, sides=8)
    mb.add_foliage(base + [0, 0, trunk_h + crown], [crown, crown, crown * rng.uniform(0.8, 1.3)], rng,
                   n_leaves=int(80 * crown), leaf_size=0.45, albedo=0.3)


def _park_edge(mb, rng, frame: _EdgeFrame, side: float, sidewalk: float, ground) -> None:
    """Fenced park: trees and bushes scattered near the street, benches, a low fence."""
    fence = _place(frame, side / 2, sidewalk, ground, 0.5)
    mb.add_boxes(fence, [[side - 4.0, 0.04, 1.0]], frame.yaw, 0.3)
    n = int(rng.integers(4, 10))
    for k in range(n):
        add_tree(mb, rng, _place(frame, rng.uniform(3, side - 3), sidewalk + rng.uniform(2.0, 20.0), ground, 0)[0])
    m = int(rng.integers(3, 9))
    for k in range(m):
        c = _place(frame, rng.uniform(3, side - 3), sidewalk + rng.uniform(1.0, 15.0), ground, 0.5)[0]
        mb.add_foliage(c, rng.uniform(0.5, 1.5, 3) * [1.5, 1.5, 0.8], rng, n_leaves=60, leaf_size=0.35, albedo=0.25)
    b = int(rng.integers(0, 3))
    if b:
        mb.add_boxes(_place(frame, rng.uniform(3, side - 3, b), np.full(b, sidewalk + 1.5), ground, 0.45),
                     np.tile([1.8, 0.6, 0.9], (b, 1)), frame.yaw, 0.4)


def _parking_lot(mb, rng, bx0, bx1, by0, by1, sidewalk: float, ground) -> None:
    """Rows of parked cars with empty spots, lamp posts and a kiosk."""
    xs = np.arange(bx0 + sidewalk + 4.0, bx1 - sidewalk - 3.0, 2.7)
    ys = np.arange(by0 + sidewalk + 4.0, by1 - sidewalk - 4.0, 14.0)
    X, Y = np.meshgrid(xs, ys, indexing="ij")
    xy = np.column_stack([X.ravel(), Y.ravel()])
    xy = xy[rng.uniform(size=len(xy)) < rng.uniform(0.4, 0.85)]
    xy = xy + rng.normal(0, 0.15, xy.shape)
    add_cars(mb, xy, np.pi / 2 + rng.normal(0, 0.05, len(xy)) + np.pi * rng.integers(0, 2, len(xy)),
          ground(xy[:, 0], xy[:, 1]), rng)
    k = int(rng.integers(2, 6))
    lx, ly = rng.uniform(bx0 + 5, bx1 - 5, k), rng.uniform(by0 + 5, by1 - 5, k)
    mb.add_cylinders(np.column_stack([lx, ly, ground(lx, ly)]), 0.15, rng.uniform(6, 9, k), albedo=0.4)
    kx, ky = float(rng.uniform(bx0 + 8, bx1 - 8)), float(rng.uniform(by0 + 8, by1 - 8))
    mb.add_boxes([[kx, ky, float(ground(kx, ky)) + 1.5]], [[4.0, 3.0, 3.0]], rng.uniform(0, np.pi), 0.5)


def _gardens(mb, rng, bx0, bx1, by0, by1, sidewalk: float, ground) -> None:
    """Back gardens of a suburban block: trees, bushes and garden sheds between the house rows."""
    inner = sidewalk + 20.0  # behind the houses (front setback + depth)
    x0, x1, y0, y1 = bx0 + inner, bx1 - inner, by0 + inner, by1 - inner
    if x1 - x0 < 2.0 or y1 - y0 < 2.0:
        return
    area = (x1 - x0) * (y1 - y0)
    for _ in range(int(area / rng.uniform(60.0, 140.0))):
        base = np.array([rng.uniform(x0, x1), rng.uniform(y0, y1)])
        base = np.append(base, ground(base[0], base[1]))
        if rng.uniform() < 0.6:
            add_tree(mb, rng, base)
        else:
            mb.add_foliage(base + [0, 0, 0.6], rng.uniform(0.6, 1.6, 3) * [1.2, 1.2, 0.7], rng, n_leaves=60,
                           leaf_size=0.35, albedo=0.25)
    for _ in range(int(rng.integers(0, 3))):
        c = np.array([rng.uniform(x0, x1), rng.uniform(y0, y1)])
        mb.add_boxes([[c[0], c[1], float(ground(c[0], c[1])) + 1.1]], [rng.uniform([2.0, 2.0, 2.2], [3.5, 3.0, 2.2])],
                     rng.uniform(0, np.pi), 0.45)
