"""Replay for evaluation: the `kitti_replay` executable and `s2h replay BAG` drive
registration_node over real DDS and write sequence metrics and a trajectory plot."""
from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from s2h_ros.commands.replay import node_command
from s2h_ros.datasets.rosbag import write_pointcloud_bag

VENV_BIN = Path(__file__).resolve().parents[1] / ".venv" / "bin"
NODE_PARAMS = ["registration.voxel_size:=0.5", "registration.inlier_distance:=1.0", "registration.matcher:=mutual_nn"]


@pytest.fixture
def isolated_env():
    env = dict(os.environ)
    env["ROS_DOMAIN_ID"] = str(20 + os.getpid() % 70)
    env.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    return env


def _check_report(out: Path, frames: int) -> dict:
    report = json.loads((out / "metrics.json").read_text())
    assert report["scans_published"] == frames and report["scans_answered"] == frames
    assert report["metrics"]["ate_rmse_m"] < 0.25, report
    assert (out / "trajectory.png").stat().st_size > 1000
    return report


def test_kitti_replay_executable_evaluates_the_node(vlp16_drive, tmp_path, isolated_env):
    node = subprocess.Popen(node_command([], NODE_PARAMS), env=isolated_env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        replay = subprocess.run(
            [str(VENV_BIN / "kitti_replay"), "--ros-args", "-p", f"sequence_dir:={vlp16_drive.folder}",
             "-p", "rate:=0.0", "-p", f"output_dir:={tmp_path}"],
            env=isolated_env, capture_output=True, text=True, timeout=600)
        assert replay.returncode == 0, replay.stdout + replay.stderr
        _check_report(tmp_path, len(vlp16_drive))
    finally:
        node.send_signal(signal.SIGINT)
        node.wait(timeout=30)


def test_s2h_replay_plays_a_rosbag_through_the_node(vlp16_drive, tmp_path, isolated_env):
    bag = tmp_path / "drive.mcap"
    write_pointcloud_bag(bag, list(vlp16_drive), topic="/velodyne_points", frame_id="velodyne",
                         storage="mcap", tf=vlp16_drive.poses)
    out = tmp_path / "out"
    args = [str(VENV_BIN / "s2h"), "replay", str(bag), "--rate", "0", "--out", str(out)]
    for p in NODE_PARAMS:
        args += ["-p", p]
    run = subprocess.run(args, env=isolated_env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    _check_report(out, len(vlp16_drive))
