"""The evaluation matrix (`s2h eval --dataset matrix`): cells, held-out seeds, mixed-sensor and
indoor pairs, ground-truth inlier fractions, and the JSON / Markdown / heat-map outputs."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from s2h_ros.commands.eval import MATRIX_DEFAULTS
from s2h_ros.datasets.types import PointCloudPair, overlap_fractions, overlap_ratio
from s2h_ros.evaluation import matrix as mx
from s2h_ros.evaluation.harness import run_pair, truth_inliers
from s2h_ros.evaluation.methods import MethodResult

S2H = str(Path(__file__).resolve().parents[1] / ".venv" / "bin" / "s2h")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_parser_defaults_match_the_library_defaults():
    assert MATRIX_DEFAULTS == {
        "sensors": mx.OUTDOOR_SENSORS, "families": mx.OUTDOOR_FAMILIES, "indoor_sensors": mx.INDOOR_SENSORS,
        "indoor_families": mx.INDOOR_FAMILIES, "mixed": mx.MIXED, "mixed_families": mx.MIXED_FAMILIES,
        "real": mx.REAL}


def test_default_matrix_cells_have_distinct_held_out_seeds_and_the_real_rows():
    cells = mx.matrix_cells(0)
    keys = [c.key for c in cells]
    outdoor = [c for c in cells if c.kind == "sensor" and c.scale == "outdoor"]
    assert len(outdoor) == len(mx.OUTDOOR_SENSORS) * len(mx.OUTDOOR_FAMILIES)
    assert {c.key for c in cells if c.scale == "indoor" and c.kind == "sensor"} == {
        "depth_camera/rooms", "depth_camera/office", "depth_camera/warehouse"}
    assert keys[-2:] == ["real/kitti-loop", "real/3dmatch-demo"]
    assert [c.seed for c in cells[-2:]] == [None, None]
    seeds = [c.seed for c in cells if c.kind != "real"]
    assert all(0 <= s < 1000 for s in seeds)
    assert len(set(seeds)) == len(seeds)
    mixed = [c for c in cells if c.kind == "mixed"]
    assert len(mixed) == len(mx.MIXED) * len(mx.MIXED_FAMILIES)
    assert all(c.sensor != c.target_sensor for c in mixed)
    # a cell keeps its world when the matrix around it changes; another base seed moves every world
    alone = mx.matrix_cells(0, sensors="os1_64", families="tunnel", indoor_sensors="", mixed="", real="")
    assert alone[0].seed == next(c.seed for c in cells if c.key == "os1_64/tunnel")
    other = {c.key: c.seed for c in mx.matrix_cells(1)}
    assert sum(other[c.key] != c.seed for c in cells if c.seed is not None) >= len(seeds) - 2


def test_colliding_cell_seeds_move_on_to_a_free_one(monkeypatch):
    monkeypatch.setattr(mx, "cell_seed", lambda base, key: 999)
    cells = mx.matrix_cells(0, sensors="vlp16,hdl32", families="town,highway", indoor_sensors="", mixed="",
                            real="")
    assert [c.seed for c in cells] == [999, 0, 1, 2]


def test_named_worlds_replace_the_drawn_ones_and_the_other_cells_keep_away_from_them(monkeypatch):
    monkeypatch.setattr(mx, "cell_seed", lambda base, key: 5)
    cells = mx.matrix_cells(0, sensors="vlp16", families="town,highway", indoor_sensors="depth_camera",
                            indoor_families="rooms", mixed="vlp16:os1_128", mixed_families="town", real="",
                            worlds="depth_camera/rooms=5, vlp16>os1_128/town=264")
    seeds = {c.key: c.seed for c in cells}
    assert seeds == {"vlp16/town": 6, "vlp16/highway": 7, "depth_camera/rooms": 5, "vlp16>os1_128/town": 264}


@pytest.mark.parametrize("worlds, message", [
    ("vlp16/tunnel=5", "does not have: vlp16/tunnel"),
    ("vlp16/town=1000", "held-out seed 0-999"),
    ("vlp16/town=x", "held-out seed"),
    ("vlp16/town", "CELL=SEED"),
    ("vlp16/town=5,vlp16/town=6", "twice"),
    ("vlp16/town=5,vlp16/highway=5", "one world to two cells"),
])
def test_bad_named_worlds_are_refused(worlds, message):
    with pytest.raises(ValueError, match=message):
        mx.matrix_cells(0, sensors="vlp16", families="town,highway", indoor_sensors="", mixed="", real="",
                        worlds=worlds)


@pytest.mark.parametrize("kwargs, message", [
    ({"sensors": "vlp99"}, "unknown sensor vlp99"),
    ({"families": "town,rooms"}, "must be outdoor families"),
    ({"indoor_families": "tunnel"}, "must be indoor families"),
    ({"mixed": "vlp16"}, "SOURCE:TARGET"),
    ({"mixed": "vlp16:vlp16"}, "two different sensors"),
    ({"real": "kitti-pairs"}, "unknown real pair"),
])
def test_bad_cell_lists_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        mx.matrix_cells(0, **kwargs)


def test_mixed_sensor_pair_is_each_sensors_own_scan_of_the_same_frames():
    from s2h_ros.datasets.synthetic import synthetic_pairs

    mixed = synthetic_pairs(1, 77, sensor="vlp16", target_sensor="os1_128")[0]
    src_only = synthetic_pairs(1, 77, sensor="vlp16")[0]
    tgt_only = synthetic_pairs(1, 77, sensor="os1_128")[0]
    assert mixed.meta["sensor"] == "vlp16" and mixed.meta["target_sensor"] == "os1_128"
    assert "target_sensor" not in src_only.meta
    np.testing.assert_array_equal(mixed.source, src_only.source)
    np.testing.assert_array_equal(mixed.target, tgt_only.target)
    np.testing.assert_allclose(mixed.T_gt, src_only.T_gt, atol=1e-12)
    assert not np.array_equal(mixed.target, src_only.target)
    assert len(mixed.target) > 4 * len(mixed.source)  # 128 beams x 2048 against 16 x 1800


def test_indoor_cell_pairs_lie_in_the_overlap_range_and_are_turned():
    cell = mx.matrix_cells(3, sensors="", indoor_families="office", mixed="", real="")[0]
    assert (cell.key, cell.scale, cell.threshold.te_m) == ("depth_camera/office", "indoor", 0.3)
    pairs = mx.cell_pairs(cell, mx.PairSettings(n=2, turn=(90.0, 180.0)))
    assert len(pairs) == 2
    for pair in pairs:
        assert 0.3 <= overlap_ratio(pair) <= 0.6  # measured again on the turned pair
        assert pair.meta["overlap"] <= pair.meta["shared_view"]
        assert 1.0 <= pair.meta["distance"] <= 3.0
        assert 90.0 <= abs(pair.meta["turn_deg"]) <= 180.0
        assert pair.meta["seed"] == cell.seed


def test_overlap_fractions_tell_a_narrow_view_inside_a_wide_one_from_two_views_that_look_apart():
    grid = np.stack(np.meshgrid(np.arange(0.0, 40.0, 0.1), np.arange(0.0, 10.0, 0.1)), -1).reshape(-1, 2)
    wall = np.c_[grid[:, 0], np.zeros(len(grid)), grid[:, 1]].astype(np.float32)  # a 40 x 10 m wall
    narrow = wall[wall[:, 0] < 8.0]  # the first fifth of it
    inside = PointCloudPair(narrow, wall, np.eye(4))
    forward, back = overlap_fractions(inside, 0.3)
    assert forward == pytest.approx(1.0) and back == pytest.approx(0.2, abs=0.03)
    assert overlap_ratio(inside, 0.3) == back
    apart = PointCloudPair(narrow, wall[wall[:, 0] > 20.0], np.eye(4))
    assert overlap_fractions(apart, 0.3) == (0.0, 0.0)
    shifted = PointCloudPair(narrow - np.float32([20.0, 0.0, 0.0]), wall[wall[:, 0] > 20.0], np.eye(4))
    assert overlap_fractions(shifted, 0.3) == (0.0, 0.0)  # T_gt, not the coordinates, aligns a pair
    T = np.eye(4)
    T[0, 3] = 30.0
    assert overlap_fractions(PointCloudPair(narrow, wall[wall[:, 0] > 20.0], T), 0.3)[0] == pytest.approx(1.0)


def test_truth_inliers_count_the_matches_the_true_transform_confirms():
    rng = np.random.default_rng(0)
    T = np.eye(4)
    T[:3, :3] = np.array([[0.0, -1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    T[:3, 3] = [5.0, -2.0, 0.5]
    src = rng.uniform(-10, 10, (40, 3))
    tgt = src @ T[:3, :3].T + T[:3, 3]
    tgt[:10] += [0.0, 0.0, 1.0]  # 10 of 40 matches 1 m off
    result = MethodResult(np.eye(4), True, matches=np.stack([src, tgt], axis=1), match_inlier_distance=0.6)
    assert truth_inliers(result, T) == {"gt_inliers": 30, "gt_inlier_ratio": 0.75}
    assert truth_inliers(MethodResult(np.eye(4), True), T) == {}


def test_s2h_records_the_ground_truth_inlier_fraction_of_its_matches():
    from s2h_ros.datasets.synthetic import synthetic_pairs
    from s2h_ros.evaluation.methods import make_method

    pair = synthetic_pairs(1, 5, sensor="vlp16")[0]
    method = make_method("s2h:heading_hypotheses=1", "outdoor")
    _, record = run_pair(method, pair)
    info = record["info"]
    assert 0 < info["gt_inliers"] <= info["correspondences"]
    assert info["gt_inlier_ratio"] == pytest.approx(info["gt_inliers"] / info["correspondences"])
    # a wrong truth confirms (almost) none of them
    wrong = pair.T_gt.copy()
    wrong[:3, 3] += [8.0, 0.0, 0.0]
    moved = type(pair)(pair.source, pair.target, wrong, pair.name)
    _, record = run_pair(method, moved)
    assert record["info"]["gt_inlier_ratio"] < 0.5 * info["gt_inlier_ratio"]


def test_s2h_records_why_the_ransac_safeguard_estimated_a_transform():
    from s2h_ros.datasets.synthetic import synthetic_pairs
    from s2h_ros.evaluation.methods import make_method

    pair = synthetic_pairs(1, 5, sensor="vlp16")[0]
    _, learned = run_pair(make_method("s2h:heading_hypotheses=1", "outdoor"), pair)
    _, ransac = run_pair(make_method("s2h:heading_hypotheses=1+use_inlier_model=false", "outdoor"), pair)
    assert learned["success"] and (learned["info"]["used_fallback"], learned["info"]["fallback"]) == (False, "")
    assert (ransac["info"]["used_fallback"], ransac["info"]["fallback"]) == (True, "no inlier network")


def test_recall_grid_and_heat_map(tmp_path):
    from s2h_ros.evaluation.plots import recall_heatmap

    cells = mx.matrix_cells(0, sensors="vlp16", families="town,tunnel", indoor_sensors="", mixed="", real="")
    summary = {"vlp16/town": {"a": {"recall": 1.0}, "b": {"recall": 0.5}}, "vlp16/tunnel": {"a": {"recall": 0.0}}}
    rows, grid = mx.recall_grid(cells, summary, ["a", "b"])
    assert rows == ["vlp16/town", "vlp16/tunnel"]
    np.testing.assert_array_equal(grid[:, 0], [100.0, 0.0])
    assert grid[0, 1] == 50.0 and np.isnan(grid[1, 1])
    png = recall_heatmap(rows, ["a", "b"], grid, tmp_path / "h.png")
    assert png.read_bytes().startswith(PNG_MAGIC)


def test_matrix_command_writes_json_markdown_heat_map_and_streamed_records(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [S2H, "eval", "--dataset", "matrix", "--sensors", "vlp16,hdl32", "--families", "town,highway",
         "--indoor-sensors", "", "--mixed", "vlp16:hdl32", "--mixed-families", "town", "--real", "",
         "--pairs-per-cell", "1", "--seed", "4", "--methods", "fpfh_ransac", "--threads", "1", "--no-progress",
         "--json", str(out / "m.json"), "--markdown", str(out / "m.md"), "--jsonl", str(out / "m.jsonl"),
         "--plots", str(out)], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr
    keys = ["vlp16/town", "vlp16/highway", "hdl32/town", "hdl32/highway", "vlp16>hdl32/town"]
    result = json.loads((out / "m.json").read_text())
    cells = {c["key"]: c for c in result["cells"]}
    assert list(cells) == keys
    seeds = [c["seed"] for c in cells.values()]
    assert all(0 <= s < 1000 for s in seeds) and len(set(seeds)) == len(seeds)
    assert seeds == [mx.cell_seed(4, k) for k in keys]  # no collision among these five
    assert len(result["pairs"]) == len(keys)
    for record in result["pairs"]:
        meta, cell = record["meta"], cells[record["cell"]]
        assert record["method"] == "fpfh_ransac" and record["data"] == "held-out sim"
        assert meta["seed"] == cell["seed"] and meta["family"] == cell["family"]
        assert 10.0 <= meta["distance"] <= 20.0 and abs(meta["turn_deg"]) <= 180.0
        assert meta["sensor"] == cell["sensor"]
        assert 0.0 <= meta["overlap"] <= meta["shared_view"] <= 1.0 and meta["shared_view"] > 0.05
    mixed = next(r for r in result["pairs"] if r["cell"] == "vlp16>hdl32/town")["meta"]
    assert (mixed["sensor"], mixed["target_sensor"]) == ("vlp16", "hdl32")
    assert set(result["summary"]) == set(keys)
    assert all(set(s) == {"fpfh_ransac"} for s in result["summary"].values())
    assert result["machine"]["threads"] == 1 and result["pair_settings"]["turn"] == [0.0, 180.0]
    streamed = [json.loads(line) for line in (out / "m.jsonl").read_text().splitlines()]
    assert [(r["cell"], r["pair"]) for r in streamed] == [(r["cell"], r["pair"]) for r in result["pairs"]]
    table = (out / "m.md").read_text()
    assert table == result["table"] and table in proc.stdout
    per_cell, totals = table.split("\n\n")  # the cells, then the totals per group
    assert [ln.split("|")[1].strip() for ln in totals.splitlines()[2:]] == ["outdoor", "mixed", "all"]
    assert result["totals"]["all"]["fpfh_ransac"]["pairs"] == len(keys)
    lines = per_cell.splitlines()
    assert "fpfh_ransac recall (%)" in lines[0] and "fpfh_ransac s/pair" in lines[0]
    assert "inlier frac." not in lines[0]  # FPFH + RANSAC has no S2H matches
    assert [ln.split("|")[1].strip() for ln in lines[2:]] == keys
    assert [ln.split("|")[3].strip() for ln in lines[2:]] == [str(s) for s in seeds]
    png = out / "matrix_recall.png"
    assert result["plots"] == [str(png)] and png.read_bytes().startswith(PNG_MAGIC)
    assert proc.stderr.count("registered") == len(keys)  # one line per finished cell


def test_summary_and_table_count_truth_inliers_and_wrong_trusted_results_per_cell():
    cells = mx.matrix_cells(0, sensors="vlp16", families="town,tunnel", indoor_sensors="", mixed="", real="")

    def record(cell, method, ok, success, ratio=None, wall=1.0, fallback=False):
        info = {"feature_kind": "fcgf", "used_fallback": fallback} if method == "s2h" else {}
        if ratio is not None:
            info["gt_inlier_ratio"] = ratio
        return {"cell": cell, "method": method, "pair": "p", "re_deg": 0.1 if ok else 90.0,
                "te_m": 0.05 if ok else 9.0, "registered": ok, "success": success, "error": None,
                "wall_s": wall, "peak_rss_mb": 1.0, "cuda_peak_mb": None, "timings": {}, "info": info}

    records = [record("vlp16/town", "s2h", True, True, 0.2, 2.0), record("vlp16/town", "s2h", True, False, 0.1, 4.0),
               record("vlp16/town", "s2h", True, True, 0.3, 3.0, fallback=True),
               record("vlp16/town", "fpfh_ransac", False, True),
               record("vlp16/tunnel", "s2h", False, True, 0.0),
               record("vlp16/tunnel", "s2h", False, False, 0.0, fallback=True),
               record("vlp16/tunnel", "fpfh_ransac", False, True)]
    summary = mx.summarize_matrix(cells, records)
    town, tunnel = summary["vlp16/town"], summary["vlp16/tunnel"]
    assert town["s2h"]["recall"] == 1.0 and town["s2h"]["gt_inlier_ratio_mean"] == pytest.approx(0.2)
    assert (town["s2h"]["trusted"], town["s2h"]["fallbacks"], town["s2h"]["trusted_fallbacks"]) == (2, 1, 1)
    assert (tunnel["s2h"]["trusted"], tunnel["s2h"]["fallbacks"], tunnel["s2h"]["trusted_fallbacks"]) == (1, 1, 0)
    assert town["fpfh_ransac"]["fallbacks"] is None
    assert (town["s2h"]["wrong_trusted"], tunnel["s2h"]["wrong_trusted"], tunnel["fpfh_ransac"]["wrong_trusted"]) \
        == (0, 1, 1)
    assert town["s2h"]["feature_kinds"] == ["fcgf"] and town["fpfh_ransac"]["gt_inlier_ratio_mean"] is None
    lines = mx.matrix_table(cells, summary, ["s2h", "fpfh_ransac"]).splitlines()
    header = [h.strip() for h in lines[0].split("|")[1:-1]]
    town_row = dict(zip(header, [v.strip() for v in lines[2].split("|")[1:-1]]))
    tunnel_row = dict(zip(header, [v.strip() for v in lines[3].split("|")[1:-1]]))
    assert town_row["s2h recall (%)"] == "100" and town_row["s2h inlier frac."] == "0.200"
    assert town_row["s2h s/pair"] == "3.00" and town_row["fpfh_ransac recall (%)"] == "0"
    assert town_row["s2h trusted"] == "2" and town_row["s2h RANSAC (trusted)"] == "1 (1)"
    assert tunnel_row["s2h wrong trusted"] == "1" and tunnel_row["s2h RE (deg)"] == "-"
    assert tunnel_row["s2h RANSAC (trusted)"] == "1 (0)"
    assert "fpfh_ransac inlier frac." not in header


def test_totals_count_the_ransac_safeguard_and_wrong_results_per_group_of_cells():
    cells = mx.matrix_cells(0, sensors="vlp16", families="town,tunnel", indoor_sensors="", mixed="vlp16:os1_128",
                            mixed_families="town", real="kitti-loop")

    def record(cell, method, ok, success, fallback=""):
        info = {"used_fallback": bool(fallback), "fallback": fallback} if method == "s2h" else {}
        return {"cell": cell, "method": method, "registered": ok, "success": success, "info": info,
                "meta": {"shared_view": 0.0 if cell == "vlp16/tunnel" and not ok else 0.5}}

    records = [record("vlp16/town", "s2h", True, True), record("vlp16/town", "s2h", True, True, "learned estimate not trusted"),
               record("vlp16/town", "fpfh_ransac", False, True),
               record("vlp16/tunnel", "s2h", False, False, "inlier weight sum below 30"),
               record("vlp16/tunnel", "s2h", False, True, "inlier weight sum below 41"),
               record("vlp16/tunnel", "s2h", True, False),
               record("vlp16>os1_128/town", "s2h", True, True), record("real/kitti-loop", "s2h", True, True, "x")]
    totals = mx.matrix_totals(cells, records, ["s2h", "fpfh_ransac"])
    assert set(totals) == {"outdoor", "outdoor, degenerate", "mixed", "real", "all"}
    town, degenerate, every = totals["outdoor"]["s2h"], totals["outdoor, degenerate"]["s2h"], totals["all"]["s2h"]
    assert (town["pairs"], town["registered"], town["trusted"], town["wrong_trusted"]) == (2, 2, 2, 0)
    assert (town["fallbacks"], town["trusted_fallbacks"]) == (1, 1)
    assert town["fallback_reasons"] == {"learned estimate not trusted": 1}
    assert (degenerate["pairs"], degenerate["registered"], degenerate["wrong_trusted"]) == (3, 1, 1)
    assert (degenerate["in_view"], degenerate["registered_in_view"]) == (1, 1)  # two shared no view
    assert degenerate["fallback_reasons"] == {"inlier weight sum below": 2}  # the numbers left out
    assert (every["pairs"], every["fallbacks"], every["trusted_fallbacks"]) == (7, 4, 3)
    assert totals["outdoor"]["fpfh_ransac"]["fallbacks"] is None and "fpfh_ransac" not in totals["mixed"]
    rows = [[v.strip() for v in ln.split("|")[1:-1]] for ln in mx.totals_table(totals, ["s2h", "fpfh_ransac"]).splitlines()]
    header, body = rows[0], {(r[0], r[1]): dict(zip(rows[0], r)) for r in rows[2:]}
    assert header[:3] == ["cells", "method", "pairs"]
    assert body[("all", "s2h")]["RANSAC (trusted)"] == "4 (3)" and body[("all", "s2h")]["RANSAC share (%)"] == "57.1"
    assert body[("outdoor, degenerate", "s2h")]["recall (%)"] == "33"
    assert body[("outdoor", "fpfh_ransac")]["RANSAC (trusted)"] == "-"


def test_pairs_without_a_shared_view_are_counted_apart_from_the_recall_over_the_others():
    cells = mx.matrix_cells(0, sensors="livox", families="town", indoor_sensors="", mixed="", real="")

    def record(ok, success, shared_view):
        return {"cell": "livox/town", "method": "s2h", "pair": "p", "re_deg": 0.1 if ok else 90.0,
                "te_m": 0.05 if ok else 9.0, "registered": ok, "success": success, "error": None, "wall_s": 1.0,
                "peak_rss_mb": 1.0, "cuda_peak_mb": None, "timings": {}, "info": {},
                "meta": {"overlap": shared_view / 2, "shared_view": shared_view}}

    records = [record(True, True, 0.4), record(False, False, 0.3), record(True, False, 0.2),
               record(False, False, 0.01), record(False, False, 0.0)]
    s = mx.summarize_matrix(cells, records)["livox/town"]["s2h"]
    assert s["recall"] == pytest.approx(2 / 5) and s["no_view"] == 2
    assert s["recall_in_view"] == pytest.approx(2 / 3) and s["wrong_trusted"] == 0
    lines = mx.matrix_table(cells, {"livox/town": {"s2h": s}}, ["s2h"]).splitlines()
    row = dict(zip([h.strip() for h in lines[0].split("|")[1:-1]], [v.strip() for v in lines[2].split("|")[1:-1]]))
    assert (row["no shared view"], row["s2h recall (%)"], row["s2h recall, shared view (%)"]) == ("2", "40", "67")
    stricter = mx.summarize_matrix(cells, records, min_shared_view=0.25)["livox/town"]["s2h"]
    assert stricter["no_view"] == 3 and stricter["recall_in_view"] == pytest.approx(1 / 2)
    only_apart = mx.summarize_matrix(cells, records[3:])["livox/town"]["s2h"]
    assert only_apart["recall_in_view"] is None
    assert mx.matrix_table(cells, {"livox/town": {"s2h": only_apart}}, ["s2h"]).splitlines()[2].count("| - |") >= 1


def test_run_records_name_the_shipped_weights_each_voxel_size_loads():
    """The JSON's ``models`` says which file produced each method's numbers: the outdoor or indoor
    FCGF by voxel size, and FPFH (no file) where no shipped weights fit."""
    from s2h_ros.commands.eval import _models
    from s2h_ros.evaluation.methods import PipelineMethod

    models = _models({"outdoor": {"s2h": PipelineMethod("outdoor")}, "indoor": {"s2h": PipelineMethod("indoor")},
                      "other": {"s2h": PipelineMethod(voxel=0.12)}})
    assert models["s2h@outdoor"]["weights"].endswith("s2h_compact_kitti.pt") and models["s2h@outdoor"]["sha256"]
    assert models["s2h@indoor"]["weights"].endswith("s2h_compact_indoor.pt")
    assert "weights" not in models["s2h@other"] and models["s2h@other"]["features_used"].startswith("fpfh")
