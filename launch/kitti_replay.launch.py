"""Replay a KITTI-layout sequence through registration_node and evaluate it, with RViz.

    ros2 launch s2h_ros kitti_replay.launch.py sequence_dir:=DIR [sequence:=00] [rate:=10.0] [rviz:=false]

kitti_replay waits until registration_node subscribes before its first scan, publishes /clock
(both nodes use sim time, config/kitti.yaml) and base_link -> velodyne on /tf_static, so RViz with
fixed frame odom shows the clouds under the node's odom -> base_link.
"""
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.conditions import IfCondition
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackageShare


def generate_launch_description():
    share = FindPackageShare("s2h_ros")
    defaults = PathJoinSubstitution([share, "config", "register.yaml"])
    kitti = PathJoinSubstitution([share, "config", "kitti.yaml"])
    config = LaunchConfiguration("config")
    return LaunchDescription([
        DeclareLaunchArgument("sequence_dir", description="KITTI odometry root or one sequence folder"),
        DeclareLaunchArgument("sequence", default_value="", description="sequence id under sequence_dir"),
        DeclareLaunchArgument("rate", default_value="10.0", description="scans per second (0: lock-step; -1: the rate this machine sustains)"),
        DeclareLaunchArgument("output_dir", default_value="results/replay", description="metrics and plot"),
        DeclareLaunchArgument("config", default_value=kitti, description="parameter file for both nodes"),
        DeclareLaunchArgument("rviz", default_value="true", description="start RViz"),
        Node(
            package="s2h_ros",
            executable="registration_node",
            name="registration_node",
            output="screen",
            parameters=[defaults, config],
        ),
        Node(
            package="s2h_ros",
            executable="kitti_replay",
            name="kitti_replay",
            output="screen",
            parameters=[config, {
                "sequence_dir": LaunchConfiguration("sequence_dir"),
                "sequence": LaunchConfiguration("sequence"),
                "rate": LaunchConfiguration("rate"),
                "output_dir": LaunchConfiguration("output_dir"),
            }],
        ),
        Node(
            package="rviz2",
            executable="rviz2",
            name="rviz2",
            arguments=["-d", PathJoinSubstitution([share, "rviz", "s2h.rviz"])],
            parameters=[{"use_sim_time": True}],
            condition=IfCondition(LaunchConfiguration("rviz")),
        ),
    ])
