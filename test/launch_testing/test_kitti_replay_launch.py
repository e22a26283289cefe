"""launch_testing: kitti_replay.launch.py replays a synthetic sequence and writes metrics.

Full ROS 2 install only (see test_register_launch.py). The sequence is generated first with
`s2h simulate`, exactly as a user would.
"""
import json
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

import launch
import launch_testing.actions
import pytest
from launch.actions import IncludeLaunchDescription
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import PathJoinSubstitution
from launch_ros.substitutions import FindPackageShare

WORK = Path(tempfile.mkdtemp(prefix="s2h_kitti_replay_"))


@pytest.mark.launch_test
def generate_test_description():
    subprocess.run([sys.executable, "-m", "s2h_ros.cli", "simulate", "--out", str(WORK / "seq"), "--frames", "10",
                    "--seed", "12", "--sensor", "hdl64"], check=True)
    launch_file = PathJoinSubstitution([FindPackageShare("s2h_ros"), "launch", "kitti_replay.launch.py"])
    replay = IncludeLaunchDescription(
        PythonLaunchDescriptionSource(launch_file),
        launch_arguments={"sequence_dir": str(WORK / "seq"), "rate": "0.0", "output_dir": str(WORK / "out"),
                          "rviz": "false"}.items(),
    )
    return launch.LaunchDescription([replay, launch_testing.actions.ReadyToTest()])


class TestReplay(unittest.TestCase):
    def test_replay_finishes(self, proc_info):
        proc_info.assertWaitForShutdown(process="kitti_replay", timeout=600)


@launch_testing.post_shutdown_test()
class TestMetrics(unittest.TestCase):
    def test_metrics_were_written(self):
        report = json.loads((WORK / "out" / "metrics.json").read_text())
        self.assertEqual(report["scans_published"], 10)
        self.assertLess(report["metrics"]["ate_rmse_m"], 0.5)
