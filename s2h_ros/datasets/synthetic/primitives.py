"""Triangle-mesh primitives for the synthetic world: boxes, prisms, foliage, height fields, sweeps.

Each primitive is emitted as raw numpy vertex / triangle arrays with one albedo per triangle,
because Open3D's ``RaycastingScene`` takes exactly that (float32 vertices, uint32 triangles) and
building thousands of small legacy ``TriangleMesh`` objects would cost more than the ray casting.
Open3D has no vectorised "many boxes at once" constructor, hence these few lines by hand.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

# Unit cube corners in [-0.5, 0.5]^3 and its 12 triangles.
_CUBE_VERTS = np.array(
    [[x, y, z] for z in (-0.5, 0.5) for y in (-0.5, 0.5) for x in (-0.5, 0.5)], dtype=np.float64
)
_CUBE_TRIS = np.array(
    [
        [0, 2, 1], [1, 2, 3],  # bottom
        [4, 5, 6], [5, 7, 6],  # top
        [0, 1, 4], [1, 5, 4],  # -y
        [2, 6, 3], [3, 6, 7],  # +y
        [0, 4, 2], [2, 4, 6],  # -x
        [1, 3, 5], [3, 7, 5],  # +x
    ],
    dtype=np.int64,
)


def rot_z(yaw: np.ndarray) -> np.ndarray:
    """(K,) yaw angles -> (K, 3, 3) rotations about +z."""
    yaw = np.asarray(yaw, dtype=np.float64)
    c, s = np.cos(yaw), np.sin(yaw)
    R = np.zeros(yaw.shape + (3, 3))
    R[..., 0, 0], R[..., 0, 1], R[..., 1, 0], R[..., 1, 1], R[..., 2, 2] = c, -s, s, c, 1.0
    return R


class MeshBuilder:
    """Accumulates triangles (with a per-triangle albedo) and concatenates them once."""

    def __init__(self) -> None:
        self._verts: list[np.ndarray] = []
        self._tris: list[np.ndarray] = []
        self._albedo: list[np.ndarray] = []
        self._n = 0

    def add(self, verts: np.ndarray, tris: np.ndarray, albedo: float | np.ndarray) -> None:
        """Append (V, 3) vertices and (T, 3) local triangle indices with albedo (scalar or (T,))."""
        self._verts.append(np.asarray(verts, dtype=np.float64).reshape(-1, 3))
        self._tris.append(np.asarray(tris, dtype=np.int64).reshape(-1, 3) + self._n)
        self._albedo.append(np.broadcast_to(np.asarray(albedo, np.float32), (len(self._tris[-1]),)))
        self._n += len(self._verts[-1])

    def add_boxes(self, center: np.ndarray, size: np.ndarray, yaw: np.ndarray | float = 0.0,
                  albedo: float | np.ndarray = 0.3) -> None:
        """K boxes: (K, 3) centres, (K, 3) edge lengths, (K,) yaw about z, albedo per box."""
        center = np.atleast_2d(np.asarray(center, np.float64))
        size = np.atleast_2d(np.asarray(size, np.float64))
        k = len(center)
        if k == 0:
            return
        R = rot_z(np.broadcast_to(np.asarray(yaw, np.float64), (k,)))
        verts = np.einsum("kij,kvj->kvi", R, _CUBE_VERTS[None] * size[:, None, :]) + center[:, None, :]
        tris = _CUBE_TRIS[None] + 8 * np.arange(k)[:, None, None]
        alb = np.repeat(np.broadcast_to(np.asarray(albedo, np.float32), (k,)), len(_CUBE_TRIS))
        self.add(verts.reshape(-1, 3), tris.reshape(-1, 3), alb)

    def add_cylinders(self, base: np.ndarray, radius: np.ndarray, height: np.ndarray,
                      albedo: float | np.ndarray = 0.3, sides: int = 10) -> None:
        """K vertical closed prisms approximating cylinders: (K, 3) bottom centres, (K,) radius, height."""
        base = np.atleast_2d(np.asarray(base, np.float64))
        k = len(base)
        if k == 0:
            return
        radius = np.broadcast_to(np.asarray(radius, np.float64), (k,))
        height = np.broadcast_to(np.asarray(height, np.float64), (k,))
        ang = np.linspace(0.0, 2 * np.pi, sides, endpoint=False)
        ring = np.stack([np.cos(ang), np.sin(ang)], axis=1)  # (S, 2)
        verts = np.zeros((k, 2 * sides + 2, 3))
        verts[:, :sides, :2] = ring[None] * radius[:, None, None]
        verts[:, sides:2 * sides, :2] = verts[:, :sides, :2]
        verts[:, sides:2 * sides, 2] = height[:, None]
        verts[:, -1, 2] = height
        verts += base[:, None, :]
        i = np.arange(sides)
        j = (i + 1) % sides
        side = np.concatenate([np.stack([i, j, sides + i], 1), np.stack([j, sides + j, sides + i], 1)])
        caps = np.concatenate([np.stack([np.full(sides, 2 * sides), j, i], 1),
                               np.stack([np.full(sides, 2 * sides + 1), sides + i, sides + j], 1)])
        local = np.concatenate([side, caps])
        tris = local[None] + (2 * sides + 2) * np.arange(k)[:, None, None]
        alb = np.repeat(np.broadcast_to(np.asarray(albedo, np.float32), (k,)), len(local))
        self.add(verts.reshape(-1, 3), tris.reshape(-1, 3), alb)

    def add_foliage(self, center: np.ndarray, radii: np.ndarray, rng: np.random.Generator,
                    n_leaves: int = 200, leaf_size: float = 0.5, albedo: float = 0.2) -> None:
        """Vegetation-like clutter: randomly oriented small triangles filling an ellipsoid.

        Rays partly pass through such a cloud of "leaves", which gives the scattered, porous returns
        lidar sees on trees and bushes instead of a clean closed surface.
        """
        center = np.asarray(center, np.float64)
        radii = np.asarray(radii, np.float64)
        u = rng.normal(size=(n_leaves, 3))
        u /= np.linalg.norm(u, axis=1, keepdims=True)
        r = rng.uniform(0.0, 1.0, size=(n_leaves, 1)) ** (1.0 / 3.0)
        centres = center + u * r * radii
        corners = rng.normal(scale=leaf_size / 2, size=(n_leaves, 3, 3))
        verts = centres[:, None, :] + corners
        tris = np.arange(3 * n_leaves).reshape(-1, 3)
        self.add(verts.reshape(-1, 3), tris, albedo)

    def add_heightfield(self, x0: float, x1: float, y0: float, y1: float, step: float,
                        height: Callable[[np.ndarray, np.ndarray], np.ndarray],
                        albedo: float = 0.25) -> None:
        """Regular-grid triangulated surface z = height(x, y) over [x0, x1] x [y0, y1]."""
        nx = max(1, int(np.ceil((x1 - x0) / step)))
        ny = max(1, int(np.ceil((y1 - y0) / step)))
        xs, ys = np.linspace(x0, x1, nx + 1), np.linspace(y0, y1, ny + 1)
        X, Y = np.meshgrid(xs, ys, indexing="ij")
        verts = np.stack([X, Y, height(X, Y)], axis=-1).reshape(-1, 3)
        idx = np.arange((nx + 1) * (ny + 1)).reshape(nx + 1, ny + 1)
        a, b = idx[:-1, :-1].ravel(), idx[1:, :-1].ravel()
        c, d = idx[:-1, 1:].ravel(), idx[1:, 1:].ravel()
        tris = np.concatenate([np.stack([a, b, d], 1), np.stack([a, d, c], 1)])
        self.add(verts, tris, albedo)

    def add_curtain(self, xy: np.ndarray, z_bottom: np.ndarray, z_top: np.ndarray,
                    albedo: float = 0.3) -> None:
        """Vertical strip along a (K, 2) polyline between per-vertex bottom and top heights (curbs)."""
        xy = np.asarray(xy, np.float64)
        k = len(xy)
        verts = np.concatenate([np.column_stack([xy, z_bottom]), np.column_stack([xy, z_top])])
        i = np.arange(k - 1)
        tris = np.concatenate([np.stack([i, i + 1, k + i], 1), np.stack([i + 1, k + i + 1, k + i], 1)])
        self.add(verts, tris, albedo)

    def add_sweep(self, axis_xy: np.ndarray, left: np.ndarray, profile: np.ndarray,
                  ground: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
                  closed: bool = False, albedo: float = 0.3) -> None:
        """A cross-section swept along a path (tunnel tubes, barriers, rails, road strips).

        ``axis_xy`` (K, 2) path points with (K, 2) unit ``left`` normals; ``profile`` (M, 2) points
        (lateral offset to the left, height) of the cross-section, heights above ``ground(x, y)``
        (0 without it); ``closed`` joins the last profile point back to the first.
        """
        axis_xy, left, profile = (np.asarray(a, np.float64) for a in (axis_xy, left, profile))
        k, m = len(axis_xy), len(profile)
        xy = axis_xy[:, None, :] + profile[None, :, 0, None] * left[:, None, :]  # (K, M, 2)
        z = np.broadcast_to(profile[None, :, 1], (k, m)).copy()
        if ground is not None:
            z += ground(xy[..., 0], xy[..., 1])
        verts = np.concatenate([xy, z[..., None]], axis=-1).reshape(-1, 3)
        a = np.arange(k - 1)[:, None] * m + np.arange(m if closed else m - 1)[None]
        b = (np.arange(k - 1)[:, None] * m + (np.arange(m if closed else m - 1)[None] + 1) % m)
        a, b = a.ravel(), b.ravel()
        tris = np.concatenate([np.stack([a, b, a + m], 1), np.stack([b, b + m, a + m], 1)])
        self.add(verts, tris, albedo)

    def build(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """-> (V, 3) float32 vertices, (T, 3) uint32 triangles, (T,) float32 albedo."""
        if not self._verts:
            return (np.zeros((0, 3), np.float32), np.zeros((0, 3), np.uint32), np.zeros(0, np.float32))
        return (
            np.concatenate(self._verts).astype(np.float32),
            np.concatenate(self._tris).astype(np.uint32),
            np.concatenate(self._albedo).astype(np.float32),
        )
