"""``s2h register SRC TGT``: register two point-cloud files and print the transform."""
from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import numpy as np

from s2h_ros.config import ConfigError, RegistrationConfig, config_from_dict, parse_bool


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """One ``--name`` option per RegistrationConfig field (defaults from the config)."""
    group = parser.add_argument_group("registration (s2h_ros.config.RegistrationConfig)")
    for f in dataclasses.fields(RegistrationConfig):
        typ = {"float": float, "int": int, "str": str, "bool": _bool}[f.type if isinstance(f.type, str) else f.type.__name__]
        group.add_argument(f"--{f.name.replace('_', '-')}", dest=f"cfg_{f.name}", type=typ, default=None,
                           help=f"{f.metadata.get('description', '')} (default: {f.default})")


def config_from_args(args: argparse.Namespace, **defaults) -> RegistrationConfig:
    values = dict(defaults)
    values.update({k[4:]: v for k, v in vars(args).items() if k.startswith("cfg_") and v is not None})
    return config_from_dict(RegistrationConfig, values)


def _bool(text: str) -> bool:
    try:
        return parse_bool(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", type=Path, help="source cloud (.bin, .ply, .pcd, .npy, ...)")
    parser.add_argument("target", type=Path, help="target cloud")
    parser.add_argument("--gt", type=Path, help="ground-truth 4x4 (.npy or text) to report RE/TE against")
    parser.add_argument("--json", type=Path, help="write the whole result as JSON")
    add_config_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from s2h_ros import geometry
    from s2h_ros.datasets.io import PointCloudFileError, read_points
    from s2h_ros.pipeline import RegistrationError, register

    try:
        cfg = config_from_args(args)
        src, tgt = read_points(args.source), read_points(args.target)
        result = register(src, tgt, cfg)
    except (ConfigError, PointCloudFileError, RegistrationError) as exc:
        print(f"s2h register: {exc}")
        return 2
    out = result.to_dict()
    if args.gt is not None:
        T_gt = np.load(args.gt) if args.gt.suffix == ".npy" else np.loadtxt(args.gt)
        re, te = geometry.transform_errors(result.transform, T_gt.reshape(4, 4))
        out["rotation_error_deg"], out["translation_error_m"] = float(re), float(te)
    np.set_printoptions(precision=5, suppress=True)
    print("transform (source -> target):")
    print(result.transform)
    print(f"success: {result.success}  {result.message}")
    print(f"voxels {len(result.source_xyz)} / {len(result.target_xyz)}, candidates {result.num_candidates}, "
          f"correspondences {len(result.correspondences)}, inliers {result.num_inliers}, "
          f"fitness {result.fitness:.3f}, features {result.feature_kind}, fallback {result.used_fallback}")
    if "rotation_error_deg" in out:
        print(f"RE {out['rotation_error_deg']:.3f} deg, TE {out['translation_error_m']:.3f} m")
    print("timings (ms): " + ", ".join(f"{k} {v:.0f}" for k, v in result.timings.items()))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0 if result.success else 1
