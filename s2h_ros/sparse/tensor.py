"""The sparse tensor: integer voxel coordinates with a batch index, features, and a tensor stride.

Like MinkowskiEngine's ``SparseTensor``: row n of ``feats`` lives at ``coords[n] = [batch, x_1 ..
x_D]`` (stride-1 voxel units, multiples of ``stride``). Tensors derived from one input share a
:class:`CoordinateManager`, which caches coordinates per stride and kernel maps.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from s2h_ros.sparse.kernel_map import CoordinateManager
from s2h_ros.sparse.quantize import as_points, sparse_quantize


class SparseTensor:
    """Features (N, C) on coordinates (N, 1 + D) int64 at tensor ``stride``."""

    def __init__(self, feats: torch.Tensor, coords: torch.Tensor | None = None, stride: int = 1,
                 manager: CoordinateManager | None = None):
        if manager is None:
            if coords is None:
                raise ValueError("SparseTensor needs coordinates or a coordinate manager")
            manager = CoordinateManager(torch.as_tensor(coords, device=feats.device))
            if stride != 1:
                raise ValueError("a new SparseTensor starts at stride 1")
        coords = manager.coordinates(stride)
        if feats.ndim != 2 or feats.shape[0] != coords.shape[0]:
            raise ValueError(f"features must be (N, C) with N = {coords.shape[0]} coordinates, got {tuple(feats.shape)}")
        self.feats = feats
        self.stride = stride
        self.manager = manager

    @property
    def coords(self) -> torch.Tensor:
        """(N, 1 + D) int64 [batch, x_1 .. x_D]."""
        return self.manager.coordinates(self.stride)

    @property
    def dim(self) -> int:
        return self.manager.dim

    @property
    def device(self) -> torch.device:
        return self.feats.device

    def __len__(self) -> int:
        return self.feats.shape[0]

    def replace(self, feats: torch.Tensor) -> SparseTensor:
        """Same coordinates, new features (e.g. after BatchNorm or ReLU)."""
        return SparseTensor(feats, stride=self.stride, manager=self.manager)

    def __repr__(self) -> str:
        return f"SparseTensor(N={len(self)}, C={self.feats.shape[1]}, D={self.dim}, stride={self.stride})"

    @classmethod
    def from_points(cls, xyz: np.ndarray | torch.Tensor | Sequence, voxel: float,
                    feats: np.ndarray | torch.Tensor | None = None,
                    device: torch.device | str | None = None) -> SparseTensor:
        """Quantise one (N, D) cloud, or a list of clouds (one batch index each), on a ``voxel`` grid.

        Features default to ones (N, 1), the input of FCGF and DGR; given ``feats`` (N, C), each
        voxel keeps those of its first point. Row order: sorted by (batch, x_1, .., x_D).
        """
        clouds = list(xyz) if isinstance(xyz, (list, tuple)) else [xyz]
        if feats is not None and len(clouds) != 1:
            raise ValueError("per-point features are supported for a single cloud")
        rows, values = [], []
        for b, cloud in enumerate(clouds):
            pts = as_points(cloud, name=f"cloud {b}")
            if device is not None:
                pts = pts.to(device)
            coords, first, _ = sparse_quantize(pts, voxel)
            rows.append(torch.cat([coords.new_full((coords.shape[0], 1), b), coords], 1))
            if feats is None:
                values.append(torch.ones(coords.shape[0], 1, device=coords.device))
            else:
                f = torch.as_tensor(feats, device=coords.device, dtype=torch.float32)
                if f.ndim != 2 or f.shape[0] != pts.shape[0]:
                    raise ValueError(f"feats must be (N, C) with N = {pts.shape[0]}, got {tuple(f.shape)}")
                values.append(f[first])
        if len({r.shape[1] for r in rows}) != 1:
            raise ValueError("all clouds of a batch must have the same dimension")
        # sparse_quantize returns sorted rows and batches come in order: rows are sorted already
        return cls(torch.cat(values), torch.cat(rows))


def cat(*tensors: SparseTensor) -> SparseTensor:
    """Channel concatenation of tensors on the same coordinates (U-Net skip connections)."""
    first = tensors[0]
    for t in tensors[1:]:
        if t.manager is not first.manager or t.stride != first.stride:
            raise ValueError("cat needs tensors on the same coordinates (same manager and stride)")
    return first.replace(torch.cat([t.feats for t in tensors], 1))
