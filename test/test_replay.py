"""Replay for evaluation: the `kitti_replay` executable and `s2h replay BAG` drive
registration_node (default configuration: shipped FCGF + S2H) over real DDS and write strict-JSON
sequence metrics and a trajectory plot."""
from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from s2h_ros.commands.replay import node_command
from s2h_ros.datasets.rosbag import write_pointcloud_bag
from s2h_ros.ros.replay import AUTO_WARMUP_SCANS, sustainable_rate

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = ROOT / ".venv" / "bin"
ATE_BOUND_M = 0.25  # identity scores 15 m and the constant-velocity prediction 4.7 m on curved_drive


def _no_nan(text: str):
    raise AssertionError(f"{text} in a JSON file: JSON has no NaN/Infinity")


@pytest.fixture
def isolated_env():
    env = dict(os.environ)
    env["ROS_DOMAIN_ID"] = str(20 + os.getpid() % 70)
    env.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    return env


def _check_report(out: Path, frames: int, allowed_drops: int = 0) -> dict:
    report = json.loads((out / "metrics.json").read_text(), parse_constant=_no_nan)
    assert report["scans_published"] == frames and report["scans_answered"] >= frames - allowed_drops, report
    assert report["scans_answered"] + report["scans_dropped"] == frames
    assert report["scans_trusted"] >= report["scans_answered"] - 1, report
    # every scan answered: the metrics with held poses; else those of the trusted poses alone
    metrics = report["metrics"] if report["scans_trusted"] == frames else report["metrics_trusted"]
    assert metrics["ate_rmse_m"] < ATE_BOUND_M, report
    assert metrics["t_err_pct"] is None  # 58 m: no 100 m KITTI segment, null not NaN
    assert report["interrupted"] is None and report["scans_in_flight"] == 0
    assert report["events"].get("initialised") == 1 and "time_reset" not in report["events"], report["events"]
    assert (out / "trajectory.png").stat().st_size > 1000
    assert len((out / "poses_estimated.txt").read_text().splitlines()) == frames  # KITTI rows, one per scan
    assert not list(out.glob(".*.tmp"))  # atomic writes leave no temporary files behind
    return report


def test_kitti_replay_executable_evaluates_the_node(curved_drive, tmp_path, isolated_env):
    node = subprocess.Popen(node_command([], []), env=isolated_env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        replay = subprocess.run(
            [str(VENV_BIN / "kitti_replay"), "--ros-args", "--params-file", str(ROOT / "config" / "kitti.yaml"),
             "-p", f"sequence_dir:={curved_drive.folder}", "-p", "rate:=0", "-p", f"output_dir:={tmp_path}"],
            env=isolated_env, capture_output=True, text=True, timeout=600)
        assert replay.returncode == 0, replay.stdout + replay.stderr
        _check_report(tmp_path, len(curved_drive))
        assert "ATE RMSE" in replay.stdout and "trusted" in replay.stdout  # the readable summary
    finally:
        node.send_signal(signal.SIGINT)
        node.wait(timeout=30)


def test_s2h_replay_plays_a_rosbag_through_the_node_at_the_rate_this_machine_sustains(curved_drive, tmp_path,
                                                                                     isolated_env):
    """``--rate auto`` (what scripts/demo.sh runs): lock-step for the first scans, then a fixed rate
    chosen from their answer times, never above the sensor's own (here every 4th scan: 2.5 Hz)."""
    bag = tmp_path / "drive.mcap"
    write_pointcloud_bag(bag, list(curved_drive), topic="/velodyne_points", frame_id="velodyne",
                         storage="mcap", tf=curved_drive.poses)
    out = tmp_path / "out"
    args = [str(VENV_BIN / "s2h"), "replay", str(bag), "--rate", "auto", "--out", str(out), "--baseline", "kiss_icp"]
    run = subprocess.run(args, env=isolated_env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    # on a loaded machine the node drops some scans at the chosen rate; the lock-step warm-up it answers
    report = _check_report(out, len(curved_drive), allowed_drops=len(curved_drive) - AUTO_WARMUP_SCANS)
    rate = report["rate"]
    assert rate["sensor_hz"] == pytest.approx(2.5, rel=0.01) and 0.0 < rate["rate_hz"] <= rate["sensor_hz"], rate
    assert rate["warmup_scans"] == AUTO_WARMUP_SCANS - 1 and rate["answer_p50_ms"] > 0.0
    assert f"replayed at {rate['rate_hz']:.2f} Hz" in run.stdout
    # KISS-ICP offline on the same scans, beside the node in the report and the summary
    kiss = report["baselines"]["kiss_icp"]
    assert 0.0 <= kiss["ate_rmse_m"] < 15.0 and kiss["time_per_frame_ms"] > 0, kiss
    assert "kiss_icp (same scans, offline): ATE RMSE" in run.stdout


def test_the_sustainable_rate_is_the_median_answer_with_headroom_capped_at_the_sensor_rate():
    stamps_10hz = [0.1 * i for i in range(12)]
    slow = sustainable_rate([0.5, 0.4, 2.0, 0.45], stamps_10hz, headroom=0.7)  # one slow step does not decide it
    assert slow["rate_hz"] == pytest.approx(0.7 / 0.475, abs=1e-3) and slow["sensor_hz"] == pytest.approx(10.0)
    fast = sustainable_rate([0.02, 0.03, 0.025], stamps_10hz, headroom=0.7)
    assert fast["rate_hz"] == pytest.approx(10.0)  # a GPU replays at the sensor's own rate, not faster
    with pytest.raises(ValueError, match="no answered warm-up scans"):
        sustainable_rate([], stamps_10hz)


def test_s2h_replay_refuses_a_rate_that_is_no_rate(curved_drive, tmp_path):
    for bad in ("-2", "fast", "nan"):
        run = subprocess.run([str(VENV_BIN / "s2h"), "replay", str(curved_drive.folder), "--rate", bad,
                              "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
        assert run.returncode == 2 and "--rate" in run.stderr, (bad, run.stderr)


def test_s2h_replay_refuses_a_baseline_that_is_no_odometry(curved_drive, tmp_path):
    args = [str(VENV_BIN / "s2h"), "replay", str(curved_drive.folder), "--out", str(tmp_path), "--baseline", "fpfh"]
    run = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "--baseline fpfh: not an odometry method" in run.stderr, run.stderr
    assert not (tmp_path / "registration_node.log").exists()  # refused before the node was started
