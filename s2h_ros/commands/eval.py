"""``s2h eval``: run registration methods side by side on pairs or a sequence.

Pairs (synthetic, kitti-pairs, 3dmatch, kitti-loop, 3dmatch-demo) give recall / RE / TE / time
/ peak memory per method; sequences (kitti, synthetic --task sequence, bag) give KITTI drift,
ATE and time per frame; ``matrix`` runs the evaluation matrix (held-out sensors x scene families,
mixed-sensor pairs and the real pairs; s2h_ros.evaluation.matrix) with a recall heat map. Writes a Markdown table to stdout (and ``--markdown``), the full
results with ``--json``, and PNG plots (error CDFs, top-view trajectories) with ``--plots``; every
file atomically (s2h_ros.outputs), ``--jsonl`` one flushed line per pair as it is made.

Exit status: 0 done; 2 an output path that cannot be written (checked before the work starts;
a disk that fills up by the end is reported then, after the table went to stdout), one stderr
line naming it; 130 / 143 stopped by SIGINT / SIGTERM: the results so far (pairs evaluated,
sequence methods finished) are printed and written as usual, marked ``"interrupted"``.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import platform
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from s2h_ros.commands.simulate import FAMILY_NAMES, SENSOR_NAMES

# s2h_ros.evaluation.matrix's defaults, here so that building the parser imports no Open3D
MATRIX_DEFAULTS = {
    "sensors": ("vlp16", "hdl32", "os1_64", "os1_128", "livox"),
    "families": ("town", "suburban", "highway", "parking_lot", "open_field", "tunnel"),
    "indoor_sensors": ("depth_camera",), "indoor_families": ("rooms", "office", "warehouse"),
    "mixed": ("vlp16:os1_128", "os1_128:vlp16", "hdl32:livox"), "mixed_families": ("town", "suburban"),
    "real": ("kitti-loop", "3dmatch-demo"),
}
MATRIX_METHODS = "s2h,fpfh_ransac"
MATRIX_LISTS = {
    "sensors": "outdoor sensor presets", "families": "outdoor scene families",
    "indoor_sensors": "indoor sensors (0.05 m voxels, 3DMatch thresholds)", "indoor_families": "indoor families",
    "mixed": "mixed-sensor rows SOURCE:TARGET", "mixed_families": "outdoor families of the mixed-sensor rows",
    "real": "bundled real pairs as extra rows",
}

DATASETS = ("synthetic", "kitti", "kitti-pairs", "3dmatch", "kitti-loop", "3dmatch-demo", "bag", "matrix")
SEQUENCE_DATASETS = ("kitti", "bag")
INDOOR_DATASETS = ("3dmatch", "3dmatch-demo")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", required=True, choices=DATASETS)
    parser.add_argument("--methods", default=None,
                        help="comma-separated from fpfh_ransac,fpfh_fgr,icp,kiss_icp,s2h; "
                             "s2h:KEY=VALUE+KEY=VALUE is s2h with RegistrationConfig fields changed "
                             "(e.g. s2h:matcher=nn) (default: every method that applies to the task; "
                             f"matrix: {MATRIX_METHODS})")
    parser.add_argument("--task", choices=("pairs", "sequence"), default=None,
                        help="pairs or sequence (default: sequence for kitti/bag, pairs otherwise)")
    parser.add_argument("--root", type=Path, help="KITTI odometry root (or one sequence folder), 3DMatch "
                                                  "fragments root, or rosbag2 path")
    parser.add_argument("--gt-root", type=Path, help="3DMatch benchmark root holding 3DMatch/<scene>/gt.log")
    parser.add_argument("--benchmark", default="3DMatch", choices=("3DMatch", "3DLoMatch"))
    parser.add_argument("--sequence", default="0", help="KITTI sequence id (kitti)")
    parser.add_argument("--split", default="test", help="KITTI pair-list split (kitti-pairs)")
    parser.add_argument("--topic", default="/points", help="PointCloud2 topic (bag)")
    parser.add_argument("--n-pairs", type=int, default=200, help="synthetic pairs")
    parser.add_argument("--seed", type=int, default=0, help="synthetic world seed")
    parser.add_argument("--kind", choices=("outdoor", "indoor"), default="outdoor", help="synthetic world")
    parser.add_argument("--sensor", default="hdl64", choices=SENSOR_NAMES, help="synthetic sensor preset")
    parser.add_argument("--family", default=None, choices=FAMILY_NAMES,
                        help="synthetic scene family (default: --kind's town or rooms)")
    parser.add_argument("--turn", type=float, nargs=2, metavar=("MIN", "MAX"), default=None,
                        help="pairs: turn every source about z by a random heading of MIN-MAX deg either way "
                             "(seeded by --seed; T_gt follows): relative headings beyond the data's own "
                             "(matrix: default 0 180 on its synthetic cells; 0 0 turns none)")
    parser.add_argument("--tilt", type=float, nargs=2, metavar=("MIN", "MAX"), default=None,
                        help="pairs: tilt every source and target, each about its own random horizontal axis, by "
                             "MIN-MAX deg (seeded by --seed; after --turn; T_gt follows): handheld rigs, slopes, "
                             "sensors mounted at an angle")
    parser.add_argument("--min-distance", type=float, default=10.0, help="synthetic pairs: metres apart (min)")
    parser.add_argument("--max-distance", type=float, default=20.0,
                        help="synthetic pairs: metres apart (max, --pair-source sampler)")
    parser.add_argument("--pair-source", choices=("drive", "sampler"), default="drive",
                        help="synthetic pairs: along one drive (DrivePairs) or datasets.synthetic.synthetic_pairs")
    parser.add_argument("--pair-spacing", type=float, default=15.0,
                        help="synthetic drive pairs: metres of path between successive source scans")
    parser.add_argument("--length-m", type=float, default=1000.0, help="synthetic sequence length")
    parser.add_argument("--limit", type=int, default=None, help="evaluate only the first N pairs / scans")
    parser.add_argument("--voxel", type=float, default=None, help="override every method's voxel size (m)")
    parser.add_argument("--device", default=None, help="torch device for s2h (cpu, cuda)")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for torch, Open3D and KISS-ICP")
    parser.add_argument("--json", type=Path, help="write all results here as JSON")
    parser.add_argument("--jsonl", type=Path, help="stream each pair record here as one JSON line, as it is made")
    parser.add_argument("--markdown", type=Path, help="write the results table here")
    parser.add_argument("--plots", type=Path, help="write PNG plots into this folder")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    matrix = parser.add_argument_group("--dataset matrix (held-out sensors x scene families)")
    for key, what in MATRIX_LISTS.items():
        matrix.add_argument("--" + key.replace("_", "-"), default=",".join(MATRIX_DEFAULTS[key]),
                            help=f"{what}, comma-separated (default %(default)s; '' for none)")
    matrix.add_argument("--worlds", default="", metavar="CELL=SEED,...",
                        help="name a cell's held-out world instead of drawing it from --seed, e.g. "
                             "depth_camera/rooms=5,vlp16>os1_128/town=264 (keys as the table prints them)")
    matrix.add_argument("--pairs-per-cell", type=int, default=10, help="synthetic pairs per cell (default 10)")
    matrix.add_argument("--indoor-distance", type=float, nargs=2, metavar=("MIN", "MAX"), default=(1.0, 3.0),
                        help="indoor candidate pairs: metres apart (default 1 3)")
    matrix.add_argument("--overlap", type=float, nargs=2, metavar=("MIN", "MAX"), default=(0.3, 0.6),
                        help="indoor pairs: overlap fraction kept (default 0.3 0.6)")
    matrix.add_argument("--min-shared-view", type=float, default=0.05, metavar="F",
                        help="a pair whose larger overlap fraction is below F saw no common scene: it is "
                             "counted apart (recall over the pairs with a shared view beside the recall "
                             "over all; default 0.05)")


# ------------------------------------------------------------------------------- data


class DrivePairs:
    """Pairs along one simulated drive, rendered lazily: a source scan every ``spacing`` metres of
    path, its target the first later scan at least ``min_distance`` away (straight line).

    ``T_gt = P_target^-1 P_source`` from the simulator's exact poses. This is the default source
    of synthetic pairs because ``synthetic_pairs``'s sampler can run out of candidates (see
    ``--pair-source``); both draw KITTI-like pairs >= 10 m apart from a seeded world.
    """

    def __init__(self, sequence: Any, n: int, min_distance: float = 10.0, spacing: float = 15.0):
        from s2h_ros.evaluation.metrics import trajectory_distances

        self.sequence, self.min_distance = sequence, min_distance
        poses = sequence.poses
        pos, arc = poses[:, :3, 3], trajectory_distances(poses)
        self.frames: list[tuple[int, int]] = []
        a = 0
        while len(self.frames) < n:
            ahead = np.flatnonzero(np.linalg.norm(pos[a:] - pos[a], axis=1) >= min_distance)
            later = np.flatnonzero(arc >= arc[a] + spacing)
            if len(ahead) == 0 or len(later) == 0:
                raise ValueError(f"drive of {arc[-1]:.0f} m too short for {n} pairs {spacing} m apart")
            self.frames.append((a, a + int(ahead[0])))
            a = int(later[0])

    def __len__(self) -> int:
        return len(self.frames)

    def __iter__(self):
        from s2h_ros.datasets.types import PointCloudPair

        for a, b in self.frames:
            src, tgt = self.sequence[a], self.sequence[b]
            yield PointCloudPair(
                source=src.points, target=tgt.points, T_gt=np.linalg.inv(tgt.pose) @ src.pose,
                name=f"{self.sequence.name}_{a:05d}_{b:05d}",
                meta={"dataset": "synthetic", "frames": (a, b),
                      "distance": float(np.linalg.norm(tgt.pose[:3, 3] - src.pose[:3, 3]))})


def _need_root(args: argparse.Namespace, what: str) -> Path:
    if args.root is None:
        raise SystemExit(f"s2h eval: --dataset {args.dataset} needs --root ({what})")
    return args.root


def load_pairs(args: argparse.Namespace) -> Any:
    """The dataset's pairs: a list, or a sized iterable that loads them lazily."""
    from itertools import islice

    if args.dataset == "synthetic":
        from s2h_ros.datasets.synthetic.sequence import simulate_sequence, synthetic_pairs

        n = args.n_pairs if args.limit is None else min(args.n_pairs, args.limit)
        world = {"kind": args.kind, "sensor": args.sensor, "family": args.family}
        if args.pair_source == "sampler":
            pairs = synthetic_pairs(n, args.seed, min_distance=args.min_distance, max_distance=args.max_distance,
                                    **world)
        else:
            drive = simulate_sequence(length_m=n * args.pair_spacing + 3 * args.min_distance + 50.0,
                                      seed=args.seed, **world)
            pairs = DrivePairs(drive, n, args.min_distance, args.pair_spacing)
        return _turned(pairs, args)
    if args.dataset == "kitti-loop":
        from s2h_ros.datasets.kitti import kitti_loop_pair

        return _turned([kitti_loop_pair()], args)
    if args.dataset == "3dmatch-demo":
        from s2h_ros.datasets.threedmatch import threedmatch_demo_pair

        return [threedmatch_demo_pair()]
    if args.dataset == "kitti-pairs":
        from s2h_ros.datasets.kitti import kitti_benchmark_pairs

        pairs = kitti_benchmark_pairs(_need_root(args, "KITTI odometry root"), args.split)
    elif args.dataset == "3dmatch":
        from s2h_ros.datasets.threedmatch import threedmatch_pairs

        if args.gt_root is None:
            raise SystemExit("s2h eval: --dataset 3dmatch needs --gt-root (benchmark gt.log folders)")
        pairs = threedmatch_pairs(_need_root(args, "3DMatch fragments root"), args.gt_root, args.benchmark)
    else:
        raise SystemExit(f"s2h eval: --dataset {args.dataset} is a sequence dataset; use --task sequence")
    return _turned(list(islice(pairs, args.limit)) if args.limit is not None else list(pairs), args)


class _TurnedPairs:
    """Pairs with each source turned about z by a heading drawn from ``--turn`` and then both clouds
    tilted by ``--tilt`` (either may be None), lazily."""

    def __init__(self, pairs: Any, turn: tuple[float, float] | None, tilt: tuple[float, float] | None, seed: int):
        self.pairs, self.turn, self.tilt, self.seed = pairs, turn, tilt, seed

    def __len__(self) -> int:
        return len(self.pairs)

    def __iter__(self):
        from s2h_ros.datasets.types import tilted_pairs, turned_pairs

        pairs = iter(self.pairs)
        if self.turn is not None:
            pairs = turned_pairs(pairs, *self.turn, self.seed)
        return pairs if self.tilt is None else tilted_pairs(pairs, *self.tilt, self.seed)


def _turned(pairs: Any, args: argparse.Namespace) -> Any:
    if args.turn is None and args.tilt is None:
        return pairs
    for name, limits, most in (("--turn", args.turn, 180.0), ("--tilt", args.tilt, 90.0)):
        if limits is not None and not 0.0 <= limits[0] <= limits[1] <= most:
            raise SystemExit(f"s2h eval: {name} needs 0 <= MIN <= MAX <= {most:g} degrees, "
                             f"got {limits[0]:g} {limits[1]:g}")
    return _TurnedPairs(pairs, args.turn, args.tilt, args.seed)


def load_sequence(args: argparse.Namespace) -> Any:
    if args.dataset == "kitti":
        from s2h_ros.datasets.kitti import KittiSequence

        root = _need_root(args, "KITTI odometry root, or one sequence folder holding velodyne/")
        seq = KittiSequence(root) if (root / "velodyne").is_dir() else KittiSequence(root, args.sequence)
    elif args.dataset == "synthetic":
        from s2h_ros.datasets.synthetic.sequence import simulate_sequence

        seq = simulate_sequence(length_m=args.length_m, seed=args.seed, kind=args.kind)
    elif args.dataset == "bag":
        from s2h_ros.datasets.rosbag import RosbagSequence

        seq = RosbagSequence(_need_root(args, "rosbag2 folder or file"), args.topic, max_scans=args.limit)
    else:
        raise SystemExit(f"s2h eval: --dataset {args.dataset} has pairs, not a sequence")
    if args.limit is None:
        return seq
    from s2h_ros.datasets.types import SubSequence

    n = min(args.limit, len(seq))
    return SubSequence(seq, list(range(n)), name=f"{seq.name}[:{n}]")


# ----------------------------------------------------------------------------- methods


def build_methods(names: list[str], task: str, scale: str, args: argparse.Namespace) -> dict[str, Any]:
    from s2h_ros.config import ConfigError
    from s2h_ros.evaluation.methods import METHODS, MethodUnavailable, make_method, split_variant

    methods = {}
    for full_name in names:
        name, _ = split_variant(full_name)
        if name not in METHODS:
            raise SystemExit(f"s2h eval: unknown method {name!r} (choose from {', '.join(METHODS)})")
        if task not in METHODS[name].kinds:
            raise SystemExit(f"s2h eval: method {name!r} evaluates {' and '.join(METHODS[name].kinds)} only, not {task}")
        overrides: dict[str, Any] = {}
        if args.voxel is not None and name != "kiss_icp":
            overrides["voxel"] = args.voxel
        if name == "s2h" and args.device is not None:
            overrides["device"] = args.device
        if name == "kiss_icp" and args.threads is not None:
            overrides["threads"] = args.threads
        try:
            methods[full_name] = make_method(full_name, scale, **overrides)
        except (MethodUnavailable, ConfigError, ValueError) as err:
            raise SystemExit(f"s2h eval: {err}") from err
    return methods


def method_settings(method: Any) -> dict[str, Any]:
    """The plain-valued attributes of a method (its tuning), for the JSON record."""
    out = {}
    for key, value in vars(method).items():
        if key.startswith("_"):
            continue
        if hasattr(value, "__dataclass_fields__") or hasattr(value, "model_dump"):
            value = value.model_dump() if hasattr(value, "model_dump") else vars(value)
        if isinstance(value, (int, float, str, bool, dict)):
            out[key] = value
    return out


class JsonLines:
    """Writes each record as one flushed JSON line (results survive a stopped run)."""

    def __init__(self, stream: Any):
        self.stream = stream

    def __call__(self, record: dict) -> None:
        from s2h_ros.outputs import json_text

        self.stream.write(json_text(record, indent=None) + "\n")
        self.stream.flush()


class Records(list):
    """Pair records as they are made (``on_record``), kept here so that a stopped run has them;
    each also goes to ``stream`` (a :class:`JsonLines`) when one is given."""

    def __init__(self, stream: JsonLines | None = None):
        super().__init__()
        self.stream = stream

    def __call__(self, record: dict) -> None:
        self.append(record)
        if self.stream is not None:
            self.stream(record)


def _machine(threads: int | None) -> dict[str, Any]:
    return {"host": platform.node(), "cpus": os.cpu_count(), "load_avg_1_5_15": list(os.getloadavg()),
            "threads": threads, "python": platform.python_version()}


# --------------------------------------------------------------------------------- run

EXIT_OK, EXIT_BAD_OUTPUT = 0, 2


def output_dirs(args: argparse.Namespace) -> list[Path]:
    """The folders the requested outputs go to."""
    files = [args.json, args.jsonl, args.markdown]
    return [f.parent for f in files if f is not None] + ([args.plots] if args.plots is not None else [])


@dataclass
class Made:
    """What an evaluation has made: all of it, or what came before a stop."""

    records: Records  # pairs: one record per method and pair
    sequence: str = ""  # sequences: the finished methods' trajectories and summaries
    gt: np.ndarray | None = None
    poses: dict[str, np.ndarray] = field(default_factory=dict)
    summary: dict[str, dict] = field(default_factory=dict)


def outputs_writable(args: argparse.Namespace) -> bool:
    """Whether every output folder takes a file; if not, one stderr line names it."""
    from s2h_ros.outputs import check_writable

    try:
        for folder in output_dirs(args):
            check_writable(folder)
    except OSError as exc:
        print(f"s2h eval: cannot write {exc.filename}: {exc.strerror}", file=sys.stderr)
        return False
    return True


def run(args: argparse.Namespace) -> int:
    if args.threads is not None:
        from s2h_ros.config import use_cpu_threads

        use_cpu_threads(args.threads)
    from s2h_ros.evaluation.harness import evaluate_pairs, summarize_records
    from s2h_ros.evaluation.metrics import THRESHOLDS
    from s2h_ros.evaluation.report import pairs_table, sequence_table
    from s2h_ros.interrupts import Interrupted, exit_status, on_stop_signals, raise_interrupted, signal_name
    if not outputs_writable(args):
        return EXIT_BAD_OUTPUT
    if args.dataset == "matrix":
        return run_matrix(args)
    task = args.task or ("sequence" if args.dataset in SEQUENCE_DATASETS else "pairs")
    indoor = args.dataset in INDOOR_DATASETS or (args.dataset == "synthetic" and args.kind == "indoor")
    scale, threshold = ("indoor", THRESHOLDS["3dmatch"]) if indoor else ("outdoor", THRESHOLDS["kitti"])
    from s2h_ros.evaluation.methods import METHODS

    names = ([m.strip() for m in args.methods.split(",") if m.strip()] if args.methods
             else [n for n, spec in METHODS.items() if task in spec.kinds])
    methods = build_methods(names, task, scale, args)
    result: dict[str, Any] = {"dataset": args.dataset, "task": task, "scale": scale,
                              "settings": {n: method_settings(m) for n, m in methods.items()},
                              "machine": _machine(args.threads), "interrupted": None}
    stopped = None
    with contextlib.ExitStack() as stack:
        stream = JsonLines(stack.enter_context(args.jsonl.open("w"))) if args.jsonl is not None else None
        made = Made(Records(stream))
        with on_stop_signals(raise_interrupted):
            try:
                if task == "pairs":
                    evaluate_pairs(methods, load_pairs(args), threshold, progress=not args.no_progress,
                                   on_record=made.records)
                else:
                    _evaluate_sequence(args, methods, made)
            except Interrupted as exc:
                stopped = exc.signum
                result["interrupted"] = signal_name(stopped)
    if task == "pairs":
        summary = summarize_records(made.records, threshold)
        result.update(threshold=vars(threshold), summary=summary, pairs=list(made.records), table=pairs_table(summary))
    else:
        result.update(sequence=made.sequence, summary=made.summary, table=sequence_table(made.summary))
    status = _write_outputs(args, result, made, threshold)
    if stopped is None:
        return status
    done = f"{len(made.records)} pair records" if task == "pairs" else f"{len(made.summary)} finished methods"
    print(f"s2h eval: stopped by {signal_name(stopped)}; results so far ({done}) above"
          f"{' and written' if status == EXIT_OK and output_dirs(args) else ''}", file=sys.stderr)
    return exit_status(stopped)


def _evaluate_sequence(args: argparse.Namespace, methods: dict[str, Any], made: Made) -> None:
    """Method after method into ``made``, so that a stop keeps the methods finished before it."""
    from s2h_ros.evaluation.harness import evaluate_sequence

    seq = load_sequence(args)
    made.sequence = seq.name
    for name, method in methods.items():
        ev = evaluate_sequence({name: method}, seq, progress=not args.no_progress)
        made.gt = ev.gt
        made.poses.update(ev.poses)
        made.summary.update(ev.summary)


def _write_outputs(args: argparse.Namespace, result: dict, made: Made, threshold) -> int:
    """The table on stdout, then ``--plots``, ``--markdown`` and ``--json``; a file that cannot be
    written is one stderr line naming it (status 2)."""
    from s2h_ros.evaluation import plots

    def draw() -> list[Path]:
        if made.records:
            return [plots.error_cdfs(made.records, args.plots / f"{args.dataset}_error_cdf.png",
                                     threshold.re_deg, threshold.te_m)]
        if made.poses:
            return [plots.trajectories_top_view(made.gt, made.poses, args.plots / f"{args.dataset}_trajectory.png",
                                                title=made.sequence)]
        return []

    return _write_results(args, result, draw)


def _write_results(args: argparse.Namespace, result: dict, draw) -> int:
    """Print ``result["table"]``, then write ``draw()``'s plots (with ``--plots``), the Markdown and
    the JSON; an OSError is one stderr line naming the file (status 2)."""
    from s2h_ros.outputs import write_json, write_text

    result["machine"]["load_avg_after"] = list(os.getloadavg())
    print(result["table"], end="", flush=True)
    try:
        if args.plots is not None:
            drawn = draw()
            if drawn:
                result["plots"] = [str(path) for path in drawn]
        if args.markdown is not None:
            write_text(args.markdown, result["table"])
        if args.json is not None:
            write_json(args.json, result)
    except OSError as exc:
        print(f"s2h eval: cannot write {exc.filename}: {exc.strerror}", file=sys.stderr)
        return EXIT_BAD_OUTPUT
    return EXIT_OK


# ------------------------------------------------------------------------------ matrix


def _arguments(args: argparse.Namespace) -> dict[str, Any]:
    """The command's options as JSON values (what reproduces the run)."""
    return {k: (str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v)
            for k, v in vars(args).items() if v is None or isinstance(v, (str, int, float, bool, list, tuple, Path))}


def _models(methods: dict[str, dict[str, Any]]) -> dict[str, dict]:
    """The weights file (path, size, SHA-256) each s2h method loads at each scale."""
    import hashlib

    from s2h_ros.pipeline import Registrar

    out: dict[str, dict] = {}
    for scale, by_name in methods.items():
        for name, method in by_name.items():
            config = getattr(method, "config", None)
            if config is None:
                continue
            entry: dict[str, Any] = {"features": config.features, "voxel": config.voxel_size}
            path = Registrar(config).weights_path()
            if path is None and config.features == "auto":
                entry["features_used"] = "fpfh (no shipped weights for this voxel size)"
            elif path is not None:
                entry["weights"] = str(path)
                if path.is_file():
                    entry.update(bytes=path.stat().st_size, sha256=hashlib.sha256(path.read_bytes()).hexdigest())
            out[f"{name}@{scale}"] = entry
    return out


def run_matrix(args: argparse.Namespace) -> int:
    """``--dataset matrix``: every cell's pairs through every method, records streamed as they are
    made; the table on stdout and in ``--markdown``, everything in ``--json``, the recall heat map
    in ``--plots``/matrix_recall.png."""
    from s2h_ros.evaluation import matrix as mx
    from s2h_ros.interrupts import Interrupted, exit_status, on_stop_signals, raise_interrupted, signal_name

    if args.pairs_per_cell < 1:
        raise SystemExit(f"s2h eval: --pairs-per-cell must be >= 1, got {args.pairs_per_cell}")
    turn = (0.0, 180.0) if args.turn is None else tuple(args.turn)
    if not 0.0 <= turn[0] <= turn[1] <= 180.0:
        raise SystemExit(f"s2h eval: --turn needs 0 <= MIN <= MAX <= 180 degrees, got {turn[0]:g} {turn[1]:g}")
    try:
        cells = mx.matrix_cells(args.seed, sensors=args.sensors, families=args.families,
                                indoor_sensors=args.indoor_sensors, indoor_families=args.indoor_families,
                                mixed=args.mixed, mixed_families=args.mixed_families, real=args.real,
                                worlds=args.worlds)
    except ValueError as err:
        raise SystemExit(f"s2h eval: {err}") from err
    if not cells:
        raise SystemExit("s2h eval: the matrix has no cells")
    settings = mx.PairSettings(n=args.pairs_per_cell, distance=(args.min_distance, args.max_distance),
                               indoor_distance=tuple(args.indoor_distance), overlap=tuple(args.overlap),
                               turn=turn if turn != (0.0, 0.0) else None, min_shared_view=args.min_shared_view)
    names = [m.strip() for m in (args.methods or MATRIX_METHODS).split(",") if m.strip()]
    scales = list(dict.fromkeys(c.scale for c in cells))
    methods = {scale: build_methods(names, "pairs", scale, args) for scale in scales}
    result: dict[str, Any] = {
        "dataset": "matrix", "task": "pairs", "arguments": _arguments(args), "pair_settings": vars(settings),
        "settings": {scale: {n: method_settings(m) for n, m in ms.items()} for scale, ms in methods.items()},
        "models": _models(methods), "machine": _machine(args.threads), "interrupted": None}
    stopped = None
    with contextlib.ExitStack() as stack:
        stream = JsonLines(stack.enter_context(args.jsonl.open("w"))) if args.jsonl is not None else None
        records = Records(stream)

        def finished(cell: mx.Cell, done: list[dict]) -> None:
            tally = ", ".join(f"{m} {sum(r['registered'] for r in done if r['method'] == m)}/"
                              f"{sum(r['method'] == m for r in done)}" for m in names)
            print(f"s2h eval: [{cells.index(cell) + 1}/{len(cells)}] {cell.key}"
                  f"{'' if cell.seed is None else f' seed {cell.seed}'}: {tally} registered", file=sys.stderr)

        with on_stop_signals(raise_interrupted):
            try:
                mx.evaluate_matrix(cells, methods, settings, records, progress=not args.no_progress,
                                   on_cell=finished)
            except Interrupted as exc:
                stopped = exc.signum
                result["interrupted"] = signal_name(stopped)
    summary = mx.summarize_matrix(cells, records, settings.min_shared_view)
    totals = mx.matrix_totals(cells, records, names, settings.min_shared_view)
    result.update(cells=[mx.cell_record(c) for c in cells], summary=summary, totals=totals, pairs=list(records),
                  table=mx.matrix_table(cells, summary, names) + "\n" + mx.totals_table(totals, names))
    status = _write_matrix(args, result, cells, summary, names)
    if stopped is None:
        return status
    print(f"s2h eval: stopped by {signal_name(stopped)}; results so far ({len(records)} pair records) above"
          f"{' and written' if status == EXIT_OK and output_dirs(args) else ''}", file=sys.stderr)
    return exit_status(stopped)


def _write_matrix(args: argparse.Namespace, result: dict, cells: list, summary: dict, names: list[str]) -> int:
    from s2h_ros.evaluation import plots
    from s2h_ros.evaluation.matrix import recall_grid

    def draw() -> list[Path]:
        if not summary:
            return []
        rows, grid = recall_grid(cells, summary, names)
        return [plots.recall_heatmap(rows, names, grid, args.plots / "matrix_recall.png",
                                     title="recall (%) per cell and method")]

    return _write_results(args, result, draw)
