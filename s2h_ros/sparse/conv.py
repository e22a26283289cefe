"""Sparse convolution as gather / matmul / scatter over a kernel map:

    y[o] = sum_k sum_{(i, o) in map_k} W_k^T x[i]        (W: [K, C_in, C_out], MinkowskiEngine layout)

Only plain differentiable torch ops are used (``index_select``, ``@``, ``index_add_``), so autograd,
double precision (gradcheck) and any device come for free; on CPU the result is deterministic.
"""
from __future__ import annotations

import torch

from s2h_ros.sparse.kernel_map import KernelMap


def sparse_conv(feats: torch.Tensor, kernel: torch.Tensor, kmap: KernelMap) -> torch.Tensor:
    """(N_in, C_in) features, [K, C_in, C_out] kernel -> (N_out, C_out) features."""
    if feats.shape[0] != kmap.n_in:
        raise ValueError(f"features have {feats.shape[0]} rows, kernel map expects {kmap.n_in}")
    # unbind once: indexing kernel[k] per offset would make autograd add a full-size zero
    # gradient per offset (quadratic in K, which is 729 in 6-D)
    weights = kernel.unbind(0)
    if kmap.identity is not None:  # centre offset of a stride-1 map: a plain matmul, no scatter
        out = feats @ weights[kmap.identity]
    else:
        out = feats.new_zeros(kmap.n_out, kernel.shape[-1])
    for k, i, o in zip(kmap.kernel_ids, kmap.in_idx, kmap.out_idx):
        out.index_add_(0, o, feats.index_select(0, i) @ weights[k])
    return out
