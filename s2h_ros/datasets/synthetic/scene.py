"""Procedural, lazily generated worlds of several scene families, ray-cast with Open3D.

The world is an infinite grid of square tiles of side ``pitch``. Tile (i, j) is a pure function of
(seed, family, i, j), so it can be built on demand in any order and only the tiles within sensor
range of the vehicle are ever built: a 1 km sequence costs no more per scan than a 50 m one, and
two seeds never share content. What a tile holds is the family's (``families.py``): town blocks
on a road grid (the default outdoors), suburban blocks, parking lots, open fields, a highway or a
tunnel along one axis, and indoor rooms (the default indoors), offices or a warehouse hall.

Ray casting is Open3D's ``RaycastingScene`` (Embree BVH); a scene over the active tiles is rebuilt
only when the set of tiles in range changes.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import open3d as o3d

from s2h_ros.datasets.synthetic.families import DEFAULT_FAMILY, FAMILIES, KINDS
from s2h_ros.datasets.synthetic.primitives import MeshBuilder
from s2h_ros.datasets.synthetic.terrain import wave_sum


def seeded_rng(seed: int, *keys: int) -> np.random.Generator:
    """Independent generator for (seed, *keys); negative keys (tile indices) are allowed."""
    return np.random.default_rng(np.random.SeedSequence([int(seed) % 2**63] + [int(k) + 2**31 for k in keys]))


@dataclass
class Hits:
    """What a batch of rays hit: distance along the ray (inf = nothing), surface albedo, |cos| of incidence."""

    t: np.ndarray  # (N,) float32
    albedo: np.ndarray  # (N,) float32
    cos_incidence: np.ndarray  # (N,) float32 in [0, 1]


class SyntheticWorld:
    """A deterministic procedural world for a seed; tiles are generated on demand and cached."""

    def __init__(self, seed: int, kind: str | None = None, cache_tiles: int = 96, family: str | None = None) -> None:
        """``family`` picks the scene family (``FAMILIES``); without it ``kind`` ("outdoor", the
        default, or "indoor") picks that kind's default family (town or rooms)."""
        if kind is not None and kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        if family is None:
            family = DEFAULT_FAMILY[kind or "outdoor"]
        if family not in FAMILIES:
            raise ValueError(f"family must be one of {tuple(FAMILIES)}, got {family!r}")
        spec = FAMILIES[family]
        if kind is not None and kind != spec.kind:
            raise ValueError(f"family {family!r} is {spec.kind}, not {kind}")
        self.seed = int(seed)
        self.kind, self.family, self.route = spec.kind, family, spec.route
        # The default families draw from the streams they always did; the others from their own.
        self._key = () if family == DEFAULT_FAMILY[spec.kind] else (spec.key,)
        # Defaults that a family's setup may override.
        self.land_use = (0.4, 0.3, 0.15, 0.15)  # town blocks: urban, residential, park, parking
        self.door_p = (0.75, 0.15, 0.10)  # room walls: door, wide opening, no wall
        self.centerline = None  # line families: the road axis (terrain.Centerline)
        self.bounds = None  # bounded families: (i_min, i_max, j_min, j_max) tiles
        self.stops = True  # the vehicle stops before some grid nodes
        spec.setup(self, seeded_rng(self.seed, 0, *self._key))
        self._build = spec.build
        self._tiles: OrderedDict[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = OrderedDict()
        self._cache_tiles = cache_tiles
        self._scene_key: tuple | None = None
        self._scene: o3d.t.geometry.RaycastingScene | None = None
        self._scene_albedo: list[np.ndarray] = []

    # ---------------------------------------------------------------- ground
    def terrain_height(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Road-surface height z(x, y) in metres (0 indoors): what the vehicle drives on."""
        return wave_sum(self._terrain, x, y)

    def terrain_gradient(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """(..., 2) gradient (dz/dx, dz/dy) of the terrain."""
        return wave_sum(self._terrain, x, y, gradient=True)

    def ground_height(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Height of the ground surfaces: the terrain plus the centimetre-scale relief."""
        return wave_sum(self._terrain, x, y) + wave_sum(self._relief, x, y)

    # ---------------------------------------------------------------- tiles
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
        self._build(self, mb, seeded_rng(self.seed, 1, i, j, *self._key), i, j)
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
        if self.bounds is not None:  # a closed hall: nothing outside its tiles
            i0, i1, j0, j1 = self.bounds
            key = tuple((i, j) for i, j in key if i0 <= i <= i1 and j0 <= j <= j1)
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
