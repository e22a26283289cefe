"""Each voxel's local surface: its normal and planarity, from the covariance of its neighbourhood.

A voxel's neighbourhood is its ``NEIGHBOURS`` nearest voxels (itself included) within ``radius``
(``NORMAL_RADIUS_VOXELS`` voxel sizes for the registration's normals). Its normal is the
eigenvector of the smallest eigenvalue of the neighbourhood's covariance; its planarity is
``(s2 - s3) / s1`` for the square roots ``s1 >= s2 >= s3`` of the eigenvalues (about 1 on a sampled
surface, 0 on a line or a blob: :mod:`s2h_ros.degeneracy` says why it weights the alignment's rows).
A neighbourhood of fewer than 3 voxels has no surface: normal ``(0, 0, 1)``, planarity 0.

Two ways to compute it, the same numbers (test_surface.py, on the real KITTI scan):

- **CPU** (``device`` "cpu"): Open3D (``estimate_normals``, ``estimate_covariances``), the faster
  there: 27 ms for a KITTI scan's 20k voxels on the 2-core VM, where the way below takes 80-100 ms.
- **GPU** (any other device): the neighbours from scipy's ``cKDTree`` on all cores, the covariances
  in torch on the device, their eigen-decomposition in torch on the CPU (``normals_and_planarity``). Open3D holds Python's global interpreter
  lock for the whole of each call (measured: a Python thread beside three normal estimations made
  no progress for their 2.4 s). On a GPU machine the odometry prepares the next scan, the new
  keyframe and the local map on helper threads while its worker drives the GPU; each Open3D call
  there would stall the worker. scipy's queries and torch release the lock.
"""
from __future__ import annotations

import numpy as np
import torch

# Neighbourhood of a normal for point-to-plane ICP: the 30 nearest voxels within this many voxel
# sizes. Dense scans reach 30 neighbours within about 1 m at 0.3 m voxels either way; on sparse
# scans (16 beams) a 2-voxel radius holds only points of one ring, a line whose PCA "normal" lies
# in the ground plane, and ICP then slides the scan onto the rings that move with the sensor
# (measured: 0.4-2 m wrong, trusted steps on a VLP-16 drive; none with 5 voxels).
NORMAL_RADIUS_VOXELS = 5.0
NEIGHBOURS = 30
# Voxels whose neighbourhoods are gathered at once on the GPU path (bounds its memory: 30
# neighbours x 3 coordinates x 8 bytes x 65,536 = 47 MB).
_CHUNK = 65_536


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
    voxels' neighbourhoods, on ``device``, and ``(M,)`` int64 ``n``. Coordinates are taken relative to
    each voxel before the sums, so clouds far from their origin keep their precision."""
    from scipy.spatial import cKDTree

    xyz = np.asarray(xyz, dtype=np.float64)
    dist, idx = cKDTree(xyz).query(xyz, k=min(max_nn, len(xyz)), distance_upper_bound=radius, workers=-1)
    dist, idx = dist.reshape(len(xyz), -1), idx.reshape(len(xyz), -1)
    points = torch.as_tensor(xyz, device=device)
    valid = torch.as_tensor(np.isfinite(dist), device=device)
    neighbours = torch.as_tensor(np.where(np.isfinite(dist), idx, 0), device=device)
    covariances, counts = [], []
    for lo in range(0, len(xyz), _CHUNK):
        ok = valid[lo:lo + _CHUNK]
        d = (points[neighbours[lo:lo + _CHUNK]] - points[lo:lo + _CHUNK, None]) * ok[..., None]
        n = ok.sum(1)
        mean = d.sum(1) / n[:, None]
        covariances.append(d.transpose(1, 2) @ d / n[:, None, None] - mean[:, :, None] * mean[:, None, :])
        counts.append(n)
    return torch.cat(covariances), torch.cat(counts)


def normals_and_planarity(covariances: torch.Tensor, counts: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """``(M, 3)`` unit normals and ``(M,)`` planarity of the neighbourhoods of ``local_covariances``.
    The eigen-decomposition runs on the CPU whatever the device. Measured on an H200 (torch 2.11,
    CUDA 13): torch's batched ``eigh`` of 20,000 3 x 3 matrices on the GPU took 224 ms and 10 GB of
    GPU memory, of 65,536 it failed (cuSOLVER internal error), the odometry's GPU memory peaked at
    23-26 GB with it against 0.5 GB without, and its first call from two threads at once failed
    ("lazy wrapper should be called at most once"). On the CPU: 20 ms for 20,000 on this project's
    2-core VM, 118 ms on that machine's CPU (on a helper thread, off the scan's path)."""
    values, vectors = torch.linalg.eigh(covariances.cpu())  # ascending
    normals, planarity = vectors[:, :, 0].numpy().copy(), _planarity(values.numpy())
    none = counts.cpu().numpy() < 3
    normals[none] = (0.0, 0.0, 1.0)
    planarity[none] = 0.0
    return normals, planarity


def _planarity(eigenvalues: np.ndarray) -> np.ndarray:
    """``(M,)`` ``(s2 - s3) / s1`` in [0, 1] of ``(M, 3)`` ascending covariance eigenvalues (module
    text); 0 where a neighbourhood has no spread."""
    s = np.sqrt(np.maximum(eigenvalues, 0.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        planarity = (s[:, 1] - s[:, 0]) / s[:, 2]
    return np.clip(np.nan_to_num(planarity, nan=0.0, posinf=0.0, neginf=0.0), 0.0, 1.0)


def estimate_surface(xyz: np.ndarray, voxel: float, device: str | torch.device = "cpu", normals: bool = True,
                     planarity: bool = True) -> tuple[np.ndarray | None, np.ndarray | None]:
    """``(M, 3)`` float64 unit normals and ``(M,)`` planarity of ``(M, 3)`` voxels of size ``voxel``,
    each when asked (None otherwise); on a GPU device both, from one neighbour search."""
    radius = NORMAL_RADIUS_VOXELS * voxel
    if on_device(device):
        return normals_and_planarity(*local_covariances(xyz, radius, NEIGHBOURS, device))
    cloud, search = _open3d_cloud(xyz), _open3d_search(radius)
    unit = flatness = None
    if normals:
        cloud.estimate_normals(search)
        unit = np.asarray(cloud.normals)
    if planarity:
        cloud.estimate_covariances(search)
        flatness = _planarity(np.linalg.eigvalsh(np.asarray(cloud.covariances)))
    return unit, flatness


def estimate_normals(xyz: np.ndarray, voxel: float, device: str | torch.device = "cpu") -> np.ndarray:
    """``(M, 3)`` float64 unit normals of ``(M, 3)`` voxels of size ``voxel`` (module text)."""
    return estimate_surface(xyz, voxel, device, planarity=False)[0]
