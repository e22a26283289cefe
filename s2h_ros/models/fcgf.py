"""FCGF: fully convolutional geometric features (Choy et al. 2019), the ResUNet over a voxelised
cloud with ones as input features, giving one L2-normalised descriptor per voxel.

Presets: ``kitti`` is the official KITTI model (ResUNetBN2C, 32-D output, first kernel 5, widths
[32, 64, 128, 256] / [64, 64, 64, 128], voxel 0.3 m; loads the official checkpoint unchanged);
``compact`` is a narrow variant small enough (about 1 MB of weights) to ship in the repository.
"""
from __future__ import annotations

import weakref

import numpy as np
import torch

from s2h_ros.models.resunet import ResUNet, ResUNetConfig
from s2h_ros.sparse import SparseTensor, sparse_quantize
from s2h_ros.sparse.quantize import as_points

PRESETS: dict[str, ResUNetConfig] = {
    "kitti": ResUNetConfig(in_channels=1, out_channels=32, channels=[32, 64, 128, 256],
                           tr_channels=[64, 64, 64, 128], conv1_kernel_size=5, dim=3, normalize=True),
    "compact": ResUNetConfig(in_channels=1, out_channels=32, channels=[16, 32, 64, 64],
                             tr_channels=[32, 32, 32, 64], conv1_kernel_size=3, dim=3, normalize=True),
}
DEFAULT_VOXEL = 0.3  # metres, the KITTI setting of FCGF and DGR


def fcgf_config(preset: str = "kitti") -> ResUNetConfig:
    """A fresh copy of a preset's configuration."""
    if preset not in PRESETS:
        raise ValueError(f"unknown FCGF preset {preset!r} (choose from {', '.join(PRESETS)})")
    return ResUNetConfig(**PRESETS[preset].to_dict())


def build_fcgf(preset: str | ResUNetConfig = "kitti") -> ResUNet:
    """An FCGF network (random weights) of a preset name or an explicit configuration."""
    config = preset if isinstance(preset, ResUNetConfig) else fcgf_config(preset)
    if config.dim != 3:
        raise ValueError(f"FCGF works on 3-D points, config has dim={config.dim}")
    return ResUNet(config)


@torch.no_grad()
def extract_features(model: ResUNet, xyz: np.ndarray | torch.Tensor, voxel: float = DEFAULT_VOXEL,
                     device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Voxelise a (N, 3) cloud and run FCGF in eval mode.

    Returns ``voxel_xyz`` (M, 3) float32, the first input point of each occupied voxel (real
    measured positions, as FCGF/DGR use them for Procrustes; a numpy array when ``xyz`` is one,
    else a tensor on ``device``), and ``feats`` (M, C) float32 torch tensor on ``device`` (default:
    the model's device), the unit-norm descriptors of those voxels, row i belonging to point i.
    """
    pts, first, _, feats = _forward(model, xyz, voxel, device)
    voxel_xyz = pts[first]
    if isinstance(xyz, np.ndarray):
        voxel_xyz = voxel_xyz.cpu().numpy()
    return voxel_xyz, feats


@torch.no_grad()
def point_features(model: ResUNet, xyz: np.ndarray | torch.Tensor, voxel: float = DEFAULT_VOXEL,
                   device: torch.device | str | None = None) -> torch.Tensor:
    """``(N, C)`` float32 descriptors of every point of a ``(N, 3)`` cloud: the descriptor of the
    voxel it falls in (row i belongs to ``xyz[i]``, whatever order the voxels have). Used for a
    cloud whose voxels are already chosen, e.g. the same voxels turned to another heading."""
    _, _, inverse, feats = _forward(model, xyz, voxel, device)
    return feats[inverse]


_FOLDED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _inference_copy(model: ResUNet) -> ResUNet:
    """``model.folded()`` (BatchNorms folded into the convolutions), made once per model and
    again whenever any of its parameters or buffers changed (training steps, ``load_state_dict``,
    ``to(device)``: the tensors' storage or in-place version counters differ)."""
    state = tuple((t.data_ptr(), t._version) for t in model.state_dict().values())
    cached = _FOLDED.get(model)
    if cached is None or cached[0] != state:
        cached = _FOLDED[model] = (state, model.folded())
    return cached[1]


def _forward(model: ResUNet, xyz: np.ndarray | torch.Tensor, voxel: float, device: torch.device | str | None):
    """FCGF in eval mode on the voxels of ``xyz``: the points as a tensor on ``device`` (default:
    the model's), each voxel's first point, each point's voxel, and the voxels' descriptors."""
    if device is None:
        device = next(model.parameters()).device
    model = _inference_copy(model.to(device).eval())
    pts = as_points(xyz, 3, "xyz").to(device=device, dtype=torch.float32)
    coords, first, inverse = sparse_quantize(pts, voxel)  # sorted rows, as SparseTensor.from_points has them
    x = SparseTensor(torch.ones(len(coords), 1, device=device), torch.cat([coords.new_zeros(len(coords), 1), coords], 1))
    return pts, first, inverse, model(x).feats
