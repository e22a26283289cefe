"""The ``s2h`` command.

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and
``run(args) -> int``; modules are imported only when their subcommand runs, so ``s2h --help``
stays fast and a subcommand's heavy dependencies (torch, Open3D) load only when needed.
Benchmarks (``s2h bench NAME``) expose ``add_arguments(parser)`` and ``run(args) -> dict``;
the dict is printed and, with ``--json PATH``, written as JSON.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import NoReturn

from s2h_ros.outputs import json_text, write_json

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "register": ("s2h_ros.commands.register", "register a source cloud to a target cloud"),
    "eval": ("s2h_ros.commands.eval", "evaluate methods on pairs or sequences (metrics, tables, plots)"),
    "simulate": ("s2h_ros.commands.simulate", "generate a synthetic lidar sequence (KITTI layout, rosbag2)"),
    "train": ("s2h_ros.commands.train", "train FCGF features or the inlier/S2H network"),
    "replay": ("s2h_ros.commands.replay", "replay a KITTI sequence or rosbag2 through registration_node"),
    "compare": ("s2h_ros.commands.compare", "compare two evaluation runs of the same pairs, pair by pair"),
    "figure": ("s2h_ros.commands.figure", "draw the paper's figures on real data (e.g. ambiguity)"),
    "bench": ("", "run a benchmark and write JSON (s2h bench NAME --json out.json)"),
}

# bench name -> (module, one-line help)
BENCHMARKS: dict[str, tuple[str, str]] = {
    "matching": ("s2h_ros.benchmarks.matching", "S-step and H-step time and objective, dense vs sparse"),
    "features": ("s2h_ros.benchmarks.features", "FCGF forward time and peak memory per preset"),
    "pointcloud2": ("s2h_ros.benchmarks.pointcloud2", "PointCloud2 <-> numpy conversion time"),
    "pipeline": ("s2h_ros.benchmarks.pipeline", "register() time per stage against FPFH + RANSAC"),
    "stages": ("s2h_ros.benchmarks.stages", "time of each registration stage per device (GPU vs CPU in one run)"),
    "replay": ("s2h_ros.benchmarks.replay", "registration_node under a live stream vs KISS-ICP"),
    "stream": ("s2h_ros.benchmarks.stream", "the node's odometry under a sensor-rate stream in one process, any device"),
    "prediction": ("s2h_ros.benchmarks.prediction", "the motion prior's error when a scan comes late, on ground-truth trajectories"),
    "trust": ("s2h_ros.benchmarks.trust", "wrong-but-trusted and needlessly rejected scans per sensor preset"),
    "robustness": ("s2h_ros.benchmarks.robustness", "every bad-input and fault case against the node, CLI and library; soak"),
}


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one stderr line, ``s2h NAME: error: ... (see --help)``, exit 2
    (argparse itself prints the whole usage block first; ``s2h register`` documents one line)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _available(table: dict[str, tuple[str, str]]) -> dict[str, tuple[str, str]]:
    """Entries whose module exists in this checkout (so --help never lists a missing command)."""
    out = {}
    for name, (module, text) in table.items():
        if not module or importlib.util.find_spec(module) is not None:
            out[name] = (module, text)
    return out


def _top_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="s2h", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, text) in _available(COMMANDS).items():
        sub.add_parser(name, help=text, add_help=False)
    return parser


def _run_bench(argv: list[str]) -> int:
    benches = _available(BENCHMARKS)
    parser = argparse.ArgumentParser(prog="s2h bench", description="Benchmarks; JSON out with --json.")
    sub = parser.add_subparsers(dest="bench", metavar="NAME", required=True)
    for name, (module, text) in benches.items():
        p = sub.add_parser(name, help=text)
        p.add_argument("--json", type=Path, help="write the results here as JSON")
        p.set_defaults(_module=module)
    # Parse the name first, then let the benchmark add its own options.
    known, _ = parser.parse_known_args(argv[:1] or ["--help"])
    module = importlib.import_module(known._module)
    p = sub.choices[known.bench]
    module.add_arguments(p)
    args = parser.parse_args(argv)
    result = module.run(args)
    print(json_text(result))
    if args.json is not None:
        write_json(args.json, result)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    top = _top_parser()
    if not argv or argv[0] in ("-h", "--help"):
        top.print_help()
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        from s2h_ros import __version__

        print(__version__)
        return 0
    commands = _available(COMMANDS)
    name, rest = argv[0], argv[1:]
    if name not in commands:
        top.error(f"unknown command {name!r} (choose from {', '.join(commands)})")
    if name == "bench":
        return _run_bench(rest)
    module = importlib.import_module(commands[name][0])
    parser = _Parser(prog=f"s2h {name}", description=commands[name][1])
    module.add_arguments(parser)
    args = parser.parse_args(rest)
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
