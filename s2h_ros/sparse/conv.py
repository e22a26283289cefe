"""Sparse convolution over a kernel map:

    y[o] = sum_k sum_{(i, o) in map_k} W_k^T x[i]        (W: [K, C_in, C_out], MinkowskiEngine layout)

Two evaluations of the same sum, both plain differentiable torch ops (autograd, double precision
for gradcheck and any device come for free; on CPU the result is deterministic):

- **neighbour table** (GPUs): every output row's input row per occupied offset, ``(N_out, K')``
  (``KernelMap.neighbour_table``); one gather makes ``(N_out, K' C_in)`` and one matmul with the
  stacked kernel gives y. Three kernel launches per convolution: the per-offset loop below was
  launch-bound there (H200, simulated HDL-64 scan: about 1,700 launches and 44 ms of CPU time per
  FCGF forward against 7 ms of GPU work).
- **per offset** ``index_select`` / ``@`` / ``index_add_`` (CPUs, and on any device when the table
  would hold more than ``TABLE_BUDGET`` values, e.g. the 6-D inlier network's hundreds of offsets
  over many correspondences). On a CPU the table multiplies every missing neighbour by its weight
  (a lidar surface fills about a third of the 27 offsets) and was slower: 731 vs 294 ms per FCGF
  forward of a 14.5k-voxel scan on the loaded 2-core VM.
"""
from __future__ import annotations

import torch

from s2h_ros.sparse.kernel_map import KernelMap

TABLE_BUDGET = 1 << 26  # gathered values (N_out x K' x C_in): 256 MB in float32


def sparse_conv(feats: torch.Tensor, kernel: torch.Tensor, kmap: KernelMap,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """(N_in, C_in) features, [K, C_in, C_out] kernel, optional (1, C_out) bias -> (N_out, C_out)
    features. The bias is the sum's first term (no extra pass over the output)."""
    if feats.shape[0] != kmap.n_in:
        raise ValueError(f"features have {feats.shape[0]} rows, kernel map expects {kmap.n_in}")
    if _use_table(feats, kmap):
        return _conv_by_table(feats, kernel, kmap, bias)
    return _conv_by_offset(feats, kernel, kmap, bias)


def linear(feats: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``(N, C_in) @ [C_in, C_out]``, plus an optional ``(1, C_out)`` bias in the same matmul."""
    return feats @ weight if bias is None else torch.addmm(bias, feats, weight)


def _use_table(feats: torch.Tensor, kmap: KernelMap) -> bool:
    """The neighbour table off the CPU, when it fits ``TABLE_BUDGET``."""
    offsets = len(kmap.kernel_ids) + (kmap.identity is not None)
    return feats.device.type != "cpu" and kmap.n_out * offsets * feats.shape[1] <= TABLE_BUDGET


def _conv_by_table(feats: torch.Tensor, kernel: torch.Tensor, kmap: KernelMap,
                   bias: torch.Tensor | None) -> torch.Tensor:
    table, ids = kmap.neighbour_table()
    padded = torch.cat([feats, feats.new_zeros(1, feats.shape[1])])  # row n_in: "no input"
    gathered = padded[table].reshape(kmap.n_out, -1)  # (N_out, K' C_in)
    stacked = kernel[ids].reshape(-1, kernel.shape[-1])
    return linear(gathered, stacked, bias)


def _conv_by_offset(feats: torch.Tensor, kernel: torch.Tensor, kmap: KernelMap,
                    bias: torch.Tensor | None) -> torch.Tensor:
    # unbind once: indexing kernel[k] per offset would make autograd add a full-size zero
    # gradient per offset (quadratic in K, which is 729 in 6-D)
    weights = kernel.unbind(0)
    if kmap.identity is not None:  # centre offset of a stride-1 map: a plain matmul, no scatter
        out = linear(feats, weights[kmap.identity], bias)
    elif bias is None:
        out = feats.new_zeros(kmap.n_out, kernel.shape[-1])
    else:
        out = bias.expand(kmap.n_out, -1).clone()
    for k, i, o in zip(kmap.kernel_ids, kmap.in_idx, kmap.out_idx):
        out.index_add_(0, o, feats.index_select(0, i) @ weights[k])
    return out
