"""s2h bench stream: the odometry under a sensor-rate stream, in process (the one-slot buffer's drops)."""
from __future__ import annotations

import json

import numpy as np

import pytest


PREPARATION = ("voxelize", "level", "features", "map_scan")


@pytest.mark.parametrize("flags, ahead, overlap", [([], True, 1.0), (["--prepare-overlap", "0.25"], True, 0.25),
                                                   (["--no-prepare-ahead"], False, 1.0)],
                         ids=["prepared-ahead", "a-quarter-ahead", "one-at-a-time"])
def test_lock_step_run_times_every_stage_of_every_scan(vlp16_drive, tmp_path, flags, ahead, overlap):
    """Six scans of the 16-beam drive, every one registered in order: trusted, close to the truth,
    and the stages of each step (OdometryStep.timings) add up to the worker's step time plus the
    preparation, which the hand-over runs on its other thread (ahead of the step, or not)."""
    from s2h_ros.cli import main

    out = tmp_path / "stream.json"
    assert main(["bench", "stream", "--sequence", str(vlp16_drive.folder), "--rate", "0", "--count", "6",
                 "--threads", "1", "--no-kiss-icp", "--json", str(out)] + flags) == 0
    result = json.loads(out.read_text())
    assert result["processed"] == 6 and result["dropped"] == 0 and result["device"] == "cpu"
    assert [s["index"] for s in result["steps"]] == list(range(6))
    assert result["trusted"] >= 5 and result["events"].get("initialised") == 1
    assert result["metrics_trusted"]["ate_rmse_m"] < 0.1
    assert result["wrong_trusted"] == []  # no step off the truth by more than s2h bench trust's bounds
    for step in result["steps"]:
        prepared = sum(step["stages"].get(k, 0.0) for k in PREPARATION)
        assert abs(sum(step["stages"].values()) - prepared - step["step_ms"]) < 1e-6 * step["step_ms"] + 1e-3
        assert step["stages"]["features"] > 0 and step["stages"]["voxelize"] > 0
        assert step["latency_ms"] >= step["step_ms"]
    tracked = [s for s in result["steps"] if s["search"] == "prior"]
    assert tracked and all(s["stages"]["support"] > 0 and s["stages"]["refine"] > 0 for s in tracked)
    assert result["prepare_ahead"] is ahead and result["prepare_overlap"] == overlap
    # each step says in words what the odometry did (why, when a scan is not trusted)
    assert result["steps"][0]["message"] == "keyframe initialised"
    assert all(isinstance(s["message"], str) and (s["trusted"] or s["message"]) for s in result["steps"])


def test_every_kth_scan_is_streamed_with_its_own_stamp_and_judged_against_its_own_truth(vlp16_drive, tmp_path):
    """``--every 2``: frames 0, 2, 4, 6 only, registered in order as a node taking one scan in two
    would (stamps 0.2 s apart), each pose compared with its own frame's ground truth."""
    from s2h_ros.cli import main

    out = tmp_path / "stream.json"
    assert main(["bench", "stream", "--sequence", str(vlp16_drive.folder), "--rate", "0", "--count", "7",
                 "--every", "2", "--threads", "1", "--no-kiss-icp", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["every"] == 2 and result["processed"] == 4 and result["dropped"] == 0
    assert [s["index"] for s in result["steps"]] == [0, 2, 4, 6]
    assert result["trusted"] == 4 and result["wrong_trusted"] == []
    assert result["metrics_trusted"]["ate_rmse_m"] < 0.1


def test_a_stream_faster_than_the_odometry_drops_scans_and_answers_the_newest(vlp16_drive, tmp_path):
    """At 200 scans/s nothing registers in 5 ms: scans are dropped, every one is either answered or
    dropped, answers stay in order, and the last scan offered is answered."""
    from s2h_ros.cli import main

    out = tmp_path / "stream.json"
    assert main(["bench", "stream", "--sequence", str(vlp16_drive.folder), "--rate", "200", "--count", "8",
                 "--threads", "1", "--no-kiss-icp", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    indices = [s["index"] for s in result["steps"]]
    assert result["dropped"] > 0 and result["processed"] + result["dropped"] == 8
    assert indices == sorted(indices) and indices[-1] == 7


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


def test_a_trusted_step_off_the_truth_is_counted_wrong_and_a_new_segments_first_pose_is_not():
    from types import SimpleNamespace

    from s2h_ros import geometry
    from s2h_ros.benchmarks.stream import _wrong_trusted

    truth = [geometry.make_transform(np.eye(3), np.array([float(i), 0.0, 0.0])) for i in range(5)]
    poses = [t.copy() for t in truth]
    poses[2][:3, 3] += [0.5, 0.0, 0.0]  # 0.5 m off: wrong, and so is the motion to the next pose
    poses[4][:3, 3] += [9.0, 0.0, 0.0]  # a new segment's first pose: its motion is unknown
    records = [{"index": i, "pose": poses[i].tolist(), "segment": int(i == 4), "event": "new_segment" * (i == 4)}
               for i in range(5)]
    records[3]["pose"] = None  # not trusted: skipped
    wrong = _wrong_trusted(SimpleNamespace(poses=np.stack(truth)), records)
    assert [(w["index"], w["after"]) for w in wrong] == [(2, 1)]
    assert _wrong_trusted(SimpleNamespace(poses=None), records) is None


def test_drift_within_segments_leaves_out_the_motion_a_lost_track_did_not_see():
    """A drive 300 m straight on, tracked exactly but lost for 30 m in the middle (a new segment
    starts at the last trusted pose): over the whole run the lost 30 m count as error; within each
    segment the tracking's own error, none, remains."""
    from types import SimpleNamespace

    from s2h_ros.benchmarks.stream import _metrics, _segment_metrics

    def at(x: float) -> np.ndarray:
        T = np.eye(4)
        T[0, 3] = x
        return T

    records = []
    for i in range(300):
        lost = 120 <= i < 150
        pose = None if lost else at(float(i) if i < 120 else float(i) - 30.0)  # the 30 m unseen
        records.append({"index": i, "pose": None if pose is None else pose.tolist(), "segment": int(i >= 120)})
    sequence = SimpleNamespace(poses=np.stack([at(float(i)) for i in range(300)]))
    whole = _metrics(sequence, records, 0)
    assert whole["ate_rmse_m"] > 5.0 and whole["t_err_pct"] > 5.0
    parts = _segment_metrics(sequence, records)
    assert [(p["segment"], p["first"], p["frames"]) for p in parts] == [(0, 0, 120), (1, 150, 150)]
    assert all(p["ate_rmse_m"] < 1e-9 and p["t_err_pct"] < 1e-9 for p in parts), parts
