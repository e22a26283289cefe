"""Weight files: our own checkpoints and the official FCGF / DGR ones, read without unpickling
arbitrary objects.

Every file is read with ``torch.load(..., weights_only=True)``. Official checkpoints also carry
their training configuration as an ``easydict.EasyDict`` (and numpy scalars); those few classes
are let through as plain stand-ins (a dict subclass, numpy's own reconstructors), so the file
loads without easydict installed and without running code from it. The network shape is read off
the weights, so no configuration is needed to rebuild the model.
"""
from __future__ import annotations

import argparse
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from s2h_ros import paths
from s2h_ros.models.context_inlier import ContextInlierNetwork
from s2h_ros.models.fcgf import build_fcgf
from s2h_ros.models.inlier import InlierNetwork
from s2h_ros.models.resunet import ResUNet, ResUNetConfig, config_from_state_dict

FORMAT = "s2h_ros.checkpoint/1"
# Weights shipped under s2h_ros/weights/, by the voxel size (m) they were trained at: ``features:
# auto`` takes the one that fits the configured voxel size (``shipped_weights``). Learned features
# do not transfer across scales, so a voxel size no file fits gets FPFH.
SHIPPED_WEIGHTS: dict[float, str] = {0.3: "s2h_compact_kitti.pt", 0.05: "s2h_compact_indoor.pt"}
DEFAULT_WEIGHTS = SHIPPED_WEIGHTS[0.3]  # outdoor lidar, the default voxel size
VOXEL_TOLERANCE = 0.1  # weights fit a voxel size within this relative difference of their own


class CheckpointError(ValueError):
    """A weight file that cannot be read or does not fit the model."""


class _EasyDictAsOrderedDict:
    """Stand-in for easydict.EasyDict when reading official configs: rebuilt as an OrderedDict (the
    one dict type the weights-only unpickler fills), keys and values kept."""

    def __new__(cls, *args):
        return OrderedDict()


def _safe_globals() -> list:
    allowed: list = [(_EasyDictAsOrderedDict, "easydict.EasyDict"), argparse.Namespace, np.dtype, np.ndarray]
    core = getattr(np, "_core", None) or np.core
    allowed += [core.multiarray.scalar, core.multiarray._reconstruct]
    allowed += [type(np.dtype(t)) for t in ("float64", "float32", "int64", "int32", "bool")]
    return allowed


def read_checkpoint(path: str | Path) -> dict:
    """The checkpoint dict of a ``.pth``/``.pt`` file, loaded on the CPU with weights_only=True."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    try:
        with torch.serialization.safe_globals(_safe_globals()):
            data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises UnpicklingError, RuntimeError, EOFError, ... for bad files
        raise CheckpointError(f"cannot read checkpoint {path}: {type(err).__name__}: {str(err)[:300]}") from err
    if not isinstance(data, dict):
        raise CheckpointError(f"checkpoint {path} holds a {type(data).__name__}, expected a dict")
    return data


def _clean(state: dict) -> dict[str, torch.Tensor]:
    """Tensors only, DataParallel's ``module.`` prefix removed."""
    out = {}
    for key, value in state.items():
        if not isinstance(value, torch.Tensor):
            raise CheckpointError(f"state dict entry {key!r} is a {type(value).__name__}, not a tensor")
        out[key[7:] if key.startswith("module.") else key] = value
    return out


def load_weights(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy a state dict into ``model``, or raise CheckpointError naming every missing,
    unexpected and mis-shaped key (BatchNorm's ``num_batches_tracked`` may be absent, as in files
    saved by old PyTorch)."""
    state = _clean(state)
    own = model.state_dict()
    missing = [k for k in own if k not in state and not k.endswith("num_batches_tracked")]
    unexpected = [k for k in state if k not in own]
    misshaped = [f"{k}: file {list(state[k].shape)} vs model {list(own[k].shape)}"
                 for k in own if k in state and state[k].shape != own[k].shape]
    if missing or unexpected or misshaped:
        parts = []
        for name, items in (("missing", missing), ("unexpected", unexpected), ("mis-shaped", misshaped)):
            if items:
                more = f" (+{len(items) - 8} more)" if len(items) > 8 else ""
                parts.append(f"{name} keys: {', '.join(items[:8])}{more}")
        raise CheckpointError(f"weights do not fit {type(model).__name__}: " + "; ".join(parts))
    model.load_state_dict({**{k: v for k, v in own.items() if k.endswith("num_batches_tracked")}, **state})


def save_checkpoint(path: str | Path, model: ResUNet, **extra) -> Path:
    """Write ``{state_dict, model: {kind, config}, **extra}`` (plain types only: loads with
    weights_only), atomically (``write_checkpoint``)."""
    kind = "inlier" if isinstance(model, InlierNetwork) else "fcgf"
    return write_checkpoint(path, {"format": FORMAT, "state_dict": model.state_dict(),
                                   "model": {"kind": kind, "config": model.config.to_dict()}, **extra})


def inlier_entries(net: InlierNetwork | ContextInlierNetwork) -> dict:
    """The keys that carry an inlier network in a weights file: ``state_dict_inlier``,
    ``inlier_config`` and, for the context network, ``inlier_model`` (what ``_inlier_from`` reads)."""
    entries = {"state_dict_inlier": net.state_dict(), "inlier_config": net.config.to_dict()}
    if isinstance(net, ContextInlierNetwork):
        entries["inlier_model"] = net.kind
    return entries


def write_checkpoint(path: str | Path, data: dict) -> Path:
    """``torch.save`` of ``data`` written atomically (``outputs.write_bytes``: temporary file +
    rename), so an interrupted save never leaves a truncated weights file."""
    import io

    from s2h_ros.outputs import write_bytes

    buffer = io.BytesIO()
    torch.save(data, buffer)
    return write_bytes(path, buffer.getvalue())


def combine_weights(fcgf_path: str | Path, inlier_path: str | Path, out: str | Path, **extra) -> Path:
    """One file for the pipeline: the FCGF checkpoint ``fcgf_path`` (all its keys) plus the inlier
    network of ``inlier_path`` (``state_dict_inlier``, its config and kind); the inlier file's
    ``steps`` and ``trainer`` and any ``extra`` notes are stored as ``inlier_<key>``. Written atomically."""
    data = dict(read_checkpoint(fcgf_path))
    _fcgf_from(data, fcgf_path, "cpu")  # refuse a file whose FCGF does not load
    inlier_data = read_checkpoint(inlier_path)
    inlier = _inlier_from(inlier_data, inlier_path, "cpu")
    extra = {**{k: inlier_data[k] for k in ("steps", "trainer") if k in inlier_data}, **extra}
    for key in ("state_dict_inlier", "inlier_config", "inlier_model", "train_state"):
        data.pop(key, None)
    data.update(inlier_entries(inlier))
    data.update({f"inlier_{k}": v for k, v in extra.items()})
    return write_checkpoint(out, data)


def _state(data: dict, key: str, path: str | Path) -> dict[str, torch.Tensor]:
    if key not in data:
        raise CheckpointError(f"checkpoint {path} has no {key!r} (keys: {', '.join(map(str, data))})")
    return _clean(data[key])


def _config(data: dict, state: dict, kind: str, dim: int, normalize: bool) -> ResUNetConfig:
    """The network shape: our ``model.config`` or a trainer's ``{kind}_config`` when present,
    else read off the weights."""
    meta = data.get("model")
    if isinstance(meta, dict) and "config" in meta:
        if meta.get("kind") != kind:
            raise CheckpointError(f"checkpoint holds a {meta.get('kind')!r} model, not {kind!r}")
        return ResUNetConfig(**meta["config"])
    if isinstance(data.get(f"{kind}_config"), dict):
        return ResUNetConfig(**data[f"{kind}_config"])
    try:
        return config_from_state_dict(state, dim, normalize)
    except (KeyError, ValueError) as err:
        raise CheckpointError(str(err)) from err


def _fcgf_from(data: dict, path: str | Path, device) -> ResUNet:
    state = _state(data, "state_dict", path)
    model = build_fcgf(_config(data, state, "fcgf", 3, True))
    load_weights(model, state)
    return model.to(device or "cpu").eval()


def _inlier_from(data: dict, path: str | Path, device) -> InlierNetwork | ContextInlierNetwork:
    """The inlier network of a file: ours or DGR's 6-D ResUNet, or (``inlier_model: context``) the
    context inlier network with its ``inlier_config``."""
    key = "state_dict_inlier" if "state_dict_inlier" in data else "state_dict"
    state = _state(data, key, path)
    if data.get("inlier_model") == ContextInlierNetwork.kind:
        try:
            model = ContextInlierNetwork(dict(data.get("inlier_config") or {}))
        except (TypeError, ValueError) as err:
            raise CheckpointError(f"checkpoint {path}: bad context inlier configuration: {err}") from err
        load_weights(model, state)
        return model.to(device or "cpu").eval()
    model = InlierNetwork(_config(data, state, "inlier", 6, False))
    load_weights(model, state)
    return model.to(device or "cpu").eval()


def load_fcgf(path: str | Path, device: torch.device | str | None = None) -> ResUNet:
    """FCGF from our checkpoint or an official FCGF/DGR file (``state_dict``), in eval mode."""
    return _fcgf_from(read_checkpoint(path), path, device)


def load_inlier(path: str | Path, device: torch.device | str | None = None) -> InlierNetwork | ContextInlierNetwork:
    """The inlier network of our checkpoint (6-D or context) or of an official DGR file
    (``state_dict_inlier``)."""
    return _inlier_from(read_checkpoint(path), path, device)


def load_dgr(path: str | Path, device: torch.device | str | None = None) -> tuple[ResUNet, InlierNetwork]:
    """Both networks of an official DGR checkpoint (``state_dict`` and ``state_dict_inlier``)."""
    data = read_checkpoint(path)
    if "state_dict_inlier" not in data:
        raise CheckpointError(f"{path} is not a DGR checkpoint: no 'state_dict_inlier'")
    return _fcgf_from(data, path, device), _inlier_from(data, path, device)


def voxel_fits(trained: float | None, voxel: float) -> bool:
    """Whether weights trained at ``trained`` m (None: the file does not say) suit ``voxel`` m."""
    return trained is None or abs(trained - voxel) <= VOXEL_TOLERANCE * voxel


def shipped_weights(voxel: float) -> Path | None:
    """The shipped weight file trained at ``voxel`` m, or None when none fits (or it is missing)."""
    for trained, name in SHIPPED_WEIGHTS.items():
        path = paths.WEIGHTS_DIR / name
        if voxel_fits(trained, voxel) and path.is_file():
            return path
    return None


@dataclass
class RegistrationModels:
    """What the pipeline runs: FCGF, the inlier network when the file has one, and the voxel size
    the weights were trained at (None when the file does not say)."""

    fcgf: ResUNet
    inlier: InlierNetwork | ContextInlierNetwork | None
    voxel: float | None


def load_registration_models(path: str | Path | None = None,
                             device: torch.device | str | None = None) -> RegistrationModels:
    """FCGF (+ inlier network) from one file, by default the weights shipped in the package."""
    if path is None:
        path = paths.WEIGHTS_DIR / DEFAULT_WEIGHTS
    data = read_checkpoint(path)
    inlier = _inlier_from(data, path, device) if "state_dict_inlier" in data else None
    voxel = data.get("voxel")
    return RegistrationModels(_fcgf_from(data, path, device), inlier, float(voxel) if voxel is not None else None)
