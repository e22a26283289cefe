"""registration_node with its parameters, optionally RViz and a rosbag2 player.

    ros2 launch s2h_ros register.launch.py [config:=FILE] [rviz:=true] [bag:=PATH] [use_sim_time:=false]
"""
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, ExecuteProcess
from launch.conditions import IfCondition
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution, PythonExpression
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackageShare


def generate_launch_description():
    share = FindPackageShare("s2h_ros")
    defaults = PathJoinSubstitution([share, "config", "register.yaml"])
    config = LaunchConfiguration("config")
    use_sim_time = LaunchConfiguration("use_sim_time")
    bag = LaunchConfiguration("bag")
    return LaunchDescription([
        DeclareLaunchArgument("config", default_value=defaults,
                              description="parameter file applied after config/register.yaml"),
        DeclareLaunchArgument("rviz", default_value="true", description="start RViz with rviz/s2h.rviz"),
        DeclareLaunchArgument("bag", default_value="", description="rosbag2 to play (empty: live sensor)"),
        DeclareLaunchArgument("use_sim_time", default_value="false", description="use /clock (true for bags)"),
        Node(
            package="s2h_ros",
            executable="registration_node",
            name="registration_node",
            output="screen",
            parameters=[defaults, config, {"use_sim_time": use_sim_time}],
        ),
        Node(
            package="rviz2",
            executable="rviz2",
            name="rviz2",
            arguments=["-d", PathJoinSubstitution([share, "rviz", "s2h.rviz"])],
            parameters=[{"use_sim_time": use_sim_time}],
            condition=IfCondition(LaunchConfiguration("rviz")),
        ),
        ExecuteProcess(
            cmd=["ros2", "bag", "play", bag, "--clock"],
            output="screen",
            condition=IfCondition(PythonExpression(["'", bag, "' != ''"])),
        ),
    ])
