"""Two evaluation runs of the same pairs, compared pair by pair (``s2h compare``).

An A/B of two weights files, two configurations or two commits is read from the per-pair records
that ``s2h eval`` writes (``--jsonl``: one JSON object per method and pair; ``--json``: its
``pairs``). Totals alone hide what changed: two more pairs right can be three gained and one lost,
and a lower mean error can come from one large error falling while most pairs got worse. So the comparison keeps the pairs both
runs evaluated, and reports

- each run's totals over those pairs: right (within the cell's recall thresholds, as the run
  recorded it), trusted, wrong but trusted, DGR's RANSAC safeguard, errors, time per pair;
- every pair's outcome before and after (right or wrong, trusted or refused) as a transition
  table, and the flips of "right" and of "right and trusted" with an exact McNemar test (a
  two-sided binomial test on the discordant pairs: how likely so lopsided a split is if the two
  runs were equally good);
- RE and TE over the pairs right in both runs: means, medians, and on how many pairs each went
  down or up, with a two-sided sign test;
- the same counts per cell, and the pairs whose outcome or safeguard changed, with their errors
  and the pipeline's message.

The tests are scipy's ``binomtest``; what is written here is only the bookkeeping of which record
is which pair.
"""
from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from s2h_ros.evaluation.harness import trust_counts

OUTCOMES = ("right, trusted", "right, refused", "wrong, refused", "wrong, trusted")
# Error changes smaller than these are ties, not pairs that moved: the same code on another
# machine or thread count differs by about 1e-12 deg and 1e-14 m.
TIES = {"re_deg": 1e-6, "te_m": 1e-6}
PairKey = tuple[str, str]  # (cell or "", pair name)


class ComparisonError(ValueError):
    """Records that cannot be compared (unreadable, ambiguous method, no pairs in common)."""


@dataclass(frozen=True)
class Run:
    """One side of a comparison: a label (``file: method``) and its records by pair."""

    label: str
    records: dict[PairKey, dict]


def load_records(path: str | Path) -> list[dict]:
    """The pair records of an ``s2h eval`` run: its ``--jsonl`` file (one record a line) or its
    ``--json`` file (the ``pairs`` list). A record that is not a JSON object with ``method``,
    ``pair``, ``registered`` and ``success`` is an error naming the file and line (or index)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ComparisonError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ComparisonError(f"{path} is not text (expected s2h eval --jsonl or --json output)") from exc
    whole = _whole_json(text)
    if isinstance(whole, dict) and "pairs" in whole:
        if not isinstance(whole["pairs"], list):
            raise ComparisonError(f"{path}: its \"pairs\" is not a list of records")
        numbered = [(f"pairs[{i}]", r) for i, r in enumerate(whole["pairs"])]
    else:
        numbered = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                numbered.append((str(number), json.loads(line)))
            except json.JSONDecodeError as exc:
                raise ComparisonError(f"{path}:{number}: not JSON ({exc.msg})") from exc
    for where, record in numbered:
        missing = [k for k in ("method", "pair", "registered", "success") if not isinstance(record, dict)
                   or k not in record]
        if missing:
            raise ComparisonError(f"{path}:{where}: not a pair record of s2h eval "
                                  f"(missing {', '.join(missing)})")
    if not numbered:
        raise ComparisonError(f"{path} holds no records")
    return [record for _, record in numbered]


def _whole_json(text: str) -> Any:
    """``text`` as one JSON document (an ``s2h eval --json`` file), or None when it is not one
    (JSON lines, or not JSON at all)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def pair_key(record: dict) -> PairKey:
    """A record's pair: its cell (matrix runs) and pair name."""
    return (str(record.get("cell") or ""), str(record["pair"]))


def select_run(records: list[dict], method: str | None, source: str) -> Run:
    """The records of one ``method`` (None: the only method in ``records``) keyed by pair; a pair
    recorded twice for the method is an error (two runs appended to one file)."""
    methods = sorted({r["method"] for r in records})
    if method is None:
        if len(methods) != 1:
            raise ComparisonError(f"{source} holds methods {', '.join(methods)}: name one with --methods")
        method = methods[0]
    elif method not in methods:
        raise ComparisonError(f"{source} has no records of method {method!r} (it has {', '.join(methods)})")
    by_pair: dict[PairKey, dict] = {}
    for r in records:
        if r["method"] != method:
            continue
        key = pair_key(r)
        if key in by_pair:
            raise ComparisonError(f"{source} records pair {key[1]}{f' ({key[0]})' if key[0] else ''} "
                                  f"twice for {method}")
        by_pair[key] = r
    return Run(label=f"{source}: {method}", records=by_pair)


def outcome(record: dict) -> str:
    """One of ``OUTCOMES``: right or wrong (the run's recall thresholds), trusted or refused."""
    right, trusted = bool(record["registered"]), bool(record["success"])
    return f"{'right' if right else 'wrong'}, {'trusted' if trusted else 'refused'}"


def _safeguard(record: dict) -> bool:
    return bool(record.get("info", {}).get("used_fallback", False))


def _error(value: Any) -> float:
    """RE or TE as recorded (None where the method gave no estimate) -> float, inf for none."""
    return math.inf if value is None else float(value)


def split_p(gained: int, lost: int) -> float | None:
    """Two-sided exact binomial test at 1/2 of ``gained`` against ``lost``: McNemar's test on the
    pairs whose outcome flipped, the sign test on the errors that moved; None when none did."""
    from scipy.stats import binomtest

    n = gained + lost
    return None if n == 0 else float(binomtest(gained, n, 0.5).pvalue)


def run_totals(records: Iterable[dict]) -> dict[str, Any]:
    """Counts over one run's records: pairs, right, trusted, wrong but trusted, the RANSAC
    safeguard (of it trusted; None for methods that do not report it), errors, mean seconds."""
    records = list(records)
    counts = trust_counts(records)
    wall = [float(r["wall_s"]) for r in records if r.get("wall_s") is not None]
    return {"pairs": len(records), "right": sum(bool(r["registered"]) for r in records),
            "trusted": counts["trusted"], "wrong_trusted": counts["wrong_trusted"],
            "right_trusted": sum(bool(r["registered"]) and bool(r["success"]) for r in records),
            "safeguard": counts["fallbacks"], "safeguard_trusted": counts["trusted_fallbacks"],
            "errors": sum(r.get("error") is not None for r in records),
            "time_mean_s": float(np.mean(wall)) if wall else None}


def flips(before: list[dict], after: list[dict], holds) -> dict[str, Any]:
    """Pairs where ``holds(record)`` turned true (gained) or false (lost), and McNemar's p."""
    gained = sum(not holds(b) and holds(a) for b, a in zip(before, after))
    lost = sum(holds(b) and not holds(a) for b, a in zip(before, after))
    return {"gained": gained, "lost": lost, "p_value": split_p(gained, lost)}


def paired_errors(before: list[dict], after: list[dict]) -> dict[str, Any]:
    """RE (deg) and TE (m) over the pairs right in both runs: mean and median of each run, how
    many pairs went down and up (changes within ``TIES`` are ties), and the two-sided sign test's p."""
    both = [(b, a) for b, a in zip(before, after) if b["registered"] and a["registered"]]
    out: dict[str, Any] = {"pairs": len(both)}
    for name in ("re_deg", "te_m"):
        old = np.array([_error(b[name]) for b, _ in both])
        new = np.array([_error(a[name]) for _, a in both])
        down, up = int(np.sum(new < old - TIES[name])), int(np.sum(new > old + TIES[name]))
        out[name] = {**_centres("before", old), **_centres("after", new),
                     "lower": down, "higher": up, "sign_test_p": split_p(down, up)}
    return out


def _centres(side: str, errors: np.ndarray) -> dict[str, float | None]:
    """``{side}_mean`` and ``{side}_median`` of ``errors`` (None for no pairs)."""
    empty = len(errors) == 0
    return {f"{side}_mean": None if empty else float(errors.mean()),
            f"{side}_median": None if empty else float(np.median(errors))}


def _pair_view(record: dict) -> dict[str, Any]:
    info = record.get("info", {})
    return {"outcome": outcome(record), "re_deg": record.get("re_deg"), "te_m": record.get("te_m"),
            "inliers": info.get("inliers"), "safeguard": _safeguard(record),
            "message": info.get("message") or info.get("fallback") or record.get("error") or ""}


def changed_pairs(keys: list[PairKey], before: list[dict], after: list[dict]) -> list[dict]:
    """The pairs whose outcome or use of the RANSAC safeguard differs between the runs."""
    return [{"cell": key[0], "pair": key[1], "before": _pair_view(b), "after": _pair_view(a)}
            for key, b, a in zip(keys, before, after)
            if outcome(b) != outcome(a) or _safeguard(b) != _safeguard(a)]


def compare_runs(before: Run, after: Run) -> dict[str, Any]:
    """The comparison of two runs over the pairs both evaluated (module docstring); pairs in one
    run only are counted and listed, never compared."""
    keys = [k for k in before.records if k in after.records]
    if not keys:
        raise ComparisonError(f"{before.label} and {after.label} have no pair in common")
    old = [before.records[k] for k in keys]
    new = [after.records[k] for k in keys]
    transitions = {o: {n: 0 for n in OUTCOMES} for o in OUTCOMES}
    for b, a in zip(old, new):
        transitions[outcome(b)][outcome(a)] += 1
    cells: dict[str, dict[str, Any]] = {}
    for cell in dict.fromkeys(k[0] for k in keys):
        mine = [i for i, k in enumerate(keys) if k[0] == cell]
        cells[cell] = {"before": run_totals(old[i] for i in mine), "after": run_totals(new[i] for i in mine)}
    return {
        "before": before.label, "after": after.label, "pairs": len(keys),
        "only_before": [list(k) for k in before.records if k not in after.records],
        "only_after": [list(k) for k in after.records if k not in before.records],
        "totals": {"before": run_totals(old), "after": run_totals(new)},
        "transitions": transitions,
        "right": flips(old, new, lambda r: bool(r["registered"])),
        "right_trusted": flips(old, new, lambda r: bool(r["registered"]) and bool(r["success"])),
        "wrong_trusted": flips(old, new, lambda r: bool(r["success"]) and not r["registered"]),
        "errors_right_in_both": paired_errors(old, new),
        "cells": cells,
        "changed": changed_pairs(keys, old, new),
    }


def regressions(report: dict) -> list[str]:
    """What a change must not do, as sentences (empty: none): make a pair wrong but trusted that
    was not, or lose more right pairs than it gains."""
    out = []
    if report["wrong_trusted"]["gained"]:
        out.append(f"{report['wrong_trusted']['gained']} pair(s) newly wrong but trusted")
    right = report["right"]
    if right["lost"] > right["gained"]:
        out.append(f"right pairs lost {right['lost']}, gained {right['gained']}")
    return out


# ------------------------------------------------------------------------------ Markdown


def _p(value: float | None) -> str:
    return "-" if value is None else f"{value:.2g}"


def _count(totals: dict, key: str, trusted_key: str | None = None) -> str:
    value = totals[key]
    if value is None:
        return "-"
    return f"{value} ({totals[trusted_key]})" if trusted_key else str(value)


def comparison_markdown(report: dict) -> str:
    """The comparison as Markdown: totals, transitions, flips, errors, cells, changed pairs."""
    sections = (_totals_section, _flips_section, _errors_section, _cells_section, _changed_section)
    return "\n".join(line for section in sections for line in section(report))


def _totals_section(report: dict) -> list[str]:
    from s2h_ros.evaluation.report import _fmt, markdown_table

    b, a = report["totals"]["before"], report["totals"]["after"]
    lines = [f"# {report['before']} -> {report['after']}", "",
             f"{report['pairs']} pairs in both runs"
             + (f"; left out, in one run only: {len(report['only_before'])} before, "
                f"{len(report['only_after'])} after" if report["only_before"] or report["only_after"] else "")
             + ".", ""]
    rows = [["right", str(b["right"]), str(a["right"])],
            ["right and trusted", str(b["right_trusted"]), str(a["right_trusted"])],
            ["trusted", str(b["trusted"]), str(a["trusted"])],
            ["wrong but trusted", str(b["wrong_trusted"]), str(a["wrong_trusted"])],
            ["RANSAC safeguard (of it trusted)", _count(b, "safeguard", "safeguard_trusted"),
             _count(a, "safeguard", "safeguard_trusted")],
            ["errors (no estimate)", str(b["errors"]), str(a["errors"])],
            ["mean time per pair (s)", _fmt(b["time_mean_s"]), _fmt(a["time_mean_s"])]]
    return lines + [markdown_table(["", "before", "after"], rows)]


def _flips_section(report: dict) -> list[str]:
    from s2h_ros.evaluation.report import markdown_table

    lines = ["Pair by pair (exact McNemar p: how likely so lopsided a split of the changed pairs is "
             "between two equally good runs):", ""]
    for name, title in (("right", "right"), ("right_trusted", "right and trusted"),
                        ("wrong_trusted", "wrong but trusted")):
        f = report[name]
        lines.append(f"- {title}: gained {f['gained']}, lost {f['lost']} (p = {_p(f['p_value'])})")
    lines += ["", "Outcomes, before (rows) -> after (columns):", ""]
    return lines + [markdown_table(["before \\ after", *OUTCOMES],
                                   [[o, *(str(report["transitions"][o][n]) for n in OUTCOMES)] for o in OUTCOMES])]


def _errors_section(report: dict) -> list[str]:
    from s2h_ros.evaluation.report import _fmt, markdown_table

    e = report["errors_right_in_both"]
    return [f"Errors over the {e['pairs']} pairs right in both runs (sign test p over the pairs that moved):", "",
            markdown_table(
                ["", "mean before", "mean after", "median before", "median after", "lower", "higher", "sign test p"],
                [[label, _fmt(e[k]["before_mean"], scale, d), _fmt(e[k]["after_mean"], scale, d),
                  _fmt(e[k]["before_median"], scale, d), _fmt(e[k]["after_median"], scale, d),
                  str(e[k]["lower"]), str(e[k]["higher"]), _p(e[k]["sign_test_p"])]
                 for label, k, scale, d in (("RE (deg)", "re_deg", 1.0, 3), ("TE (cm)", "te_m", 100.0, 2))])]


def _cells_section(report: dict) -> list[str]:
    from s2h_ros.evaluation.report import markdown_table

    if len(report["cells"]) <= 1 and "" in report["cells"]:
        return []
    return ["Per cell (before -> after):", "",
            markdown_table(
                ["cell", "pairs", "right", "trusted", "wrong but trusted", "RANSAC safeguard"],
                [[cell or "-", str(c["before"]["pairs"]),
                  f"{c['before']['right']} -> {c['after']['right']}",
                  f"{c['before']['trusted']} -> {c['after']['trusted']}",
                  f"{c['before']['wrong_trusted']} -> {c['after']['wrong_trusted']}",
                  f"{_count(c['before'], 'safeguard')} -> {_count(c['after'], 'safeguard')}"]
                 for cell, c in report["cells"].items()])]


def _changed_section(report: dict) -> list[str]:
    from s2h_ros.evaluation.report import _fmt, markdown_table

    if not report["changed"]:
        return ["No pair changed its outcome or its use of the RANSAC safeguard.", ""]

    def side(c: dict, when: str) -> str:
        return c[when]["outcome"] + (", safeguard" if c[when]["safeguard"] else "")

    def inliers(c: dict, when: str) -> str:
        return "-" if c[when]["inliers"] is None else str(c[when]["inliers"])

    return [f"Pairs whose outcome or safeguard changed ({len(report['changed'])}):", "",
            markdown_table(
                ["cell", "pair", "before", "after", "RE before / after (deg)", "TE before / after (cm)",
                 "inliers before / after", "message after"],
                [[c["cell"] or "-", c["pair"], side(c, "before"), side(c, "after"),
                  f"{_fmt(c['before']['re_deg'], 1.0, 3)} / {_fmt(c['after']['re_deg'], 1.0, 3)}",
                  f"{_fmt(c['before']['te_m'], 100.0)} / {_fmt(c['after']['te_m'], 100.0)}",
                  f"{inliers(c, 'before')} / {inliers(c, 'after')}",
                  c["after"]["message"].replace("|", "/")]
                 for c in report["changed"]])]
