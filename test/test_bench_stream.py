"""s2h bench stream: the odometry under a sensor-rate stream, in process (the one-slot buffer's drops)."""
from __future__ import annotations

import json

import numpy as np

from s2h_ros.benchmarks.stream import _Stream


def test_a_free_consumer_takes_the_newest_scan_and_drops_the_older_ones():
    stream = _Stream(10, rate=10.0)
    assert stream.next_index(-1, 0.0) == 0
    assert stream.next_index(0, 0.05) == 1  # not published yet: the caller waits for it
    assert stream.next_index(0, 0.37) == 3  # scans 1 and 2 were overwritten in the buffer
    assert stream.next_index(3, 5.0) == 9  # never past the last scan
    assert stream.next_index(9, 5.0) is None


def test_lock_step_takes_every_scan_in_order():
    stream = _Stream(3, rate=0.0)
    assert [stream.next_index(i, 100.0) for i in (-1, 0, 1, 2)] == [0, 1, 2, None]


def test_lock_step_run_times_every_stage_of_every_scan(vlp16_drive, tmp_path):
    """Six scans of the 16-beam drive, every one registered: trusted, close to the truth, and the
    stages of each step (OdometryStep.timings) add up to the step's time."""
    from s2h_ros.cli import main

    out = tmp_path / "stream.json"
    assert main(["bench", "stream", "--sequence", str(vlp16_drive.folder), "--rate", "0", "--count", "6",
                 "--threads", "1", "--no-kiss-icp", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["processed"] == 6 and result["dropped"] == 0 and result["device"] == "cpu"
    assert result["trusted"] >= 5 and result["events"].get("initialised") == 1
    assert result["metrics_trusted"]["ate_rmse_m"] < 0.1
    for step in result["steps"]:
        assert abs(sum(step["stages"].values()) - step["step_ms"]) < 1e-6 * step["step_ms"] + 1e-3
        assert step["stages"]["features"] > 0 and step["stages"]["voxelize"] > 0
    tracked = [s for s in result["steps"] if s["search"] == "prior"]
    assert tracked and all(s["stages"]["support"] > 0 and s["stages"]["refine"] > 0 for s in tracked)
    assert np.isclose(sum(result["stage_ms_mean"].values()), np.mean([s["step_ms"] for s in result["steps"]]))


def test_a_depth_camera_stream_runs_with_the_nodes_depth_camera_settings_and_overrides_on_top():
    import argparse

    from s2h_ros.benchmarks.stream import _configs

    args = argparse.Namespace(sensor="depth_camera", params_file=[], device="cpu",
                              param=["registration.prior_radius=0.2", "odometry.map_keyframes=0"])
    files, registration, odometry = _configs(args)
    assert [f.rsplit("/", 1)[-1] for f in files] == ["depth_camera.yaml"]
    assert registration.voxel_size == 0.05 and registration.prior_radius == 0.2
    assert odometry.keyframe_distance == 1.0 and odometry.map_keyframes == 0
    lidar = _configs(argparse.Namespace(sensor="vlp32", params_file=[], device="cpu", param=[]))
    assert lidar[0] == [] and lidar[1].voxel_size == 0.3
