"""registration_node with its parameters, optionally RViz and a rosbag2 player.

    ros2 launch s2h_ros register.launch.py [config:=FILE] [rviz:=true] [bag:=PATH [bag_delay:=5.0]]

On a robot RViz is off (``rviz:=true`` turns it on). With ``bag:=`` the bag is played with
``--clock`` and ``use_sim_time`` follows it (true with a bag, false without, unless given).
Playback starts ``bag_delay`` seconds after registration_node's process has started, so the
first scans are not published before the node (torch import and model loading take a few
seconds) subscribes; raise it on a slow machine.
"""
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, ExecuteProcess, RegisterEventHandler, TimerAction
from launch.conditions import IfCondition
from launch.event_handlers import OnProcessStart
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution, PythonExpression
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackageShare


def generate_launch_description():
    share = FindPackageShare("s2h_ros")
    defaults = PathJoinSubstitution([share, "config", "register.yaml"])
    config = LaunchConfiguration("config")
    use_sim_time = LaunchConfiguration("use_sim_time")
    bag = LaunchConfiguration("bag")
    has_bag = PythonExpression(["'", bag, "' != ''"])
    node = Node(
        package="s2h_ros",
        executable="registration_node",
        name="registration_node",
        output="screen",
        parameters=[defaults, config, {"use_sim_time": use_sim_time}],
    )
    play = ExecuteProcess(cmd=["ros2", "bag", "play", bag, "--clock"], output="screen", condition=IfCondition(has_bag))
    return LaunchDescription([
        DeclareLaunchArgument("config", default_value=defaults,
                              description="parameter file applied after config/register.yaml"),
        DeclareLaunchArgument("rviz", default_value="false", description="start RViz with rviz/s2h.rviz"),
        DeclareLaunchArgument("bag", default_value="", description="rosbag2 to play (empty: live sensor)"),
        DeclareLaunchArgument("bag_delay", default_value="5.0",
                              description="seconds between the node's start and the bag's first message"),
        DeclareLaunchArgument("use_sim_time", default_value=has_bag,
                              description="use /clock (default: true with bag:=, false without)"),
        node,
        Node(
            package="rviz2",
            executable="rviz2",
            name="rviz2",
            arguments=["-d", PathJoinSubstitution([share, "rviz", "s2h.rviz"])],
            parameters=[{"use_sim_time": use_sim_time}],
            condition=IfCondition(LaunchConfiguration("rviz")),
        ),
        RegisterEventHandler(OnProcessStart(
            target_action=node,
            on_start=[TimerAction(period=LaunchConfiguration("bag_delay"), actions=[play])],
        )),
    ])
