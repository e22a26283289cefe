"""``s2h register SRC TGT``: register two point-cloud files and print the transform.

Exit status, for scripts: 0 trusted, 1 registration ran but the result is not trusted, 2 bad
input (a missing, unreadable or malformed file, a bad option or option value), 3 internal error.
Every error is one line on stderr ``s2h register: ...``; ``S2H_DEBUG=1`` adds the traceback.
The report goes to stdout and, with ``--json``, to a file written atomically (s2h_ros.outputs).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import traceback
from pathlib import Path

import numpy as np

from s2h_ros.config import ConfigError, RegistrationConfig, config_from_dict, parse_bool

EXIT_TRUSTED, EXIT_NOT_TRUSTED, EXIT_BAD_INPUT, EXIT_INTERNAL = 0, 1, 2, 3
EXIT_STATUS = (
    "exit status: 0 trusted; 1 registered but not trusted; 2 bad input (missing, unreadable or "
    "malformed file, bad option); 3 internal error. Errors are one line on stderr (S2H_DEBUG=1 "
    "adds the traceback)."
)


class InputError(ValueError):
    """A command-line input other than the clouds (``--gt``, ``--json``) cannot be used."""


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """One ``--name`` option per RegistrationConfig field (defaults from the config)."""
    group = parser.add_argument_group("registration (s2h_ros.config.RegistrationConfig)")
    for f in dataclasses.fields(RegistrationConfig):
        typ = {"float": float, "int": int, "str": str, "bool": _bool}[f.type if isinstance(f.type, str) else f.type.__name__]
        group.add_argument(f"--{f.name.replace('_', '-')}", dest=f"cfg_{f.name}", type=typ, default=None,
                           help=f"{f.metadata.get('description', '')} (default: {f.default})".replace("%", "%%"))


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
    parser.epilog = EXIT_STATUS
    parser.add_argument("source", type=Path, help="source cloud (.bin, .ply, .pcd, .npy, .pth)")
    parser.add_argument("target", type=Path, help="target cloud")
    parser.add_argument("--columns", type=int, default=None,
                        help="row width of .bin files (4: x y z reflectance, 6: x y z normal) or leading "
                             "columns of .npy/.pth arrays; default: .bin is N x 4 unless columns 4-6 "
                             "are normals (s2h_ros.datasets.io)")
    parser.add_argument("--gt", type=Path, help="ground-truth 4x4 (.npy or text) to report RE/TE against")
    parser.add_argument("--json", type=Path, help="write the whole result as JSON")
    add_config_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """The registration with every failure mapped to its exit status and one stderr line."""
    try:
        return _register(args)
    except Exception as exc:  # each layer's input error -> 2; anything else is a bug or the environment -> 3
        if _is_input_error(exc):
            return _fail(exc, EXIT_BAD_INPUT)
        return _fail(exc, EXIT_INTERNAL, f"internal error: {type(exc).__name__}: ")


def _is_input_error(exc: Exception) -> bool:
    """One input-error type per layer: options, this command, the file readers, the pipeline. The
    pipeline (torch) is looked up only if it was imported: the files are read before it is, so a
    bad file is reported without paying for torch."""
    from s2h_ros.datasets.io import PointCloudFileError

    types: list[type[Exception]] = [ConfigError, InputError, PointCloudFileError]
    cloud = sys.modules.get("s2h_ros.cloud")  # where RegistrationError lives (imported with the pipeline)
    if cloud is not None:
        types.append(cloud.RegistrationError)
    return isinstance(exc, tuple(types))


def _fail(exc: Exception, status: int, prefix: str = "") -> int:
    if os.environ.get("S2H_DEBUG", "") not in ("", "0"):
        traceback.print_exc()
    print(f"s2h register: {prefix}{' '.join(str(exc).split())}", file=sys.stderr)
    return status


def _register(args: argparse.Namespace) -> int:
    from s2h_ros.datasets.io import read_point_fields

    cfg = config_from_args(args)
    T_gt = _read_gt(args.gt) if args.gt is not None else None
    src, tgt = (read_point_fields(path, columns=args.columns) for path in (args.source, args.target))

    from s2h_ros import geometry
    from s2h_ros.cloud import range_limit
    from s2h_ros.outputs import write_json
    from s2h_ros.pipeline import register
    from s2h_ros.scene_scale import reach_m, voxel_hint

    result = register(src.points, tgt.points, cfg)
    # Rows the readers dropped for NaN/inf count with those the pipeline dropped.
    result.dropped_points["source_non_finite"] += src.num_non_finite
    result.dropped_points["target_non_finite"] += tgt.num_non_finite
    out = result.to_dict()
    if T_gt is not None:
        re, te = geometry.transform_errors(result.transform, T_gt)
        out["rotation_error_deg"], out["translation_error_m"] = float(re), float(te)
    for side, points in (("source", src.points), ("target", tgt.points)):
        hint = voxel_hint(reach_m(points), cfg.voxel_size)
        if hint:
            print(f"s2h register: warning: {side}: voxel_size {cfg.voxel_size:g}: {hint}", file=sys.stderr)
        if result.dropped_points[f"{side}_out_of_range"]:
            print(f"s2h register: warning: {side}: dropped {result.dropped_points[f'{side}_out_of_range']} "
                  f"points more than {range_limit(cfg.voxel_size):g} m from the cloud's median", file=sys.stderr)
    np.set_printoptions(precision=5, suppress=True)
    print("transform (source -> target):")
    print(result.transform)
    print(f"success: {result.success}  {result.message}")
    print(f"voxels {len(result.source_xyz)} / {len(result.target_xyz)}, candidates {result.num_candidates}, "
          f"correspondences {len(result.correspondences)}, inliers {result.num_inliers}, "
          f"fitness {result.fitness:.3f}, features {result.features_used or result.feature_kind}, "
          f"estimator {'RANSAC safeguard (' + result.fallback + ')' if result.used_fallback else 'learned weights'}")
    if result.fine is not None:
        print(f"fine stage (point-to-plane ICP at {cfg.fine_voxel:g} m): " + (
            f"moved the result {100 * result.fine.moved_m:.1f} cm / {result.fine.moved_deg:.3f} deg"
            if result.fine.used else result.fine.message))
    dropped = {k: v for k, v in result.dropped_points.items() if v}
    if dropped:
        print("dropped points: " + ", ".join(f"{k} {v}" for k, v in dropped.items()))
    if "rotation_error_deg" in out:
        print(f"RE {out['rotation_error_deg']:.3f} deg, TE {out['translation_error_m']:.3f} m")
    print("timings (ms): " + ", ".join(f"{k} {v:.0f}" for k, v in result.timings.items()))
    if args.json is not None:
        try:
            write_json(args.json, out)
        except OSError as exc:
            raise InputError(f"cannot write --json {args.json}: {exc.strerror or exc}") from exc
    if not result.success:
        message = result.message if result.message.startswith("not trusted") else f"not trusted: {result.message}"
        print(f"s2h register: {message}", file=sys.stderr)
        return EXIT_NOT_TRUSTED
    return EXIT_TRUSTED


def _read_gt(path: Path) -> np.ndarray:
    """The ``--gt`` file as a finite ``(4, 4)`` float64 transform, else :class:`InputError`."""
    try:
        T = np.load(path, allow_pickle=False) if path.suffix == ".npy" else np.loadtxt(path, ndmin=2)
        T = np.asarray(T, dtype=np.float64)
    except (OSError, ValueError) as exc:
        raise InputError(f"--gt {path}: not a readable 4x4 matrix ({getattr(exc, 'strerror', None) or exc})") from exc
    if T.size != 16 or not np.isfinite(T).all():
        raise InputError(f"--gt {path}: expected 16 finite numbers (a 4x4 transform), got shape {T.shape}")
    return T.reshape(4, 4)
