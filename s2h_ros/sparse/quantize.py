"""Voxel quantisation of point coordinates: the entry to every sparse network.

``sparse_quantize`` keeps one point per occupied voxel (the first one met, as MinkowskiEngine's
``sparse_quantize`` does), so features stay tied to real measured points.
"""
from __future__ import annotations

import numpy as np
import torch


_GRID_LIMIT = 2.0**61  # |floor(x / voxel)| below this: cell indices and their differences fit int64


def as_points(xyz: np.ndarray | torch.Tensor, dim: int | None = None, name: str = "points") -> torch.Tensor:
    """Validate an (N, D) float array/tensor and return it as a float tensor (device kept)."""
    t = torch.as_tensor(xyz)
    if t.ndim != 2 or (dim is not None and t.shape[1] != dim):
        want = f"(N, {dim})" if dim is not None else "(N, D)"
        raise ValueError(f"{name} must have shape {want}, got {tuple(t.shape)}")
    if t.shape[0] == 0:
        raise ValueError(f"{name} is empty (0 points)")
    if not t.is_floating_point():
        t = t.double()
    if not torch.isfinite(t).all():
        raise ValueError(f"{name} contains NaN or infinite coordinates")
    return t


def sparse_quantize(
    xyz: np.ndarray | torch.Tensor, voxel: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantise (N, D) float coordinates on a grid of size ``voxel``.

    Returns ``coords`` (M, D) int64 = floor(x / voxel) of the occupied voxels, ``unique_index``
    (M,) int64, the first input point of each voxel, and ``inverse`` (N,) int64 mapping every
    point to its voxel, so that ``coords[inverse] == floor(xyz / voxel)``.
    """
    if not voxel > 0:
        raise ValueError(f"voxel size must be positive, got {voxel}")
    pts = as_points(xyz)
    scaled = torch.floor(pts / voxel)
    reach = float(scaled.abs().max())
    if reach >= _GRID_LIMIT:  # .long() would wrap around and the keys would be garbage
        raise ValueError(
            f"coordinates reach {reach * voxel:.3g}, beyond the int64 voxel grid at voxel {voxel} "
            f"(|x| / voxel must stay below 2^61): centre or crop the cloud"
        )
    grid = scaled.long()
    from s2h_ros.sparse.kernel_map import unique_rows

    coords, inverse = unique_rows(grid)
    # First point of every voxel: the smallest point index among those mapped to it.
    n = inverse.numel()
    order = torch.arange(n, device=grid.device)
    unique_index = torch.full((coords.shape[0],), n, dtype=torch.long, device=grid.device)
    unique_index = unique_index.scatter_reduce(0, inverse, order, reduce="amin")
    return coords, unique_index, inverse
