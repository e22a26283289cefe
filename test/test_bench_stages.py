"""s2h bench stages: per-stage times of the device stages and the CPU-only stages, on real scans."""
from __future__ import annotations

import json
from pathlib import Path

RAW_KITTI = Path(__file__).resolve().parents[2] / "shared" / "data" / "kitti" / "raw_00"


def test_stages_bench_times_every_stage_on_two_raw_kitti_scans(tmp_path):
    from s2h_ros.cli import main

    out = tmp_path / "stages.json"
    scans = [str(RAW_KITTI / "000000.bin"), str(RAW_KITTI / "000001.bin")]
    assert main(["bench", "stages", "--scans", *scans, "--columns", "3", "--devices", "cpu", "--repeats", "1",
                 "--threads", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    cpu = result["devices"]["cpu"]
    assert result["num_scans"] == 2 and list(result["devices"]) == ["cpu"]
    assert 15_000 < cpu["voxels"] < 25_000  # a raw HDL-64E scan at 0.3 m
    stages = ("features", "match_global", "support_prior", "match_prior", "heading_features", "ransac")
    assert all(cpu[s] > 0 for s in stages), cpu
    assert cpu["tracking_path"] == cpu["features"] + cpu["support_prior"] + cpu["match_prior"]
    assert cpu["global_path"] == cpu["features"] + cpu["match_global"]
    assert set(result["cpu_only_stages_ms"]) == {"keyframe_normals", "keyframe_surface", "icp", "verify"}
    assert all(v > 0 for v in result["cpu_only_stages_ms"].values())
