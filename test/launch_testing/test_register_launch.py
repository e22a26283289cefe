"""launch_testing: register.launch.py starts registration_node, which answers a cloud.

Runs only on a full ROS 2 install (launch, launch_ros, launch_testing are not on PyPI):
`colcon test --packages-select s2h_ros` (CMakeLists.txt registers it with add_launch_test) or
`launch_test test/launch_testing/test_register_launch.py`. The plain pytest suite ignores this
folder (test/conftest.py), so it is neither run nor counted there.
"""
import time
import unittest

import launch
import launch_testing.actions
import numpy as np
import pytest
import rclpy
from launch.actions import IncludeLaunchDescription
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch_ros.substitutions import FindPackageShare
from launch.substitutions import PathJoinSubstitution

from s2h_ros.msg import RegistrationResult
from s2h_ros.ros.pointcloud2 import to_msg


@pytest.mark.launch_test
def generate_test_description():
    launch_file = PathJoinSubstitution([FindPackageShare("s2h_ros"), "launch", "register.launch.py"])
    return launch.LaunchDescription([
        IncludeLaunchDescription(PythonLaunchDescriptionSource(launch_file),
                                 launch_arguments={"rviz": "false"}.items()),
        launch_testing.actions.ReadyToTest(),
    ])


class TestRegisterLaunch(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        rclpy.init()
        cls.node = rclpy.create_node("register_launch_probe")

    @classmethod
    def tearDownClass(cls):
        cls.node.destroy_node()
        rclpy.shutdown()

    def test_node_answers_a_cloud_with_a_result(self):
        results = []
        self.node.create_subscription(RegistrationResult, "/registration_node/result", results.append, 10)
        pub = self.node.create_publisher(type(to_msg(np.zeros((1, 3), np.float32))), "points", 10)
        deadline = time.monotonic() + 60
        while pub.get_subscription_count() == 0 and time.monotonic() < deadline:
            rclpy.spin_once(self.node, timeout_sec=0.1)
        self.assertGreater(pub.get_subscription_count(), 0)
        rng = np.random.default_rng(0)
        cloud = rng.uniform(-20, 20, (5000, 3)).astype(np.float32)
        while not results and time.monotonic() < deadline:
            pub.publish(to_msg(cloud, frame_id="velodyne", stamp=time.time()))
            rclpy.spin_once(self.node, timeout_sec=1.0)
        self.assertTrue(results)


@launch_testing.post_shutdown_test()
class TestShutdown(unittest.TestCase):
    def test_exit_codes(self, proc_info):
        launch_testing.asserts.assertExitCodes(proc_info, allowable_exit_codes=[0, -2, -15])
