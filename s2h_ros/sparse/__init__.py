"""Sparse tensors and sparse convolution for D-dimensional voxel grids (pure PyTorch; the optional
MinkowskiEngine backend runs the same layers when installed)."""
from __future__ import annotations

from s2h_ros.sparse.kernel_map import CoordinateManager, KernelMap, build_kernel_map, kernel_offsets
from s2h_ros.sparse.layers import (
    BasicBlock,
    BatchNorm,
    Conv,
    ConvTranspose,
    GlobalPooling,
    ReLU,
    add,
    cat,
    global_pool,
    relu,
)
from s2h_ros.sparse.quantize import sparse_quantize
from s2h_ros.sparse.tensor import SparseTensor
from s2h_ros.sparse.conv import sparse_conv

__all__ = [
    "BasicBlock", "BatchNorm", "Conv", "ConvTranspose", "CoordinateManager", "GlobalPooling", "KernelMap",
    "ReLU", "SparseTensor", "add", "build_kernel_map", "cat", "global_pool", "kernel_offsets", "relu",
    "sparse_conv", "sparse_quantize",
]
