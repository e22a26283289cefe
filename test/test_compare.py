"""`s2h compare`: two evaluation runs of the same pairs, pair by pair (outcome transitions, flips
with McNemar's test, errors over pairs right in both, changed pairs, the regression gate)."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from scipy.stats import binomtest

from s2h_ros.cli import main
from s2h_ros.evaluation import comparison as cmp

S2H = str(Path(__file__).resolve().parents[1] / ".venv" / "bin" / "s2h")


def record(pair: str, right: bool, trusted: bool, method: str = "s2h", re: float | None = 0.1,
           te: float | None = 0.02, cell: str = "vlp16/town", safeguard: bool = False, wall: float = 1.0,
           message: str = "") -> dict:
    """A pair record as ``s2h eval --jsonl`` writes it (the fields the comparison reads)."""
    return {"method": method, "pair": pair, "cell": cell, "re_deg": re, "te_m": te, "registered": right,
            "success": trusted, "error": None, "wall_s": wall,
            "info": {"used_fallback": safeguard, "fallback": "", "message": message, "inliers": 100}}


def write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


BEFORE = [record("p0", True, True, re=0.20, te=0.030),
          record("p1", True, True, re=0.10, te=0.010),
          record("p2", False, False, re=40.0, te=5.0, safeguard=True),
          record("p3", True, False, re=0.30, te=0.050, cell="vlp16/highway"),
          record("p4", False, False, re=None, te=None, cell="vlp16/highway"),
          record("p5", True, True, re=0.50, te=0.040, cell="vlp16/highway")]
AFTER = [record("p0", True, True, re=0.10, te=0.020),  # both errors down
         record("p1", True, False, re=0.15, te=0.010, message="ambiguous"),  # RE up, TE tied; now refused
         record("p2", True, True, re=0.40, te=0.100),  # gained, no longer the safeguard's
         record("p3", True, False, re=0.20, te=0.060, cell="vlp16/highway"),
         record("p4", True, False, re=1.0, te=0.3, cell="vlp16/highway"),  # gained
         record("p5", False, True, re=12.0, te=3.0, cell="vlp16/highway")]  # lost, and trusted wrong


def test_each_pair_is_counted_once_in_the_transitions_flips_and_totals():
    report = cmp.compare_runs(cmp.select_run(BEFORE, None, "a"), cmp.select_run(AFTER, None, "b"))
    assert report["pairs"] == 6 and report["before"] == "a: s2h"
    b, a = report["totals"]["before"], report["totals"]["after"]
    assert (b["right"], b["trusted"], b["wrong_trusted"], b["safeguard"]) == (4, 3, 0, 1)
    assert (a["right"], a["trusted"], a["wrong_trusted"], a["safeguard"]) == (5, 3, 1, 0)
    t = report["transitions"]
    assert t["right, trusted"] == {"right, trusted": 1, "right, refused": 1, "wrong, refused": 0, "wrong, trusted": 1}
    assert t["wrong, refused"]["right, trusted"] == 1 and t["wrong, refused"]["right, refused"] == 1
    assert t["right, refused"]["right, refused"] == 1
    assert sum(sum(row.values()) for row in t.values()) == 6
    assert report["right"] == {"gained": 2, "lost": 1, "p_value": pytest.approx(binomtest(2, 3, 0.5).pvalue)}
    assert (report["right_trusted"]["gained"], report["right_trusted"]["lost"]) == (1, 2)
    assert (report["wrong_trusted"]["gained"], report["wrong_trusted"]["lost"]) == (1, 0)
    assert report["cells"]["vlp16/highway"]["after"]["right"] == 2 and report["cells"]["vlp16/town"]["after"]["right"] == 3
    # every pair but p3 changed its outcome or its use of the safeguard
    assert [c["pair"] for c in report["changed"]] == ["p1", "p2", "p4", "p5"]
    p2 = report["changed"][1]
    assert p2["before"]["safeguard"] and not p2["after"]["safeguard"] and p2["after"]["outcome"] == "right, trusted"
    assert report["changed"][0]["after"]["message"] == "ambiguous"
    assert cmp.regressions(report) == ["1 pair(s) newly wrong but trusted"]


def test_errors_are_compared_over_the_pairs_right_in_both_runs_only():
    e = cmp.compare_runs(cmp.select_run(BEFORE, None, "a"), cmp.select_run(AFTER, None, "b"))["errors_right_in_both"]
    assert e["pairs"] == 3  # p0, p1, p3
    assert e["re_deg"]["before_mean"] == pytest.approx(0.2) and e["re_deg"]["after_mean"] == pytest.approx(0.15)
    assert (e["re_deg"]["lower"], e["re_deg"]["higher"]) == (2, 1)
    assert (e["te_m"]["lower"], e["te_m"]["higher"]) == (1, 1)  # p1's TE tied
    assert e["te_m"]["after_median"] == pytest.approx(0.02)


def test_error_changes_at_floating_point_noise_are_ties():
    after = [dict(r, re_deg=r["re_deg"] + 1e-9, te_m=r["te_m"] - 1e-12) if r["re_deg"] is not None else r
             for r in BEFORE]
    e = cmp.compare_runs(cmp.select_run(BEFORE, None, "a"), cmp.select_run(after, None, "b"))["errors_right_in_both"]
    assert e["pairs"] == 4
    assert (e["re_deg"]["lower"], e["re_deg"]["higher"], e["te_m"]["lower"], e["te_m"]["higher"]) == (0, 0, 0, 0)


def test_a_run_against_itself_changes_nothing():
    run = cmp.select_run(BEFORE, None, "a")
    report = cmp.compare_runs(run, run)
    assert report["changed"] == [] and cmp.regressions(report) == []
    assert report["right"] == {"gained": 0, "lost": 0, "p_value": None}
    assert report["errors_right_in_both"]["re_deg"]["lower"] == 0
    assert "No pair changed" in cmp.comparison_markdown(report)


def test_pairs_evaluated_by_one_run_only_are_listed_and_left_out(tmp_path, capsys):
    before = write(tmp_path / "before.jsonl", BEFORE)
    after = write(tmp_path / "after.jsonl", AFTER[:4] + [record("p9", True, True)])
    assert main(["compare", str(before), str(after), "--json", str(tmp_path / "c.json")]) == 0
    report = json.loads((tmp_path / "c.json").read_text())
    assert report["pairs"] == 4
    assert report["only_before"] == [["vlp16/highway", "p4"], ["vlp16/highway", "p5"]]
    assert report["only_after"] == [["vlp16/town", "p9"]]
    assert "4 pairs in both runs; left out, in one run only: 2 before, 1 after" in capsys.readouterr().out


def test_one_file_compares_two_of_its_methods_and_writes_markdown(tmp_path, capsys):
    run = write(tmp_path / "run.jsonl", BEFORE + [dict(r, method="s2h:weights=ft.pt") for r in AFTER])
    md = tmp_path / "out" / "c.md"
    assert main(["compare", str(run), "--methods", "s2h", "s2h:weights=ft.pt", "--markdown", str(md)]) == 0
    out = capsys.readouterr()
    assert md.read_text().strip() == out.out.strip()
    assert out.out.startswith(f"# {run}: s2h -> {run}: s2h:weights=ft.pt")
    assert "| right | 4 | 5 |" in out.out and "| vlp16/highway | 3 | 2 -> 2 |" in out.out
    assert "regression: 1 pair(s) newly wrong but trusted" in out.err


def test_the_regression_gate_fails_on_a_newly_wrong_trusted_pair_or_lost_recall(tmp_path, capsys):
    before = write(tmp_path / "before.jsonl", BEFORE)
    assert main(["compare", str(before), str(write(tmp_path / "after.jsonl", AFTER)), "--fail-on-regression"]) == 1
    worse = [dict(r, registered=False, success=False) if r["pair"] in ("p0", "p1") else r for r in BEFORE]
    assert main(["compare", str(before), str(write(tmp_path / "worse.jsonl", worse)), "--fail-on-regression"]) == 1
    assert "right pairs lost 2, gained 0" in capsys.readouterr().err
    assert main(["compare", str(before), str(before), "--fail-on-regression"]) == 0


@pytest.mark.parametrize("lines, argv, message", [
    (['{"method": "s2h", "pair": "p0", "registered": true, "success": true}', "{not json"], [],
     "run.jsonl:2: not JSON"),
    (['{"method": "s2h", "pair": "p0"}'], [], "run.jsonl:1: not a pair record of s2h eval (missing registered, success)"),
    (["[1, 2]"], [], "run.jsonl:1: not a pair record"),
    ([], [], "holds no records"),
    ([json.dumps(record("p0", True, True)), json.dumps(record("p0", True, True, method="icp"))], [],
     "holds methods icp, s2h: name one with --methods"),
    ([json.dumps(record("p0", True, True))], ["--methods", "icp"], "has no records of method 'icp' (it has s2h)"),
    ([json.dumps(record("p0", True, True))] * 2, [], "records pair p0 (vlp16/town) twice for s2h"),
    ([json.dumps({"pairs": [record("p0", True, True), {"method": "s2h"}]})], [],
     "run.jsonl:pairs[1]: not a pair record"),
    ([json.dumps({"pairs": 3})], [], 'its "pairs" is not a list'),
])
def test_unreadable_or_ambiguous_records_are_one_stderr_line_and_status_2(tmp_path, capsys, lines, argv, message):
    bad = tmp_path / "run.jsonl"
    bad.write_text("".join(line + "\n" for line in lines))
    good = write(tmp_path / "good.jsonl", BEFORE)
    assert main(["compare", str(good), str(bad), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("s2h compare: ") and message in err and err.count("\n") == 1


def test_missing_files_methods_and_disjoint_runs_are_refused(tmp_path, capsys):
    good = write(tmp_path / "good.jsonl", BEFORE)
    other = write(tmp_path / "other.jsonl", [record("q0", True, True)])
    for argv, message in (([str(good), str(tmp_path / "nope.jsonl")], "cannot read"),
                          ([str(good)], "name the two methods to compare"),
                          ([str(good), str(good), str(good)], "one or two files"),
                          ([str(good), str(other)], "have no pair in common")):
        assert main(["compare", *argv]) == 2
        assert message in capsys.readouterr().err


def test_compare_reads_the_records_that_s2h_eval_streams(tmp_path):
    env = {**os.environ, "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1"}
    run = tmp_path / "run.jsonl"
    proc = subprocess.run(
        [S2H, "eval", "--dataset", "synthetic", "--n-pairs", "2", "--methods", "icp,fpfh_ransac", "--threads", "1",
         "--no-progress", "--jsonl", str(run), "--json", str(tmp_path / "run.json")],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    proc = subprocess.run([S2H, "compare", str(run), "--methods", "icp", "fpfh_ransac", "--json",
                           str(tmp_path / "c.json")], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "c.json").read_text())
    summary = json.loads((tmp_path / "run.json").read_text())["summary"]
    assert report["pairs"] == 2
    for side, method in (("before", "icp"), ("after", "fpfh_ransac")):
        totals = report["totals"][side]
        assert totals["right"] == round(summary[method]["recall"] * 2)
        assert (totals["trusted"], totals["wrong_trusted"]) == (summary[method]["trusted"],
                                                                summary[method]["wrong_trusted"])
        assert totals["safeguard"] is None  # neither baseline reports DGR's safeguard
    assert "RANSAC safeguard (of it trusted) | - | - |" in proc.stdout
    # the run's --json file holds the same records: the same comparison
    from_json = cmp.compare_runs(*(cmp.select_run(cmp.load_records(tmp_path / "run.json"), m, "run")
                                   for m in ("icp", "fpfh_ransac")))
    assert from_json["totals"] == report["totals"] and from_json["transitions"] == report["transitions"]
