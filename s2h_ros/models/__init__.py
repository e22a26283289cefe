"""Networks on the sparse backend: FCGF features, DGR's 6-D inlier network, checkpoint I/O."""
from __future__ import annotations

from s2h_ros.models.checkpoint import (
    CheckpointError,
    load_dgr,
    load_fcgf,
    load_inlier,
    load_registration_models,
    load_weights,
    read_checkpoint,
    save_checkpoint,
)
from s2h_ros.models.fcgf import PRESETS, build_fcgf, extract_features, fcgf_config
from s2h_ros.models.inlier import InlierNetwork, correspondence_weights
from s2h_ros.models.resunet import ResUNet, ResUNetConfig, config_from_state_dict

__all__ = [
    "PRESETS", "CheckpointError", "InlierNetwork", "ResUNet", "ResUNetConfig", "build_fcgf",
    "config_from_state_dict", "correspondence_weights", "extract_features", "fcgf_config", "load_dgr", "load_fcgf", "load_inlier",
    "load_registration_models", "load_weights", "read_checkpoint", "save_checkpoint",
]
