"""Procedural, lazily generated worlds: an outdoor town on a road grid or an indoor room grid.

The world is an infinite grid of square tiles of side ``pitch``. Tile (i, j) is a pure function of
(seed, i, j), so it can be built on demand in any order and only the tiles within sensor range of
the vehicle are ever built: a 1 km sequence costs no more per scan than a 50 m one, and two seeds
never share content. Outdoors, roads run along the tile borders and each tile holds one city
block (sidewalk with curbs on gently sloping ground, then buildings, houses, fences, parks or a
parking lot, plus poles, trees and parked cars). Indoors each tile is a room with doors in the
middle of its walls and furniture kept off the two centre lines the robot drives along.

Ray casting is Open3D's ``RaycastingScene`` (Embree BVH); a scene over the active tiles is rebuilt
only when the set of tiles in range changes.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import open3d as o3d

from s2h_ros.datasets.synthetic.primitives import MeshBuilder

KINDS = ("outdoor", "indoor")


def seeded_rng(seed: int, *keys: int) -> np.random.Generator:
    """Independent generator for (seed, *keys); negative keys (tile indices) are allowed."""
    return np.random.default_rng(np.random.SeedSequence([int(seed) % 2**63] + [int(k) + 2**31 for k in keys]))


def _random_waves(rng: np.random.Generator, n: int, wavelengths: tuple[float, float], amplitude) -> np.ndarray:
    """(n, 4) plane waves: wavenumber, direction, amplitude (``amplitude(k)``), phase."""
    k = 2 * np.pi / rng.uniform(wavelengths[0], wavelengths[1], n)
    direction = rng.uniform(0, 2 * np.pi, n)
    phase = rng.uniform(0, 2 * np.pi, n)
    return np.column_stack([k, direction, amplitude(k), phase])


def _wave_sum(waves: np.ndarray, x: np.ndarray, y: np.ndarray, gradient: bool = False) -> np.ndarray:
    """Sum of plane waves a sin(k (cos d x + sin d y) + p) at (x, y): value (...), or gradient (..., 2)."""
    x, y = np.broadcast_arrays(np.asarray(x, np.float64), np.asarray(y, np.float64))
    k, d, a, p = waves.T
    arg = k * (np.cos(d) * x[..., None] + np.sin(d) * y[..., None]) + p
    if not gradient:  # (elementwise sums: BLAS on tiny products stalls against Open3D's threads)
        return (np.sin(arg) * a).sum(-1)
    c = np.cos(arg) * (a * k)
    return np.stack([(c * np.cos(d)).sum(-1), (c * np.sin(d)).sum(-1)], axis=-1)


@dataclass
class Hits:
    """What a batch of rays hit: distance along the ray (inf = nothing), surface albedo, |cos| of incidence."""

    t: np.ndarray  # (N,) float32
    albedo: np.ndarray  # (N,) float32
    cos_incidence: np.ndarray  # (N,) float32 in [0, 1]


class SyntheticWorld:
    """A deterministic procedural world for a seed; tiles are generated on demand and cached."""

    def __init__(self, seed: int, kind: str = "outdoor", cache_tiles: int = 96) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        self.seed = int(seed)
        self.kind = kind
        rng = seeded_rng(self.seed, 0)
        if kind == "outdoor":
            self.pitch = float(rng.uniform(70.0, 110.0))  # block + road, metres
            self.road_half_width = float(rng.uniform(5.5, 7.5))
            self.lane_offset = 0.4 * self.road_half_width  # ego lane centre, right of the road centre
            self.turn_radius = float(0.9 * self.road_half_width)
            self.speed_range = (5.0, 15.0)  # m/s cruise speeds
            self.accel = 2.0  # m/s^2
            self.sensor_height = 1.73  # KITTI's Velodyne is 1.73 m above the road
            # Terrain: a few long-wavelength sinusoids (rows: wavenumber, direction, amplitude,
            # phase); slopes stay below ~4 %. Relief: short waves of ~2.5 cm RMS on the ground
            # surfaces only (not under the vehicle), so the ground carries world-fixed texture
            # instead of being a perfect plane on which only the sensor's rings show.
            self._terrain = _random_waves(rng, 4, (180.0, 700.0), lambda k: rng.uniform(0.2, 0.7, 4) * 0.035 / k)
            self._relief = _random_waves(rng, 12, (3.0, 10.0), lambda k: rng.uniform(0.005, 0.015, 12))
        else:
            self.pitch = float(rng.uniform(6.0, 9.0))  # room side
            self.road_half_width = 0.0
            self.lane_offset = 0.0
            self.turn_radius = 0.8
            self.speed_range = (0.4, 1.5)
            self.accel = 0.5
            self.sensor_height = 1.0
            self.room_height = float(rng.uniform(2.6, 3.4))
            self._terrain = self._relief = np.zeros((0, 4))
        # Farthest distance geometry is built for: rooms occlude each other, so indoors ~5 rooms.
        self.horizon = np.inf if kind == "outdoor" else 5.0 * self.pitch
        self._tiles: OrderedDict[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = OrderedDict()
        self._cache_tiles = cache_tiles
        self._scene_key: tuple | None = None
        self._scene: o3d.t.geometry.RaycastingScene | None = None
        self._scene_albedo: list[np.ndarray] = []

    # ---------------------------------------------------------------- ground
    def terrain_height(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Road-surface height z(x, y) in metres (0 indoors): what the vehicle drives on."""
        return _wave_sum(self._terrain, x, y)

    def terrain_gradient(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """(..., 2) gradient (dz/dx, dz/dy) of the terrain."""
        return _wave_sum(self._terrain, x, y, gradient=True)

    def ground_height(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Height of the ground surfaces: the terrain plus the centimetre-scale relief."""
        return _wave_sum(self._terrain, x, y) + _wave_sum(self._relief, x, y)

    # ---------------------------------------------------------------- tiles
    def tile_of(self, xy: np.ndarray) -> tuple[int, int]:
        """Index (i, j) of the tile containing the (2,) point."""
        return int(np.floor(xy[0] / self.pitch)), int(np.floor(xy[1] / self.pitch))

    def tiles_within(self, xy: np.ndarray, radius: float) -> list[tuple[int, int]]:
        """Tiles whose square comes within ``radius`` of the (2,) point."""
        p = self.pitch
        i0, i1 = int(np.floor((xy[0] - radius) / p)), int(np.floor((xy[0] + radius) / p))
        j0, j1 = int(np.floor((xy[1] - radius) / p)), int(np.floor((xy[1] + radius) / p))
        out = []
        for i in range(i0, i1 + 1):
            for j in range(j0, j1 + 1):
                dx = max(i * p - xy[0], 0.0, xy[0] - (i + 1) * p)
                dy = max(j * p - xy[1], 0.0, xy[1] - (j + 1) * p)
                if dx * dx + dy * dy <= radius * radius:
                    out.append((i, j))
        return out

    def tile_mesh(self, i: int, j: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(V, 3) float32 vertices, (T, 3) uint32 triangles, (T,) float32 albedo of tile (i, j)."""
        key = (i, j)
        if key in self._tiles:
            self._tiles.move_to_end(key)
            return self._tiles[key]
        mb = MeshBuilder()
        rng = seeded_rng(self.seed, 1, i, j)
        if self.kind == "outdoor":
            _build_block(self, mb, rng, i, j)
        else:
            _build_room(self, mb, rng, i, j)
        mesh = mb.build()
        self._tiles[key] = mesh
        while len(self._tiles) > self._cache_tiles:
            self._tiles.popitem(last=False)
        return mesh

    # ---------------------------------------------------------------- ray casting
    def prepare(self, xy: np.ndarray, radius: float) -> None:
        """Make the ray-casting scene cover every tile within ``radius`` of the (2,) point."""
        radius = min(radius, self.horizon)
        key = tuple(sorted(self.tiles_within(np.asarray(xy, np.float64), radius)))
        if self._scene is not None and set(key) <= set(self._scene_key):
            return
        # Build with a margin so that the scene survives several frames of driving.
        key = tuple(sorted(self.tiles_within(np.asarray(xy, np.float64), radius + 0.5 * self.pitch)))
        scene = o3d.t.geometry.RaycastingScene()
        albedo = []
        for i, j in key:
            v, t, a = self.tile_mesh(i, j)
            if len(t):
                scene.add_triangles(o3d.core.Tensor(v), o3d.core.Tensor(t))
                albedo.append(a)
        self._scene, self._scene_key, self._scene_albedo = scene, key, albedo

    def cast(self, origins: np.ndarray, directions: np.ndarray,
             extra: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> Hits:
        """Cast (N, 3) rays (unit directions) against the prepared scene and optional extra geometry.

        ``extra`` is a (vertices, triangles, albedo) mesh for this call only (moving objects).
        """
        if self._scene is None:
            raise RuntimeError("call prepare(xy, radius) before cast()")
        buf = np.empty((len(directions), 6), np.float32)
        buf[:, :3], buf[:, 3:] = origins, directions
        rays = o3d.core.Tensor.from_numpy(buf)
        t, alb, cos = self._hits(self._scene, rays, self._scene_albedo)
        if extra is not None and len(extra[1]):
            dyn = o3d.t.geometry.RaycastingScene()
            dyn.add_triangles(o3d.core.Tensor(extra[0]), o3d.core.Tensor(extra[1]))
            t2, alb2, cos2 = self._hits(dyn, rays, [extra[2]])
            closer = t2 < t
            t, alb, cos = np.where(closer, t2, t), np.where(closer, alb2, alb), np.where(closer, cos2, cos)
        return Hits(t=t, albedo=alb, cos_incidence=cos)

    @staticmethod
    def _hits(scene, rays, albedo: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        out = scene.cast_rays(rays)
        t = out["t_hit"].numpy()
        gid = out["geometry_ids"].numpy().astype(np.int64)
        pid = out["primitive_ids"].numpy().astype(np.int64)
        hit = np.isfinite(t)
        alb = np.zeros(len(t), np.float32)
        if hit.any():
            offsets = np.concatenate([[0], np.cumsum([len(a) for a in albedo])])
            flat = np.concatenate(albedo)
            alb[hit] = flat[offsets[gid[hit]] + pid[hit]]
        normals = out["primitive_normals"].numpy()
        cos = np.abs(np.einsum("ij,ij->i", normals, rays.numpy()[:, 3:]))
        return t, alb, cos


# -------------------------------------------------------------------- outdoor blocks
def _build_block(world: SyntheticWorld, mb: MeshBuilder, rng: np.random.Generator, i: int, j: int) -> None:
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
    land_use = rng.choice(["urban", "residential", "park", "parking"], p=[0.4, 0.3, 0.15, 0.15])

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
            _tree(mb, rng, _place(frame, u_tree, 1.3, ground, 0.0)[0])
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
            _tree(mb, rng, _place(frame, u + rng.uniform(0, width), sidewalk + rng.uniform(1.0, 3.5), ground, 0)[0])
        if rng.uniform() < 0.5:
            bc = _place(frame, u + rng.uniform(0, width), sidewalk + 1.2, ground, 0.5)[0]
            mb.add_foliage(bc, [0.9, 0.9, 0.6], rng, n_leaves=70, leaf_size=0.35, albedo=0.25)
        if rng.uniform() < 0.4:
            xy = frame.xy(np.array([u + fence_len + gap / 2]), np.array([sidewalk + 3.0]))
            add_cars(mb, xy, np.array([frame.yaw + np.pi / 2]), ground(xy[:, 0], xy[:, 1]), rng)
        u += width + 3.0


def _tree(mb: MeshBuilder, rng: np.random.Generator, base: np.ndarray) -> None:
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
        _tree(mb, rng, _place(frame, rng.uniform(3, side - 3), sidewalk + rng.uniform(2.0, 20.0), ground, 0)[0])
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


# -------------------------------------------------------------------- indoor rooms
def _build_room(world: SyntheticWorld, mb: MeshBuilder, rng: np.random.Generator, i: int, j: int) -> None:
    """One room: floor, ceiling, its west and south walls (with doors at their centres), furniture."""
    p, H = world.pitch, world.room_height
    x0, y0 = i * p, j * p
    mb.add_boxes([[x0 + p / 2, y0 + p / 2, -0.05]], [[p, p, 0.1]], 0.0, 0.35)  # floor
    mb.add_boxes([[x0 + p / 2, y0 + p / 2, H + 0.05]], [[p, p, 0.1]], 0.0, 0.7)  # ceiling
    for wall in range(2):  # 0: west wall x = x0 (runs along y), 1: south wall y = y0 (runs along x)
        kind = rng.choice(["door", "wide", "open"], p=[0.75, 0.15, 0.10])
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
            _furnish(mb, rng, lo_x, hi_x, lo_y, hi_y)
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
