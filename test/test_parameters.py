"""Parameters as ROS users type them: files and -p overrides reach the node that declares them,
integer-looking numbers are accepted where they lose nothing, typos and bad values are named, and
what cannot change at run time is read-only."""
from __future__ import annotations

from pathlib import Path

import pytest
import rclpy
from rclpy.context import Context
from rclpy.node import Node
from rclpy.parameter import Parameter

from s2h_ros.config import ConfigError
from s2h_ros.ros.parameters import NODE_PARAMETERS, REPLAY_PARAMETERS, declare_and_read
from s2h_ros.ros.replay import SequenceReplayer

CONFIG = Path(__file__).resolve().parents[1] / "config"


@pytest.fixture
def ros_args():
    """``ros_args(*args)`` -> a fresh rclpy context initialised with ``--ros-args *args``."""
    contexts = []

    def make(*args: str) -> Context:
        ctx = Context()
        rclpy.init(args=["test", "--ros-args", *args], context=ctx)
        contexts.append(ctx)
        return ctx

    yield make
    for ctx in contexts:
        rclpy.try_shutdown(context=ctx)


def _registration_params(ctx: Context) -> tuple[Node, object]:
    node = Node("registration_node", context=ctx)
    return node, declare_and_read(node)


def test_integer_looking_values_are_taken_where_nothing_is_lost(ros_args):
    ctx = ros_args("--params-file", str(CONFIG / "register.yaml"),
                   "-p", "registration.voxel_size:=1", "-p", "registration.k:=16.0",
                   "-p", "odometry.keyframe_distance:=5", "-p", "sensor_to_base:=[0, 0, 1, 0, 0, 0, 1]")
    node, settings = _registration_params(ctx)
    assert settings.registration.voxel_size == 1.0 and isinstance(settings.registration.voxel_size, float)
    assert settings.registration.k == 16 and isinstance(settings.registration.k, int)
    assert settings.odometry.keyframe_distance == 5.0
    assert settings.node["sensor_to_base"] == [0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    # Declared with their real types, so a later wrong type is refused by rclpy itself.
    assert node.get_parameter("registration.voxel_size").type_ == Parameter.Type.DOUBLE
    node.destroy_node()


@pytest.mark.parametrize("override, named", [
    ("registration.voxel_size:=fast", "registration.voxel_size"),
    ("registration.k:=2.5", "registration.k"),
    ("registration.k:=0", "registration.k"),
    ("registration.matcher:=magic", "registration.matcher"),
    ("registration.voxelsize:=0.3", "did you mean registration.voxel_size"),
    ("sensor_to_base:=[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]", "sensor_to_base"),
    ("sensor_to_base:=[.nan, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]", "sensor_to_base"),
    ("sensor_to_base:=[0.0, 0.0, 0.0]", "sensor_to_base"),
    ("qos:=fast", "qos"),
])
def test_bad_values_and_typos_fail_naming_the_parameter(ros_args, override, named):
    ctx = ros_args("-p", override)
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        _registration_params(ctx)


def test_only_display_limits_change_at_run_time(ros_args):
    node, _ = _registration_params(ros_args())
    runtime = {spec.name for spec in NODE_PARAMETERS if not spec.read_only}
    assert runtime == {"max_markers", "keyframe_cloud_max_points"}
    result = node.set_parameters([Parameter("registration.voxel_size", value=1.0)])[0]
    assert not result.successful and "read-only" in result.reason
    assert node.describe_parameter("odometry.max_failures").read_only
    assert node.set_parameters([Parameter("max_markers", value=10)])[0].successful
    assert node.get_parameter("max_markers").value == 10
    out_of_range = node.set_parameters([Parameter("max_markers", value=-1)])[0]
    assert not out_of_range.successful
    assert not node.set_parameters([Parameter("max_markers", value="many")])[0].successful
    node.destroy_node()


def test_kitti_replay_reads_its_section_of_a_params_file_and_typed_overrides(ros_args, vlp16_drive, tmp_path):
    root = tmp_path / "kitti"
    (root / "sequences").mkdir(parents=True)
    (root / "sequences" / "00").symlink_to(vlp16_drive.folder)
    ctx = ros_args("--params-file", str(CONFIG / "kitti.yaml"), "-p", f"sequence_dir:={root}",
                   "-p", "sequence:=00", "-p", "rate:=10", "-p", "end:=4.0")
    node = SequenceReplayer(context=ctx)
    try:
        assert node.get_name() == "kitti_replay"
        assert node.settings["rate"] == 10.0 and node.settings["end"] == 4
        assert node.sequence.name == "00" and len(node.sequence) == len(vlp16_drive)
        assert node.settings["base_frame"] == "base_link"  # from kitti.yaml's kitti_replay section
        listed = set(node.list_parameters([], 0).names)
        assert {spec.name for spec in REPLAY_PARAMETERS} <= listed
        assert node.describe_parameter("rate").read_only
    finally:
        node.destroy_node()


def test_kitti_replay_without_a_sequence_says_which_parameter(ros_args, tmp_path):
    with pytest.raises(ConfigError, match="sequence_dir"):
        SequenceReplayer(context=ros_args())
    with pytest.raises(ConfigError, match="sequence_dir"):
        SequenceReplayer(context=ros_args("-p", f"sequence_dir:={tmp_path}"))


def test_kitti_replay_takes_minus_one_as_the_automatic_rate_and_refuses_other_negative_rates(ros_args, vlp16_drive):
    from s2h_ros.ros.replay import AUTO_RATE

    node = SequenceReplayer(context=ros_args("-p", f"sequence_dir:={vlp16_drive.folder}", "-p", "rate:=-1"))
    try:
        assert node.settings["rate"] == AUTO_RATE
    finally:
        node.destroy_node()
    with pytest.raises(ConfigError, match="parameter rate must be >= 0 scans/s or -1"):
        SequenceReplayer(context=ros_args("-p", f"sequence_dir:={vlp16_drive.folder}", "-p", "rate:=-0.5"))
