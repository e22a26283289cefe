"""Static checks of launch/, config/ and rviz/ (launch itself does not exist on PyPI, so the
launch files cannot run here; test/launch_testing/ runs them on a full ROS 2 install).

Every executable a launch file starts must be a console script and a `ros2 run` script;
every file it names must exist; every parameter it or a config file sets must be declared by
the node it goes to; config/register.yaml must equal the library defaults."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

from s2h_ros.config import OdometryConfig, RegistrationConfig, describe
from s2h_ros.ros.parameters import NODE_PARAMETERS, REPLAY_PARAMETERS

ROOT = Path(__file__).resolve().parents[1]
LAUNCH_FILES = sorted((ROOT / "launch").glob("*.launch.py"))
BUILTIN = {"use_sim_time"}  # declared by every rclpy node


def declared(node: str) -> set[str]:
    if node == "registration_node":
        names = {spec.name for spec in NODE_PARAMETERS}
        names |= {f"registration.{f[0]}" for f in describe(RegistrationConfig)}
        names |= {f"odometry.{f[0]}" for f in describe(OdometryConfig)}
        return names | BUILTIN
    if node == "kitti_replay":
        return {spec.name for spec in REPLAY_PARAMETERS} | BUILTIN
    raise AssertionError(f"no parameter list for node {node}")


def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def launch_nodes(path: Path) -> list[dict]:
    """Node(...) calls in a launch file: package, executable, name, dict parameter keys, files named."""
    tree = ast.parse(path.read_text())
    nodes = []
    for call in ast.walk(tree):
        if isinstance(call, ast.Call) and getattr(call.func, "id", "") == "Node":
            kw = {k.arg: k.value for k in call.keywords}
            info = {k: kw[k].value for k in ("package", "executable", "name") if k in kw and isinstance(kw[k], ast.Constant)}
            info["param_keys"] = set()
            for d in ast.walk(kw.get("parameters", ast.List(elts=[]))):
                if isinstance(d, ast.Dict):
                    info["param_keys"] |= {k.value for k in d.keys if isinstance(k, ast.Constant)}
            nodes.append(info)
    return nodes


def share_files(path: Path) -> list[str]:
    """Files a launch file joins onto the package share directory: [share, "dir", "file"]."""
    tree = ast.parse(path.read_text())
    out = []
    for call in ast.walk(tree):
        if isinstance(call, ast.Call) and getattr(call.func, "id", "") == "PathJoinSubstitution":
            parts = call.args[0].elts
            if isinstance(parts[0], ast.Name) and parts[0].id == "share":
                out.append("/".join(p.value for p in parts[1:]))
    return out


def test_there_are_the_two_launch_files():
    assert {p.name for p in LAUNCH_FILES} == {"register.launch.py", "kitti_replay.launch.py"}


@pytest.mark.parametrize("path", LAUNCH_FILES, ids=lambda p: p.name)
def test_launch_file_executables_are_installed_entry_points(path):
    setup = (ROOT / "setup.py").read_text()
    cmake = (ROOT / "CMakeLists.txt").read_text()
    ours = [n for n in launch_nodes(path) if n["package"] == "s2h_ros"]
    assert ours
    for node in ours:
        exe = node["executable"]
        assert re.search(rf'"{exe} = s2h_ros\.[\w.]+:main"', setup), f"{exe} is not a console script"
        assert (ROOT / "scripts" / exe).is_file() and f"scripts/{exe}" in cmake, f"{exe} is not installed for ros2 run"


@pytest.mark.parametrize("path", LAUNCH_FILES, ids=lambda p: p.name)
def test_launch_file_names_only_existing_installed_files(path):
    cmake = (ROOT / "CMakeLists.txt").read_text()
    files = share_files(path)
    assert files
    for rel in files:
        assert (ROOT / rel).is_file(), rel
        assert rel.split("/")[0] in re.search(r"install\(DIRECTORY ([^)]*) DESTINATION share", cmake).group(1)


@pytest.mark.parametrize("path", LAUNCH_FILES, ids=lambda p: p.name)
def test_launch_file_parameters_are_declared_by_their_node(path):
    for node in launch_nodes(path):
        if node["package"] != "s2h_ros":
            continue
        unknown = node["param_keys"] - declared(node["name"])
        assert not unknown, f"{path.name}: {node['name']} does not declare {unknown}"


@pytest.mark.parametrize("name", ["register.yaml", "kitti.yaml", "depth_camera.yaml", "cpu.yaml"])
def test_config_file_parameters_are_declared_by_their_node(name):
    data = yaml.safe_load((ROOT / "config" / name).read_text())
    assert data
    for node, body in data.items():
        keys = set(flatten(body["ros__parameters"]))
        assert not keys - declared(node), f"{name}: {node} does not declare {keys - declared(node)}"


def test_register_yaml_holds_exactly_the_library_defaults():
    params = flatten(yaml.safe_load((ROOT / "config" / "register.yaml").read_text())["registration_node"]["ros__parameters"])
    expected = {spec.name: spec.default for spec in NODE_PARAMETERS}
    expected |= {f"registration.{n}": d for n, _, d, _, _ in describe(RegistrationConfig)}
    expected |= {f"odometry.{n}": d for n, _, d, _, _ in describe(OdometryConfig)}
    assert params == expected


def test_rviz_config_shows_cloud_markers_and_path_of_the_node():
    rviz = yaml.safe_load((ROOT / "rviz" / "s2h.rviz").read_text())
    topics = {d.get("Topic", {}).get("Value") for d in rviz["Visualization Manager"]["Displays"]}
    assert {"/points", "/registration_node/correspondences", "/registration_node/path",
            "/registration_node/keyframe_cloud"} <= topics
    odom_frame = next(spec.default for spec in NODE_PARAMETERS if spec.name == "odom_frame")
    assert rviz["Visualization Manager"]["Global Options"]["Fixed Frame"] == odom_frame
