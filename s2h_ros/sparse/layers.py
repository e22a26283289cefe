"""Sparse network layers for any dimension D: convolution (odd kernel, stride 1 or 2), transposed
convolution, 1x1 linear (kernel size 1), BatchNorm, ReLU, the residual BasicBlock, skip
concatenation and global pooling.

Parameter names and shapes follow MinkowskiEngine (``kernel`` [K, C_in, C_out], [C_in, C_out] for
kernel size 1, ``bias`` [1, C_out], BatchNorm under ``bn``), so official FCGF / DGR state dicts
load unchanged. Every layer also accepts a ``MinkowskiEngine.SparseTensor`` and then runs
MinkowskiEngine's kernels on the same weights (see :mod:`s2h_ros.sparse.minkowski`).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from s2h_ros.sparse.conv import linear, sparse_conv
from s2h_ros.sparse.tensor import SparseTensor
from s2h_ros.sparse.tensor import cat as _cat


def _minkowski():
    from s2h_ros.sparse import minkowski

    return minkowski


def _is_ours(x) -> bool:
    return isinstance(x, SparseTensor)


class Conv(nn.Module):
    """Sparse convolution; ``stride`` 2 halves the resolution (output coordinates are the input
    coordinates floored to multiples of the new tensor stride). ``kernel_size`` 1 is the 1x1
    linear layer (weights [C_in, C_out])."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3, stride: int = 1,
                 bias: bool = False, dim: int = 3):
        super().__init__()
        if stride not in (1, 2):
            raise ValueError(f"stride must be 1 or 2, got {stride}")
        if kernel_size % 2 == 0 or kernel_size < 1:
            raise ValueError(f"kernel size must be odd, got {kernel_size}")
        if kernel_size == 1 and stride != 1:
            raise ValueError("a 1x1 convolution has stride 1")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size, self.stride, self.dim = kernel_size, stride, dim
        volume = kernel_size**dim
        shape = (in_channels, out_channels) if volume == 1 else (volume, in_channels, out_channels)
        self.kernel = nn.Parameter(torch.empty(shape))
        self.bias = nn.Parameter(torch.zeros(1, out_channels)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """He initialisation for ReLU networks, fan-in = K * C_in (nothing to do on the meta device)."""
        if self.kernel.is_meta:
            return
        fan_in = self.in_channels * self.kernel_size**self.dim
        nn.init.normal_(self.kernel, 0.0, math.sqrt(2.0 / fan_in))
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def _kernel3(self) -> torch.Tensor:
        return self.kernel if self.kernel.ndim == 3 else self.kernel[None]

    def forward(self, x: SparseTensor) -> SparseTensor:
        if not _is_ours(x):
            return _minkowski().conv(self, x)
        if x.dim != self.dim:
            raise ValueError(f"layer is {self.dim}-D, input is {x.dim}-D")
        if self.kernel_size == 1:
            return x.replace(linear(x.feats, self.kernel, self.bias))
        out_stride = x.stride * self.stride
        kmap = x.manager.kernel_map(x.stride, out_stride, self.kernel_size)
        feats = sparse_conv(x.feats, self._kernel3(), kmap, self.bias)
        return SparseTensor(feats, stride=out_stride, manager=x.manager)

    def fold(self, norm: BatchNorm) -> None:
        """Make this convolution compute ``norm(conv(x))`` of an eval-mode BatchNorm by itself:
        BN(y) = s y + (beta - s mu) with s = gamma / sqrt(var + eps) per output channel, so the
        kernel's output columns are scaled by s and the shift becomes (part of) the bias. For
        inference only (``ResUNet.folded``): the BatchNorm's pass over the features goes."""
        bn = norm.bn
        with torch.no_grad():
            scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
            shift = bn.bias - bn.running_mean * scale
            if self.bias is not None:
                shift = shift + self.bias[0] * scale
            self.kernel.mul_(scale)  # the last axis is C_out for both kernel layouts
            self.bias = nn.Parameter(shift[None].clone(), requires_grad=self.kernel.requires_grad)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, bias={self.bias is not None}, dim={self.dim}")


class ConvTranspose(Conv):
    """Transposed (up-)convolution: from tensor stride 2s back to the stride-s coordinates of the
    same input, reusing the kernel map of the strided convolution read backwards."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3, stride: int = 2,
                 bias: bool = False, dim: int = 3):
        super().__init__(in_channels, out_channels, kernel_size, 1, bias, dim)
        if stride not in (1, 2):
            raise ValueError(f"stride must be 1 or 2, got {stride}")
        self.stride = stride

    def forward(self, x: SparseTensor) -> SparseTensor:
        if not _is_ours(x):
            return _minkowski().conv_transpose(self, x)
        if x.stride % self.stride:
            raise ValueError(f"cannot upsample a stride-{x.stride} tensor by {self.stride}")
        out_stride = x.stride // self.stride
        kmap = x.manager.kernel_map(out_stride, x.stride, self.kernel_size).transposed()
        feats = sparse_conv(x.feats, self._kernel3(), kmap, self.bias)
        return SparseTensor(feats, stride=out_stride, manager=x.manager)


class BatchNorm(nn.Module):
    """BatchNorm over the voxels' features (the torch module sits under ``bn`` as in MinkowskiEngine).

    A training batch of a single voxel (the coarsest level of a tiny input) has no batch
    variance; it is normalised with the running statistics instead of raising."""

    def __init__(self, channels: int, momentum: float = 0.1):
        super().__init__()
        self.bn = nn.BatchNorm1d(channels, momentum=momentum)

    def forward(self, x: SparseTensor) -> SparseTensor:
        if not _is_ours(x):
            return _minkowski().apply_features(x, self.bn)
        if self.training and x.feats.shape[0] < 2:
            bn = self.bn
            return x.replace(F.batch_norm(x.feats, bn.running_mean, bn.running_var, bn.weight, bn.bias,
                                          False, 0.0, bn.eps))
        return x.replace(self.bn(x.feats))


def relu(x: SparseTensor, inplace: bool = False) -> SparseTensor:
    """max(0, features), coordinates unchanged. ``inplace``: overwrite ``x``'s features when no
    gradient flows through them (inference; only for a tensor nothing else reads, e.g. a layer's
    fresh output): one allocation fewer."""
    if not _is_ours(x):
        return _minkowski().apply_features(x, torch.relu)
    if inplace and not x.feats.requires_grad:
        return x.replace(torch.relu_(x.feats))
    return x.replace(torch.relu(x.feats))


class ReLU(nn.Module):
    def forward(self, x: SparseTensor) -> SparseTensor:
        return relu(x)


def add(x: SparseTensor, y: SparseTensor, inplace: bool = False) -> SparseTensor:
    """Elementwise sum of two tensors on the same coordinates (residual connections); ``inplace``
    adds ``y`` into ``x``'s features (as for :func:`relu`)."""
    if not _is_ours(x):
        return x + y
    if x.manager is not y.manager or x.stride != y.stride:
        raise ValueError("add needs tensors on the same coordinates")
    if inplace and not (x.feats.requires_grad or y.feats.requires_grad):
        return x.replace(x.feats.add_(y.feats))
    return x.replace(x.feats + y.feats)


def cat(*tensors: SparseTensor) -> SparseTensor:
    """Channel concatenation on shared coordinates (U-Net skips), first tensor's channels first."""
    if not _is_ours(tensors[0]):
        return _minkowski().cat(*tensors)
    return _cat(*tensors)


class BasicBlock(nn.Module):
    """Residual block: relu(x + BN(conv(relu(BN(conv(x)))))) with 3^D kernels, stride 1."""

    def __init__(self, channels: int, momentum: float = 0.1, dim: int = 3):
        super().__init__()
        self.conv1 = Conv(channels, channels, 3, 1, dim=dim)
        self.norm1 = BatchNorm(channels, momentum)
        self.conv2 = Conv(channels, channels, 3, 1, dim=dim)
        self.norm2 = BatchNorm(channels, momentum)

    def forward(self, x: SparseTensor) -> SparseTensor:
        out = relu(self.norm1(self.conv1(x)), inplace=True)  # fresh outputs: in place
        out = self.norm2(self.conv2(out))
        return relu(add(out, x, inplace=True), inplace=True)

    def fold(self) -> None:
        """Both BatchNorms into their convolutions (:func:`fold_batch_norms`)."""
        fold_batch_norms(self, [("conv1", "norm1"), ("conv2", "norm2")])


def fold_batch_norms(module: nn.Module, pairs: list[tuple[str, str]]) -> None:
    """For each (conv, norm) attribute pair of ``module``: the BatchNorm folded into the
    convolution before it (:meth:`Conv.fold`) and replaced by an identity. Inference only."""
    for conv, norm in pairs:
        getattr(module, conv).fold(getattr(module, norm))
        setattr(module, norm, nn.Identity())


def global_pool(x: SparseTensor, mode: str = "avg") -> torch.Tensor:
    """(B, C) mean or max of the features of every batch item."""
    if mode not in ("avg", "max"):
        raise ValueError(f"pooling mode must be 'avg' or 'max', got {mode!r}")
    batch = x.coords[:, 0]
    n = int(batch.max()) + 1
    index = batch[:, None].expand_as(x.feats)
    out = x.feats.new_zeros(n, x.feats.shape[1])
    return out.scatter_reduce(0, index, x.feats, reduce="mean" if mode == "avg" else "amax", include_self=False)


class GlobalPooling(nn.Module):
    """Global average (or max) pooling to one (C,) vector per batch item: (B, C)."""

    def __init__(self, mode: str = "avg"):
        super().__init__()
        self.mode = mode

    def forward(self, x: SparseTensor) -> torch.Tensor:
        return global_pool(x, self.mode)
