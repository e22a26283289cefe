"""Robust point-to-plane ICP on a torch device: the refinement where ``device`` is a GPU.

The pipeline's refinement (``refinement.refine_icp``) is Open3D's point-to-plane ICP with a Tukey
kernel, on the CPU. On a GPU machine that CPU work is as large as the whole device path (measured
on an H200 with a held-out 64-beam drive: registration ICP and the local map's ICP together about
60 ms of a 200 ms step, docs/performance.md), so the same algorithm runs here on the registrar's
device. No maintained library does it on a torch device: Open3D's tensor ICP needs its CUDA build
(not on PyPI for every platform, and a second CUDA runtime beside torch's), small_gicp and
KISS-ICP are CPU-only, pytorch3d's ICP is point-to-point without a robust kernel.

The iteration is Open3D's (``registration_icp`` with ``TransformationEstimationPointToPlane``):

* correspondences: each moved source point's nearest target point within ``max_distance``
  (exact, through a hash grid of cell ``max_distance``, :mod:`s2h_ros.hash_grid`);
* one Gauss-Newton step of ``sum_i w_i ((R s_i + t - q_i) . n_i)^2`` linearised at the moved
  points, ``J_i = [s_i x n_i, n_i]``, Tukey weights ``w_i = (1 - (r_i / k)^2)^2`` for
  ``|r_i| < k`` (else 0), the update ``Rz(c) Ry(b) Rx(a)`` and ``t`` applied on the left;
* stop when fitness and inlier RMSE change by less than ``tolerance`` (absolute, as Open3D's
  ``ICPConvergenceCriteria`` compares them) or after ``iterations``.

Coordinates are shifted by the initial sensor position before they become float32, so a map
kilometres from the origin keeps sub-millimetre resolution; the 6x6 system is accumulated and
solved in float64. Tests compare it with Open3D on the real KITTI pair (test_icp.py).
"""
from __future__ import annotations

import numpy as np
import torch

from s2h_ros.geometry import apply_transform
from s2h_ros.hash_grid import HashGrid


def _euler_update(x: np.ndarray) -> np.ndarray:
    """``(4, 4)`` of the step ``x = [a, b, c, tx, ty, tz]``: ``Rz(c) Ry(b) Rx(a)`` and ``t``."""
    from scipy.spatial.transform import Rotation

    T = np.eye(4)
    T[:3, :3] = Rotation.from_euler("xyz", x[:3]).as_matrix()  # extrinsic x, y, z = Rz Ry Rx
    T[:3, 3] = x[3:]
    return T


def point_to_plane_icp(source: np.ndarray, target: np.ndarray, target_normals: np.ndarray, init: np.ndarray,
                       max_distance: float, kernel: float, tolerance: float, iterations: int,
                       device: str | torch.device = "cpu") -> np.ndarray:
    """``(4, 4)`` float64 transform refining ``init`` (maps ``(N, 3)`` ``source`` into ``target``'s
    frame) by robust point-to-plane ICP against ``(M, 3)`` ``target`` with unit normals.

    ``kernel``: the Tukey parameter k (metres)."""
    init = np.asarray(init, dtype=np.float64)
    device = torch.device(device)
    shift = init[:3, 3].copy()
    src = torch.as_tensor(apply_transform(init, np.asarray(source, dtype=np.float64)) - shift, dtype=torch.float32, device=device)
    grid = HashGrid(torch.as_tensor(np.asarray(target, np.float64) - shift, dtype=torch.float32, device=device),
                    max_distance)
    normals = torch.as_tensor(np.asarray(target_normals), dtype=torch.float32, device=device)
    update = np.eye(4)  # accumulated, in the shifted frame
    moved = src

    def linearised(points: torch.Tensor) -> tuple[np.ndarray, np.ndarray, float, float]:
        """JTJ (6, 6), JTr (6,), fitness and inlier RMSE at ``points``: one transfer, one sync."""
        d2, idx = grid.nearest(points)
        ok = idx >= 0
        safe = idx.clamp_min(0)
        q, nq = grid.points[safe], normals[safe]
        r = ((points - q) * nq).sum(1)
        w = torch.where(ok & (r.abs() < kernel), (1 - (r / kernel) ** 2) ** 2, torch.zeros_like(r)).double()
        J = torch.cat([torch.linalg.cross(points, nq), nq], 1).double()
        Jw = J * w[:, None]
        packed = torch.cat([(Jw.T @ J).flatten(), Jw.T @ r.double(), ok.sum().double()[None],
                            torch.where(ok, d2, 0.0).sum().double()[None]]).cpu().numpy()
        n = packed[42]
        return packed[:36].reshape(6, 6), packed[36:42], n / max(1, len(points)), float(np.sqrt(packed[43] / n)) if n else 0.0

    JTJ, JTr, fitness, rmse = linearised(moved)
    for _ in range(iterations):
        if fitness == 0.0:
            break
        try:
            x = np.linalg.solve(JTJ, -JTr)
        except np.linalg.LinAlgError:
            break
        step = _euler_update(x)
        update = step @ update
        step_t = torch.as_tensor(step, dtype=torch.float32, device=device)
        moved = moved @ step_t[:3, :3].T + step_t[:3, 3]
        previous = (fitness, rmse)
        JTJ, JTr, fitness, rmse = linearised(moved)
        if abs(previous[0] - fitness) < tolerance and abs(previous[1] - rmse) < tolerance:
            break
    to_shifted, back = np.eye(4), np.eye(4)
    to_shifted[:3, 3], back[:3, 3] = -shift, shift
    return back @ update @ to_shifted @ init

