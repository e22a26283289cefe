"""Optional MinkowskiEngine backend: the same layers, the same weights, MinkowskiEngine's kernels.

When a layer of :mod:`s2h_ros.sparse.layers` receives a ``MinkowskiEngine.SparseTensor``, it runs
the equivalent MinkowskiEngine module whose ``kernel`` / ``bias`` *are* the layer's parameters
(no copy: both libraries use the [K, C_in, C_out] layout), so a model can be checked against, or
run on, MinkowskiEngine unchanged. MinkowskiEngine (unmaintained since 2021) is not a dependency;
it imports on Python 3.10+ only after the ``collections`` aliases it expects are restored.
"""
from __future__ import annotations

import collections
import collections.abc
import weakref

import numpy as np
import torch

from s2h_ros.sparse.quantize import as_points, sparse_quantize

_MODULES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # our layer -> its ME twin


def import_minkowski():
    """``MinkowskiEngine`` or ImportError (after restoring ``collections.Sequence`` etc.)."""
    for name in ("Sequence", "Mapping", "MutableMapping", "Iterable", "Callable"):
        if not hasattr(collections, name):
            setattr(collections, name, getattr(collections.abc, name))
    import MinkowskiEngine as ME  # noqa: N817

    return ME


def available() -> bool:
    """True when MinkowskiEngine imports here."""
    try:
        import_minkowski()
    except Exception:  # ImportError, or a broken binary (OSError/RuntimeError)
        return False
    return True


def from_points(xyz: np.ndarray | torch.Tensor, voxel: float, device: torch.device | str | None = None):
    """A MinkowskiEngine tensor of one cloud, quantised exactly like ``SparseTensor.from_points``."""
    ME = import_minkowski()
    pts = as_points(xyz, name="points")
    if device is not None:
        pts = pts.to(device)
    coords, _, _ = sparse_quantize(pts, voxel)
    coords = torch.cat([coords.new_zeros(coords.shape[0], 1), coords], 1).int()
    feats = torch.ones(coords.shape[0], 1, device=coords.device)
    return ME.SparseTensor(feats, coordinates=coords, device=str(coords.device))


def _run_twin(layer, x, kind: str):
    """Run ``layer`` through the MinkowskiEngine module ``kind`` sharing its parameters."""
    twin = _MODULES.get(layer)
    if twin is None:
        ME = import_minkowski()
        twin = getattr(ME, kind)(layer.in_channels, layer.out_channels, kernel_size=layer.kernel_size,
                                 stride=layer.stride, bias=layer.bias is not None, dimension=layer.dim)
        twin.kernel = layer.kernel
        twin.bias = layer.bias
        _MODULES[layer] = twin
    return twin(x)


def conv(layer, x):
    """Run ``layers.Conv`` on a MinkowskiEngine tensor."""
    return _run_twin(layer, x, "MinkowskiConvolution")


def conv_transpose(layer, x):
    """Run ``layers.ConvTranspose`` on a MinkowskiEngine tensor (output on the existing finer map)."""
    return _run_twin(layer, x, "MinkowskiConvolutionTranspose")


def apply_features(x, fn):
    """fn(features) on the same coordinates (BatchNorm, ReLU, normalisation)."""
    ME = import_minkowski()
    return ME.SparseTensor(fn(x.F), coordinate_map_key=x.coordinate_map_key,
                           coordinate_manager=x.coordinate_manager)


def cat(*tensors):
    return import_minkowski().cat(*tensors)


def to_rows(x, coords: torch.Tensor) -> torch.Tensor:
    """The features of MinkowskiEngine tensor ``x`` in the row order of ``coords`` (N, 1 + D)."""
    from s2h_ros.sparse.kernel_map import unique_rows

    theirs = x.C.long().to(coords.device)
    both, inverse = unique_rows(torch.cat([coords, theirs]))
    if both.shape[0] != coords.shape[0] or theirs.shape[0] != coords.shape[0]:
        raise ValueError("the two tensors do not hold the same coordinates")
    slot = torch.empty(both.shape[0], dtype=torch.long, device=coords.device)
    slot[inverse[coords.shape[0]:]] = torch.arange(theirs.shape[0], device=coords.device)
    return x.F[slot[inverse[: coords.shape[0]]]]
