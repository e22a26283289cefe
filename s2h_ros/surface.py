"""Each voxel's local surface: its normal and planarity, from the covariance of its neighbourhood.

A voxel's neighbourhood is its ``NEIGHBOURS`` nearest voxels (itself included) within ``radius``
(``NORMAL_RADIUS_VOXELS`` voxel sizes for the registration's normals). Its normal is the
eigenvector of the smallest eigenvalue of the neighbourhood's covariance; its planarity is
``(s2 - s3) / s1`` for the square roots ``s1 >= s2 >= s3`` of the eigenvalues (about 1 on a sampled
surface, 0 on a line or a blob: :mod:`s2h_ros.degeneracy` says why it weights the alignment's rows).
A neighbourhood of fewer than 3 voxels has no surface: normal ``(0, 0, 1)``, planarity 0.

What point-to-plane ICP aligns a scan to (``icp_min_planarity``, :func:`planar_surface`): the
voxels with a plane. A 16-32-beam lidar's rings draw lines on the ground and on walls; a line's
"normal" is any direction across it, and its rows pull the scan onto the target's rings, which
moved with the sensor (ICP from the truth walked 1.4 deg off on a handheld VLP-16 pair,
test_icp.py). Lines get a second, wider look, lines along the rings' axis stay, and the rest is
left out only where the planes alone hold the pose (``facing_area``).

Two ways to find the neighbourhoods, the same numbers (test_surface.py, on the real KITTI scan);
either way one search gives normals, planarity and the covariances that ``planar_surface`` reads
again, and the eigen-decomposition is ``symmetric_eigen3`` in closed form on the covariances' device:

- **CPU** (``device`` "cpu"): Open3D's ``estimate_covariances``, the faster there: 58-70 ms for a
  KITTI scan's 20k voxels on the 2-core VM (beside another job), where the way below takes about
  2.6 s (its neighbour search ranks every voxel of 27 cells: work for a GPU, 12.9 ms on an H200 with
  the eigen-solver, against 69 ms there for cKDTree's neighbours and torch's ``eigh`` on the CPU).
  The closed form took 15 ms for those 20k on one thread, numpy's ``eigh`` 31 ms. Normals alone
  (a scan's tests ask only those) come from Open3D's ``estimate_normals`` (``estimate_normals``).
- **GPU** (any other device): the neighbours from a hash grid (:mod:`s2h_ros.hash_grid`), the
  covariances and their eigen-decomposition, all on the device. Open3D holds Python's global interpreter
  lock for the whole of each call (measured: a Python thread beside three normal estimations made
  no progress for their 2.4 s). The odometry prepares the next scan and the new keyframe on
  helper threads while its worker registers; each Open3D call there stalls the worker for as long
  as it runs, torch's ops do not. On the CPU Open3D stays, faster there; the two largest of these
  calls run in the local map's helper process by default, away from the lock: the map's surface
  (s2h_ros.local_map) and a new keyframe's (``icp_surface``, ``PreparedCloud.surface_in``).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from s2h_ros.degeneracy import weakest_direction
from s2h_ros.hash_grid import HashGrid

# Neighbourhood of a normal for point-to-plane ICP: the 30 nearest voxels within this many voxel
# sizes. Dense scans reach 30 neighbours within about 1 m at 0.3 m voxels either way; on sparse
# scans (16 beams) a 2-voxel radius holds only points of one ring, a line whose PCA "normal" lies
# in the ground plane, and ICP then slides the scan onto the rings that move with the sensor
# (measured: 0.4-2 m wrong, trusted steps on a VLP-16 drive; none with 5 voxels).
NORMAL_RADIUS_VOXELS = 5.0
NEIGHBOURS = 30
# A voxel whose neighbourhood is line-like (planarity below ``icp_min_planarity``) is looked at
# again over this many times the radius (``planar_surface``).
WIDE_NEIGHBOURHOOD = 2.5
# ``planar_surface`` keeps every voxel unless the planes it would keep offer at least this much
# surface (m^2, voxels x voxel area) facing every direction the translation can take once the
# rotation is free. Development worlds (0.3 m voxels; scans 0 and 20 of worlds 839, 873, 884, 921,
# 941, 962): towns, suburbs, parking lots 12-38 m^2, where ICP from the truth against the planes
# alone stays closer (VLP-16 mean RE 0.34-0.77 -> 0.14-0.15 deg); VLP-16 and HDL-32 highways
# 0.7-1.6 m^2, where it strays further (RE 0.08 -> 0.16-0.32 deg, TE 2-4x: the guardrails' lines
# hold the road's length); an HDL-64 highway 24-40 m^2; tunnels and open fields 0.02-0.15 m^2.
MIN_PLANAR_AREA = 4.5
# Voxels whose neighbourhoods are gathered at once on the GPU path (bounds its memory: 30
# neighbours x 3 coordinates x 8 bytes x 65,536 = 47 MB).
_CHUNK = 65_536
# A cross product of two rows of ``A - l I`` (A scaled to entries <= 1) shorter than this: the rows
# span a line or less, l is (nearly) a double eigenvalue and has no single eigenvector.
RANK_TOLERANCE = 1e-12
# Two eigenvalues closer than this times the largest tie (``surface_of``): the closed form's error near
# a double root is about 1e-8 of it (1-2 voxel neighbourhoods of the real KITTI scan: at most 7e-9),
# and the flattest neighbourhood of 3 or more voxels there has its middle one at 5e-5.
TIE_TOLERANCE = 1e-6


def on_device(device: str | torch.device) -> bool:
    """Whether ``device`` takes the torch path (module text) rather than Open3D's."""
    return torch.device(device).type != "cpu"


def _open3d_cloud(xyz: np.ndarray):
    import open3d as o3d

    return o3d.geometry.PointCloud(o3d.utility.Vector3dVector(np.asarray(xyz, dtype=np.float64)))


def _open3d_search(radius: float):
    import open3d as o3d

    return o3d.geometry.KDTreeSearchParamHybrid(radius=radius, max_nn=NEIGHBOURS)


def local_covariances(xyz: np.ndarray, radius: float, max_nn: int = NEIGHBOURS,
                      device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """``(M, 3, 3)`` float64 covariance (over ``n``, the neighbourhood's size) of each of the ``(M, 3)``
    voxels' neighbourhoods (:class:`s2h_ros.hash_grid.HashGrid` on ``device``), on ``device``, and
    ``(M,)`` int64 ``n``. Coordinates are taken relative to each voxel before the sums, so clouds far
    from their origin keep their precision."""
    points = torch.as_tensor(np.asarray(xyz, dtype=np.float64), device=device)
    grid = HashGrid(points, radius)
    covariances, counts = [], []
    for lo in range(0, len(points), _CHUNK):
        _, neighbours = grid.knearest(points[lo:lo + _CHUNK], min(max_nn, len(points)))
        ok = neighbours >= 0
        d = (points[neighbours.clamp_min(0)] - points[lo:lo + _CHUNK, None]) * ok[..., None]
        n = ok.sum(1)
        mean = d.sum(1) / n[:, None]
        covariances.append(d.transpose(1, 2) @ d / n[:, None, None] - mean[:, :, None] * mean[:, None, :])
        counts.append(n)
    return torch.cat(covariances), torch.cat(counts)


def symmetric_eigen3(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(M, 3)`` ascending eigenvalues of ``(M, 3, 3)`` symmetric float64 matrices and ``(M, 3)`` a
    unit eigenvector of the smallest, on their device, in closed form.

    The eigenvalues are the roots of the characteristic cubic in trigonometric form; the
    eigenvector is the largest cross product of two rows of ``A - l_min I`` (orthogonal to its row
    space). Where the smallest eigenvalue is (nearly) double that row space is a line, and the
    vector is any one orthogonal to the largest eigenvalue's; where all three tie, z. Written by
    hand because torch's batched ``eigh`` cannot serve a GPU here (measured on an H200, torch 2.11
    and CUDA 13: 20,000 matrices took 224 ms and 10 GB of GPU memory, 65,536 failed with a cuSOLVER
    error, two threads' first calls at once failed), and on the CPU it took 118 ms per 20,000 on
    that machine. Open3D computes its normals the same way, on the CPU only."""
    scale = a.abs().amax((1, 2)).clamp_min(torch.finfo(a.dtype).tiny)
    b = a / scale[:, None, None]
    eye = torch.eye(3, dtype=a.dtype, device=a.device)
    q = b.diagonal(dim1=1, dim2=2).sum(1) / 3
    off = b[:, 0, 1] ** 2 + b[:, 0, 2] ** 2 + b[:, 1, 2] ** 2
    p = torch.sqrt(((b.diagonal(dim1=1, dim2=2) - q[:, None]) ** 2).sum(1) / 6 + off / 3)
    spread = p > 0
    c = (b - q[:, None, None] * eye) / torch.where(spread, p, 1.0)[:, None, None]
    phi = torch.acos((_det3(c) / 2).clamp(-1.0, 1.0)) / 3
    largest = q + 2 * p * torch.cos(phi)
    smallest = q + 2 * p * torch.cos(phi + 2 * np.pi / 3)
    values = torch.stack([smallest, 3 * q - largest - smallest, largest], 1)
    vector, found = _null_vector(b - smallest[:, None, None] * eye)
    axis, found_axis = _null_vector(b - largest[:, None, None] * eye)
    # An axis orthogonal to the largest eigenvalue's: its cross product with the least aligned unit axis.
    other = eye[axis.abs().argmin(1)]
    across = torch.linalg.cross(axis, other)
    across = across / across.norm(dim=1, keepdim=True).clamp_min(1e-300)
    vector = torch.where(found[:, None], vector, torch.where(found_axis[:, None], across, eye[2]))
    return values * scale[:, None], vector


def _det3(m: torch.Tensor) -> torch.Tensor:
    """``(M,)`` determinants of ``(M, 3, 3)`` matrices by cofactors: ``torch.linalg.det`` factorises
    through the GPU's solver library, whose first use from two threads at once failed (see above)."""
    return (m[:, 0, 0] * (m[:, 1, 1] * m[:, 2, 2] - m[:, 1, 2] * m[:, 2, 1])
            - m[:, 0, 1] * (m[:, 1, 0] * m[:, 2, 2] - m[:, 1, 2] * m[:, 2, 0])
            + m[:, 0, 2] * (m[:, 1, 0] * m[:, 2, 1] - m[:, 1, 1] * m[:, 2, 0]))


def _null_vector(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(M, 3)`` unit vector orthogonal to the rows of each ``(M, 3, 3)`` matrix of rank 2 (the
    largest cross product of two rows) and ``(M,)`` whether there was one (rank 2, not less)."""
    crosses = torch.stack([torch.linalg.cross(m[:, 0], m[:, 1]), torch.linalg.cross(m[:, 0], m[:, 2]),
                           torch.linalg.cross(m[:, 1], m[:, 2])], 1)  # (M, 3, 3)
    norms = crosses.norm(dim=2)
    best = norms.argmax(1)
    length = norms.gather(1, best[:, None])[:, 0]
    vector = crosses[torch.arange(len(m), device=m.device), best] / length.clamp_min(1e-300)[:, None]
    return vector, length > RANK_TOLERANCE


class Surface(NamedTuple):
    """Each voxel's local surface (``estimate_surface``)."""

    normals: np.ndarray  # (M, 3) float64 unit normals; (0, 0, 1) where the neighbourhood has none
    planarity: np.ndarray  # (M,) float64 in [0, 1] (module text)
    covariances: np.ndarray | None  # (M, 3, 3) float64 of the neighbourhoods, kept for planar_surface


def surface_of(covariances: torch.Tensor) -> Surface:
    """The normals and planarity of ``(M, 3, 3)`` float64 neighbourhood covariances (``symmetric_eigen3``
    on their device), and the covariances on the CPU. A neighbourhood of fewer than 3 voxels has no
    surface: its covariance is a point or a line (the torch path's) or the identity (Open3D's), two
    eigenvalues that tie; normal (0, 0, 1) and planarity 0."""
    values, vectors = symmetric_eigen3(covariances)
    values, vectors = values.cpu().numpy(), vectors.cpu().numpy()
    spread = values[:, 2] * TIE_TOLERANCE
    none = (values[:, 1] <= spread) | (values[:, 2] - values[:, 0] <= spread)
    vectors[none] = (0.0, 0.0, 1.0)
    planarity = _planarity(values)
    planarity[none] = 0.0
    return Surface(vectors, planarity, covariances.cpu().numpy())


def _planarity(eigenvalues: np.ndarray) -> np.ndarray:
    """``(M,)`` ``(s2 - s3) / s1`` in [0, 1] of ``(M, 3)`` ascending covariance eigenvalues (module
    text); 0 where a neighbourhood has no spread."""
    s = np.sqrt(np.maximum(eigenvalues, 0.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        planarity = (s[:, 1] - s[:, 0]) / s[:, 2]
    return np.clip(np.nan_to_num(planarity, nan=0.0, posinf=0.0, neginf=0.0), 0.0, 1.0)


def estimate_surface(xyz: np.ndarray, voxel: float, device: str | torch.device = "cpu") -> Surface:
    """The local surface of ``(M, 3)`` voxels of size ``voxel``: normals, planarity and the
    neighbourhoods' covariances, from one neighbour search (module text)."""
    return surface_of(torch.as_tensor(_covariances(xyz, NORMAL_RADIUS_VOXELS * voxel, device)))


def estimate_normals(xyz: np.ndarray, voxel: float, device: str | torch.device = "cpu") -> np.ndarray:
    """``(M, 3)`` float64 unit normals of ``(M, 3)`` voxels of size ``voxel`` (module text): on the
    CPU Open3D's ``estimate_normals``, the cheaper where planarity is not asked (55 against 81 ms for
    the KITTI scan's 20k voxels on the 2-core VM)."""
    if on_device(device):
        return estimate_surface(xyz, voxel, device).normals
    cloud = _open3d_cloud(xyz)
    cloud.estimate_normals(_open3d_search(NORMAL_RADIUS_VOXELS * voxel))
    return np.asarray(cloud.normals)


def _covariances(xyz: np.ndarray, radius: float, device: str | torch.device) -> torch.Tensor | np.ndarray:
    """``(M, 3, 3)`` float64 covariance of each voxel's neighbourhood (the ``NEIGHBOURS`` nearest
    within ``radius``): torch on a GPU device, Open3D's (numpy) on the CPU (the identity under 3 voxels)."""
    if on_device(device):
        return local_covariances(xyz, radius, NEIGHBOURS, device)[0]
    cloud = _open3d_cloud(xyz)
    cloud.estimate_covariances(_open3d_search(radius))
    return np.asarray(cloud.covariances)


def planar_surface(xyz: np.ndarray, surface: Surface, voxel: float, min_planarity: float, axis: np.ndarray,
                   device: str | torch.device = "cpu") -> tuple[np.ndarray, np.ndarray]:
    """The ``(M, 3)`` voxels that point-to-plane ICP aligns a scan to: ``(K,)`` int64 indices into
    them and their ``(K, 3)`` float64 unit normals, from their ``surface`` (``estimate_surface`` at
    ``voxel``; its covariances are computed again when it has none) and the ``(3,)`` axis the
    sensor's rings are drawn about.

    A voxel whose planarity reaches ``min_planarity`` keeps its normal. Below it the neighbourhood
    is a line. A sparse lidar's ring on the ground is one: its "normal" is any direction across the
    ring, and the rows it gives pull the scan onto the target's rings, which moved with the sensor.
    Such a voxel is looked at again over ``WIDE_NEIGHBOURHOOD`` times the radius, where the next
    rings make it the ground, and kept with that normal when the wider neighbourhood is planar. A
    line that runs along the axis (within 45 deg: a pole, a building's edge, a tree trunk) is no
    ring and keeps its own normal; it fixes a road's length where little else does. The rest (a
    lone ring, a rail across the axis) is left out, unless what remains would hold the
    translation less firmly than ``MIN_PLANAR_AREA`` in some direction (``facing_area``): then
    every voxel with its own normal. ``min_planarity`` 0: every voxel."""
    given = np.asarray(surface.normals, dtype=np.float64)
    if min_planarity <= 0:
        return np.arange(len(xyz)), given
    normals = given.copy()
    keep = np.asarray(surface.planarity) >= min_planarity
    line = np.flatnonzero(~keep)
    if len(line):
        wide = surface_of(torch.as_tensor(_covariances(xyz, WIDE_NEIGHBOURHOOD * NORMAL_RADIUS_VOXELS * voxel,
                                                       device))[torch.as_tensor(line)])
        planar = wide.planarity >= min_planarity
        normals[line[planar]] = wide.normals[planar]
        own = surface.covariances if surface.covariances is not None else estimate_surface(xyz, voxel, device).covariances
        own = own[line]
        along = np.einsum("i,nij,j->n", axis, own, axis) / np.maximum(np.trace(own, axis1=1, axis2=2), 1e-12)
        keep[line[planar | (along > 0.5)]] = True
    picked = np.flatnonzero(keep)
    if facing_area(xyz[picked], normals[picked], voxel) < MIN_PLANAR_AREA:
        return np.arange(len(xyz)), given
    return picked, normals[picked]


def icp_surface(xyz: np.ndarray, voxel: float, min_planarity: float, axis: np.ndarray,
                normals: np.ndarray | None = None) -> tuple[Surface, np.ndarray, np.ndarray]:
    """What a keyframe's registrations ask of its ``(M, 3)`` voxels, in one call on the CPU: their
    surface (``estimate_surface``, its normals replaced by ``normals`` when given, without the
    covariances) and the voxels point-to-plane ICP aligns a scan to (``planar_surface`` about
    ``axis``: ``(K,)`` indices, ``(K, 3)`` normals). Meant for the helper process
    (``PreparedCloud.surface_in``), where Open3D's searches hold no lock a scan's thread waits for."""
    found = estimate_surface(xyz, voxel)
    if normals is not None:
        found = found._replace(normals=normals)
    keep, unit = planar_surface(xyz, found, voxel, min_planarity, axis)
    return found._replace(covariances=None), keep, unit


def facing_area(xyz: np.ndarray, normals: np.ndarray, voxel: float) -> float:
    """m^2 of surface that ``(M, 3)`` voxels of size ``voxel`` with unit ``normals`` offer against
    the weakest translation once rotation is free: the weakest constraint of point-to-plane
    alignment against them (:func:`s2h_ros.degeneracy.weakest_direction`, per row) times their
    number and the voxel's area (one voxel of a plane facing a direction counts its area)."""
    return weakest_direction(xyz, normals).eigenvalue * len(xyz) * voxel ** 2
