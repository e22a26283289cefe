"""DGR's inlier network: a 6-D sparse ResUNet over correspondences.

Each correspondence (x_src, x_tgt) becomes one point of a 6-D grid, the concatenation of the two
voxel coordinates floor(x / voxel) (DGR quantises the 6-D coordinates of the voxelised pair with
ones as features); the network gives one logit per occupied 6-D voxel, and the inlier weight is
sigmoid(logit). Correspondences that fall in the same 6-D voxel share its logit.
"""
from __future__ import annotations

import numpy as np
import torch

from s2h_ros.models.resunet import ResUNet, ResUNetConfig
from s2h_ros.sparse import SparseTensor
from s2h_ros.sparse.quantize import as_points, sparse_quantize

# DGR's inlier model: ResUNetBN2C in 6-D, ones in, one logit out, first kernel 3, no normalisation.
DGR_INLIER = ResUNetConfig(in_channels=1, out_channels=1, channels=[32, 64, 128, 256],
                           tr_channels=[64, 64, 64, 128], conv1_kernel_size=3, dim=6, normalize=False)
COMPACT_INLIER = ResUNetConfig(in_channels=1, out_channels=1, channels=[8, 16, 32, 32],
                               tr_channels=[16, 16, 16, 32], conv1_kernel_size=3, dim=6, normalize=False)
PRESETS = {"dgr": DGR_INLIER, "compact": COMPACT_INLIER}


class InlierNetwork(ResUNet):
    """(x_src (N, 3), x_tgt (N, 3)) -> (N,) inlier logits; state-dict keys are DGR's
    ``state_dict_inlier`` keys (``conv1.kernel`` [3^6 = 729, 1, 32], ...)."""

    def __init__(self, preset: str | ResUNetConfig = "dgr"):
        if isinstance(preset, str):
            if preset not in PRESETS:
                raise ValueError(f"unknown inlier preset {preset!r} (choose from {', '.join(PRESETS)})")
            preset = ResUNetConfig(**PRESETS[preset].to_dict())
        if preset.dim != 6 or preset.out_channels != 1 or preset.normalize:
            raise ValueError("the inlier network is 6-D with one un-normalised output channel")
        super().__init__(preset)

    def forward(self, src_xyz: torch.Tensor | np.ndarray, tgt_xyz: torch.Tensor | np.ndarray,
                voxel: float) -> torch.Tensor:
        """One logit per correspondence row; inputs are metric points (or any units of ``voxel``)."""
        src = as_points(src_xyz, 3, "source points of the correspondences")
        tgt = as_points(tgt_xyz, 3, "target points of the correspondences")
        if src.shape[0] != tgt.shape[0]:
            raise ValueError(f"correspondence sides differ in length: {src.shape[0]} vs {tgt.shape[0]}")
        device = self.conv1.kernel.device
        six = torch.cat([src, tgt], 1).to(device)
        coords, _, inverse = sparse_quantize(six, voxel)
        x = SparseTensor(torch.ones(coords.shape[0], 1, device=device),
                         torch.cat([coords.new_zeros(coords.shape[0], 1), coords], 1))
        return super().forward(x).feats[inverse, 0]

    def weights(self, src_xyz, tgt_xyz, voxel: float, threshold: float = 0.05) -> torch.Tensor:
        """DGR's inlier weights: sigmoid(logit), zeroed below ``threshold``."""
        w = torch.sigmoid(self(src_xyz, tgt_xyz, voxel))
        return torch.where(w < threshold, torch.zeros_like(w), w)


@torch.no_grad()
def correspondence_weights(net: InlierNetwork, src_xyz: np.ndarray | torch.Tensor, tgt_xyz: np.ndarray | torch.Tensor,
                           voxel: float, device: torch.device | str | None = None) -> np.ndarray:
    """(N,) float32 inlier probabilities sigmoid(logit) of correspondences (x_src_i, x_tgt_i), in
    eval mode; thresholding (DGR: below 0.05 -> 0) is the caller's choice."""
    if device is not None:
        net = net.to(device)
    logits = net.eval()(src_xyz, tgt_xyz, voxel)
    return torch.sigmoid(logits).float().cpu().numpy()
