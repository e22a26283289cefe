"""The residual sparse U-Net of FCGF (``ResUNetBN2C``), for any dimension D.

One network serves both models of DGR: the 3-D FCGF feature extractor and the 6-D inlier network
over correspondences. Four levels, three stride-2 downsamplings; each level is conv -> BN ->
BasicBlock (ending in a ReLU); the decoder concatenates the transposed-conv output with the encoder skip
(transposed first), and a 1x1 conv -> ReLU -> 1x1 conv (with bias) gives the output. Module names
equal the official ones, so official state dicts load unchanged.
"""
from __future__ import annotations

from copy import deepcopy
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from s2h_ros.sparse import BasicBlock, BatchNorm, Conv, ConvTranspose, SparseTensor, cat, relu
from s2h_ros.sparse.layers import fold_batch_norms


@dataclass
class ResUNetConfig:
    """Shape of a ResUNet: ``channels`` are the encoder widths per level (stride 1, 2, 4, 8),
    ``tr_channels`` the decoder widths at the same levels."""

    in_channels: int = 1
    out_channels: int = 32
    channels: list[int] = field(default_factory=lambda: [32, 64, 128, 256])
    tr_channels: list[int] = field(default_factory=lambda: [64, 64, 64, 128])
    conv1_kernel_size: int = 5
    dim: int = 3
    normalize: bool = True
    bn_momentum: float = 0.1

    def __post_init__(self):
        self.channels, self.tr_channels = list(self.channels), list(self.tr_channels)
        if len(self.channels) != 4 or len(self.tr_channels) != 4:
            raise ValueError("channels and tr_channels need 4 entries (levels at stride 1, 2, 4, 8)")

    def to_dict(self) -> dict:
        return asdict(self)


class ResUNet(nn.Module):
    """Sparse residual U-Net: SparseTensor (N, in_channels) -> SparseTensor (N, out_channels) on the
    input's coordinates, rows L2-normalised when ``config.normalize``."""

    def __init__(self, config: ResUNetConfig | None = None):
        super().__init__()
        self.config = c = config or ResUNetConfig()
        ch, tr, d, m = c.channels, c.tr_channels, c.dim, c.bn_momentum
        self.conv1 = Conv(c.in_channels, ch[0], c.conv1_kernel_size, 1, dim=d)
        self.norm1 = BatchNorm(ch[0], m)
        self.block1 = BasicBlock(ch[0], m, d)
        for i in (2, 3, 4):  # encoder: stride-2 conv, BN, residual block
            setattr(self, f"conv{i}", Conv(ch[i - 2], ch[i - 1], 3, 2, dim=d))
            setattr(self, f"norm{i}", BatchNorm(ch[i - 1], m))
            setattr(self, f"block{i}", BasicBlock(ch[i - 1], m, d))
        for i in (4, 3, 2):  # decoder: transposed conv of [previous decoder output | skip], BN, block
            width = ch[3] if i == 4 else ch[i - 1] + tr[i]
            setattr(self, f"conv{i}_tr", ConvTranspose(width, tr[i - 1], 3, 2, dim=d))
            setattr(self, f"norm{i}_tr", BatchNorm(tr[i - 1], m))
            setattr(self, f"block{i}_tr", BasicBlock(tr[i - 1], m, d))
        self.conv1_tr = Conv(ch[0] + tr[1], tr[0], 1, 1, dim=d)
        self.final = Conv(tr[0], c.out_channels, 1, 1, bias=True, dim=d)

    def forward(self, x: SparseTensor) -> SparseTensor:
        # The official network also applies a ReLU to each block's output; a BasicBlock ends in
        # one, so those are identities and are left out (the same numbers, seven passes fewer).
        s1 = self.block1(self.norm1(self.conv1(x)))
        s2 = self.block2(self.norm2(self.conv2(s1)))
        s4 = self.block3(self.norm3(self.conv3(s2)))
        s8 = self.block4(self.norm4(self.conv4(s4)))
        out = self.block4_tr(self.norm4_tr(self.conv4_tr(s8)))
        out = self.block3_tr(self.norm3_tr(self.conv3_tr(cat(out, s4))))
        out = self.block2_tr(self.norm2_tr(self.conv2_tr(cat(out, s2))))
        out = self.final(relu(self.conv1_tr(cat(out, s1)), inplace=True))
        if self.config.normalize:
            out = _normalize_rows(out)
        return out

    def folded(self) -> ResUNet:
        """An inference copy (eval mode, no gradients) with every BatchNorm folded into the
        convolution before it (:meth:`s2h_ros.sparse.Conv.fold`): the same function of the input up
        to float rounding, without the BatchNorm passes (one pass over the features and one kernel
        launch each; 21 of them in FCGF). The original is unchanged."""
        copy = deepcopy(self).eval().requires_grad_(False)
        fold_batch_norms(copy, [("conv1", "norm1")] + [(f"conv{i}", f"norm{i}") for i in (2, 3, 4)]
                         + [(f"conv{i}_tr", f"norm{i}_tr") for i in (4, 3, 2)])
        for block in [m for m in copy.modules() if isinstance(m, BasicBlock)]:
            block.fold()
        return copy


def _normalize_rows(x: SparseTensor) -> SparseTensor:
    from s2h_ros.sparse.layers import _is_ours

    if not _is_ours(x):
        from s2h_ros.sparse import minkowski

        return minkowski.apply_features(x, _unit_rows)
    return x.replace(_unit_rows(x.feats))


def _unit_rows(f: torch.Tensor) -> torch.Tensor:
    """f / ||f||_2 per row (zero rows stay zero)."""
    return f / f.norm(dim=1, keepdim=True).clamp_min(1e-12)


def config_from_state_dict(state: dict[str, torch.Tensor], dim: int, normalize: bool) -> ResUNetConfig:
    """Read the widths and first kernel size of a ResUNet off its weights (official files carry
    no safely loadable config)."""
    def w(name: str) -> torch.Tensor:
        if name not in state:
            raise KeyError(f"state dict has no {name!r}: not a ResUNet checkpoint")
        return state[name]

    conv1 = w("conv1.kernel")
    volume = conv1.shape[0] if conv1.ndim == 3 else 1
    k = round(volume ** (1.0 / dim))
    if k**dim != volume:
        raise ValueError(f"conv1.kernel has {volume} offsets: not a cubic kernel in {dim}-D")
    return ResUNetConfig(
        in_channels=conv1.shape[-2],
        out_channels=w("final.kernel").shape[-1],
        channels=[w(f"conv{i}.kernel").shape[-1] for i in (1, 2, 3, 4)],
        tr_channels=[w(f"conv{i}_tr.kernel").shape[-1] for i in (1, 2, 3, 4)],
        conv1_kernel_size=k,
        dim=dim,
        normalize=normalize,
    )
