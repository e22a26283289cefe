"""``s2h compare``: two evaluation runs of the same pairs, pair by pair.

    s2h compare before.jsonl after.jsonl                  # one method in each file
    s2h compare run.jsonl --methods s2h "s2h:weights=ft.pt"   # two methods of one run
    s2h compare before.jsonl after.jsonl --methods s2h --json cmp.json --markdown cmp.md

The files are ``s2h eval`` output: its ``--jsonl`` records or its ``--json`` file. The Markdown
goes to stdout (and ``--markdown``), the full comparison with every changed pair to ``--json``.
Exit status 0; 1 with ``--fail-on-regression`` when the second run trusts a wrong pair that the
first did not or loses more right pairs than it gains (a gate for a user's own weights); 2 for
unreadable or incomparable records, with one stderr line.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

EXIT_REGRESSION = 1
EXIT_BAD_INPUT = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN.jsonl",
                        help="one file with both methods, or the before and the after file (s2h eval --jsonl or --json)")
    parser.add_argument("--methods", nargs="+", metavar="METHOD",
                        help="BEFORE [AFTER] method names (one file: both needed; two files: one name "
                             "for both, or one each; default: each file's only method)")
    parser.add_argument("--json", type=Path, help="write the comparison here as JSON")
    parser.add_argument("--markdown", type=Path, help="write the Markdown here as well")
    parser.add_argument("--fail-on-regression", action="store_true",
                        help="exit 1 when the second run trusts a wrong pair the first did not, or "
                             "loses more right pairs than it gains")


def _runs(args: argparse.Namespace):
    from s2h_ros.evaluation.comparison import ComparisonError, load_records, select_run

    if len(args.runs) > 2:
        raise ComparisonError(f"give one or two files, not {len(args.runs)}")
    methods = list(args.methods or [])
    if len(methods) > 2:
        raise ComparisonError(f"--methods takes BEFORE [AFTER], not {len(methods)} names")
    if len(args.runs) == 1:
        if len(methods) != 2:
            raise ComparisonError("one file: name the two methods to compare, --methods BEFORE AFTER")
        records = load_records(args.runs[0])
        return (select_run(records, methods[0], str(args.runs[0])),
                select_run(records, methods[1], str(args.runs[0])))
    names = methods * 2 if len(methods) == 1 else (methods or [None, None])
    return tuple(select_run(load_records(path), name, str(path)) for path, name in zip(args.runs, names))


def run(args: argparse.Namespace) -> int:
    from s2h_ros.evaluation.comparison import ComparisonError, compare_runs, comparison_markdown, regressions
    from s2h_ros.outputs import write_json, write_text

    try:
        before, after = _runs(args)
        report = compare_runs(before, after)
    except ComparisonError as exc:
        print(f"s2h compare: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    report["regressions"] = regressions(report)
    text = comparison_markdown(report)
    print(text)
    try:
        if args.json is not None:
            write_json(args.json, report)
        if args.markdown is not None:
            write_text(args.markdown, text)
    except OSError as exc:
        print(f"s2h compare: cannot write {exc.filename}: {exc.strerror}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if report["regressions"]:
        print(f"s2h compare: regression: {'; '.join(report['regressions'])}", file=sys.stderr)
        if args.fail_on_regression:
            return EXIT_REGRESSION
    return 0
