"""`colcon build` of this package in a fresh ROS 2 workspace, then the install space on its own.

The ROS 2 Kilted wheels in the test environment's prefix (.venv) are the ROS underlay, activated
the way a user activates a ROS install (PATH, VIRTUAL_ENV, AMENT_PREFIX_PATH, CMAKE_PREFIX_PATH).
The package is copied into `ws/src/s2h_ros` and built with the Python install on (the default).

Everything after the build runs in `sh` with only `install/setup.sh` sourced on top of that
underlay, from a directory outside the source tree, and with a Python that cannot see the source
tree: the venv's own interpreter would not do, because pip installed s2h_ros there editable
(a path entry for the source tree, which s2h_ros/__init__.py's extend_path would merge in, and
a second build of the messages in its site-packages). So the runtime Python is a fresh venv of
the same base interpreter whose site-packages links every distribution of the test venv except
s2h_ros: the dependencies a ROS machine's Python has, and no s2h_ros but the one in install/.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from test_launch_files import LAUNCH_FILES, flatten, launch_nodes, share_files

from s2h_ros.commands.replay import node_process

ROOT = Path(__file__).resolve().parents[1]
UNDERLAY = Path(sys.prefix)  # the venv that holds the ROS 2 wheels and colcon (scripts/setup.sh)
SITE = Path(sysconfig.get_paths()["purelib"])
PY_DIR = f"lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"
NOT_SOURCE = {".venv", "build", "install", "log", "results", ".git"}


def _source_files() -> list[Path]:
    """What a clone holds: tracked files plus new files git does not ignore (no .venv, build/...)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                             capture_output=True, check=True).stdout.decode()
        return [ROOT / p for p in out.split("\0") if p and (ROOT / p).is_file()]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: the tree minus outputs
        return [p for p in ROOT.rglob("*") if p.is_file() and not NOT_SOURCE & set(p.relative_to(ROOT).parts)
                and "__pycache__" not in p.parts]


def _underlay_env(home: Path) -> dict[str, str]:
    """A clean environment with the ROS underlay activated, plus this run's DDS isolation."""
    env = {k: os.environ[k] for k in ("LANG", "LC_ALL", "TERM", "ROS_DOMAIN_ID", "ROS_AUTOMATIC_DISCOVERY_RANGE",
                                      "FASTDDS_BUILTIN_TRANSPORTS") if k in os.environ}
    env.setdefault("ROS_DOMAIN_ID", str(20 + os.getpid() % 70))
    env.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    env.update({
        "HOME": str(home),
        "PATH": f"{UNDERLAY / 'bin'}:/usr/local/bin:/usr/bin:/bin",
        "VIRTUAL_ENV": str(UNDERLAY),
        "AMENT_PREFIX_PATH": str(UNDERLAY),
        "CMAKE_PREFIX_PATH": str(UNDERLAY),
        # What the wheels' bootstrap hook (ros_wheels_bootstrapper.pth) would put on the library
        # path, set here as a ROS install's setup script does, so install/setup.sh can put the
        # workspace's libraries in front of it.
        "LD_LIBRARY_PATH": ":".join([str(UNDERLAY / "lib"), *map(str, sorted(SITE.glob("ros_*.libs")))]),
        "PYTHONNOUSERSITE": "1",
        "MPLBACKEND": "Agg",
    })
    return env


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> dict:
    colcon = UNDERLAY / "bin" / "colcon"
    assert colcon.is_file(), f"{colcon} missing: run scripts/setup.sh (it installs requirements-test.txt)"
    tmp = tmp_path_factory.mktemp("colcon")
    ws = tmp / "ws"
    pkg = ws / "src" / "s2h_ros"
    for f in _source_files():
        dest = pkg / f.relative_to(ROOT)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, dest)
    env = _underlay_env(tmp / "home")
    env["COLCON_HOME"] = str(tmp / "colcon_home")  # no user defaults or mixins
    t0 = time.monotonic()
    # -DBUILD_TESTING=OFF: the test targets need ament_cmake_pytest and launch_testing_ament_cmake,
    # which are not on PyPI. Nothing else is passed: CMake's FindPython3 takes the interpreter of
    # the active virtual environment (VIRTUAL_ENV), as in a user's activated environment.
    build = subprocess.run([str(colcon), "build", "--cmake-args", "-DBUILD_TESTING=OFF"], cwd=ws, env=env,
                           capture_output=True, text=True, timeout=1800)
    seconds = time.monotonic() - t0
    assert build.returncode == 0, (build.stdout + build.stderr)[-6000:]
    print(f"colcon build: {seconds:.1f} s")

    # The runtime Python: same base interpreter, every distribution of the underlay venv except
    # s2h_ros (its editable path hook and its message build) and the bootstrap hook (which would
    # re-exec with a library path of its own making; _underlay_env sets the same directories).
    py = tmp / "python"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(py)], check=True, env=env)
    py_site = py / PY_DIR
    for entry in SITE.iterdir():
        name = entry.name
        if name.startswith(("s2h_ros", "__editable__", "ros_wheels_bootstrapper.pth", "__pycache__")):
            continue
        (py_site / name).symlink_to(entry)
    env = dict(env, PATH=f"{py / 'bin'}:{env['PATH']}", VIRTUAL_ENV=str(py))
    env.pop("COLCON_HOME")
    outside = tmp / "cwd"
    outside.mkdir()
    return {"ws": ws, "src": pkg, "install": ws / "install" / "s2h_ros", "env": env, "cwd": outside}


@pytest.fixture(scope="module")
def hdl64_drive(tmp_path_factory):
    """10 scans (4.7 m) of a 64-beam drive through the demo's world (seed 7): the sensor the
    default configuration is set for (0.3 m voxels, the shipped FCGF weights)."""
    from s2h_ros.datasets.kitti import KittiSequence
    from s2h_ros.datasets.synthetic import simulate_sequence

    out = tmp_path_factory.mktemp("hdl64_drive")
    simulate_sequence(n_frames=10, seed=7, sensor="hdl64", out_dir=out)
    return KittiSequence(out)


def _in_install_space(workspace: dict, *cmd: str) -> list[str]:
    """`sh -c '. install/setup.sh && exec CMD'` (the command line, for subprocess)."""
    setup = workspace["ws"] / "install" / "setup.sh"
    return ["sh", "-c", '. "$0" && exec "$@"', str(setup), *cmd]


def _run(workspace: dict, *cmd: str, timeout: float = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run(_in_install_space(workspace, *cmd), cwd=workspace["cwd"], env=workspace["env"],
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


PROBE = r"""
import json, os, sys
import s2h_ros, s2h_ros.pipeline, s2h_ros.paths
import s2h_ros.ros.registration_node
from rclpy.serialization import deserialize_message, serialize_message
from s2h_ros.msg import RegistrationResult
import s2h_ros.msg._registration_result as generated
msg = RegistrationResult(success=True, num_inliers=7)
back = deserialize_message(serialize_message(msg), RegistrationResult)
maps = {line.split()[-1] for line in open("/proc/self/maps") if "s2h_ros" in line and "/" in line}
print(json.dumps({
    "files": [s2h_ros.__file__, s2h_ros.pipeline.__file__, generated.__file__, s2h_ros.paths.__file__,
              s2h_ros.ros.registration_node.__file__],
    "package_path": list(s2h_ros.__path__), "sys_path": [os.path.abspath(p) for p in sys.path], "mapped": sorted(maps),
    "round_trip": [back.success, back.num_inliers],
    "weights": str(s2h_ros.paths.WEIGHTS_DIR), "config": str(s2h_ros.paths.config_dir()),
}))
"""


def test_install_space_holds_one_s2h_ros_package_with_messages_and_code(workspace):
    install = workspace["install"]
    package = install / PY_DIR / "s2h_ros"
    out = json.loads(_run(workspace, "python3", "-c", PROBE).stdout)
    assert out["package_path"] == [str(package)]
    for f in out["files"]:
        assert Path(f).is_relative_to(package), f
    assert not [p for p in out["sys_path"] if Path(p).resolve().is_relative_to(ROOT)], out["sys_path"]
    assert out["mapped"] and all(Path(m).is_relative_to(install) for m in out["mapped"]), out["mapped"]
    assert out["round_trip"] == [True, 7]
    assert Path(out["weights"]) == package / "weights"
    assert Path(out["config"]) == install / "share" / "s2h_ros" / "config"
    # Package data: every weight file, model card and bundled sample of the source.
    src = workspace["src"] / "s2h_ros"
    data = [p.relative_to(src) for d in ("weights", "data/samples") for p in (src / d).rglob("*") if p.is_file()]
    assert any(p.suffix == ".pt" for p in data) and any(p.suffix == ".md" for p in data)
    assert not [p for p in data if not (package / p).is_file()]
    # __init__.py is ours, not rosidl's empty one.
    assert (package / "__init__.py").read_text() == (src / "__init__.py").read_text()


def test_everything_the_launch_files_name_is_installed(workspace):
    share = workspace["install"] / "share" / "s2h_ros"
    installed = sorted((share / "launch").glob("*.launch.py"))
    assert [p.name for p in installed] == [p.name for p in LAUNCH_FILES]
    for path in installed:
        for node in launch_nodes(path):
            if node["package"] == "s2h_ros":
                exe = workspace["install"] / "lib" / "s2h_ros" / node["executable"]
                assert exe.is_file() and os.access(exe, os.X_OK), exe
        files = share_files(path)
        assert files
        for rel in files:
            assert (share / rel).is_file(), f"{path.name}: {rel}"


def test_registration_node_from_the_install_space_tracks_a_replay(workspace, hdl64_drive, tmp_path):
    """registration_node with config/register.yaml + config/kitti.yaml (learned features + S2H, as
    kitti_replay.launch.py starts it) against kitti_replay, both from install/, over DDS."""
    from s2h_ros.evaluation.metrics import sequence_metrics

    install, share = workspace["install"], workspace["install"] / "share" / "s2h_ros"
    params = {}
    for name in ("register.yaml", "kitti.yaml"):
        params |= flatten(yaml.safe_load((share / "config" / name).read_text())["registration_node"]["ros__parameters"])
    assert params["registration.matcher"] == "s2h" and params["registration.features"] in ("auto", "fcgf")
    assert params["registration.weights"] == "" and any((install / PY_DIR / "s2h_ros" / "weights").glob("*.pt"))
    node_log = tmp_path / "registration_node.log"
    node_cmd = _in_install_space(workspace, str(install / "lib" / "s2h_ros" / "registration_node"), "--ros-args",
                                 "--params-file", str(share / "config" / "register.yaml"),
                                 "--params-file", str(share / "config" / "kitti.yaml"))
    with node_process(node_cmd, node_log, env=workspace["env"], cwd=workspace["cwd"]) as node:
        # Lock-step replay: kitti_replay waits for the node's subscription and result publisher
        # (discovery, and the node's start-up), then publishes each scan once the last is answered.
        replay = subprocess.run(
            _in_install_space(workspace, str(install / "lib" / "s2h_ros" / "kitti_replay"), "--ros-args",
                              "--params-file", str(share / "config" / "kitti.yaml"),
                              "-p", f"sequence_dir:={hdl64_drive.folder}", "-p", "rate:=0.0",
                              "-p", f"output_dir:={tmp_path / 'out'}", "-p", "discovery_timeout:=300.0"),
            cwd=workspace["cwd"], env=workspace["env"], capture_output=True, text=True, timeout=900)
        assert replay.returncode == 0, replay.stdout + replay.stderr + node_log.read_text()[-4000:]
        mapped = {line.split()[-1] for line in Path(f"/proc/{node.pid}/maps").read_text().splitlines()
                  if "s2h_ros" in line and "/" in line}
        assert mapped and all(Path(m).is_relative_to(install) for m in mapped), mapped
        # The installed script spawns the local map's helper process (which imports it again) and keeps it.
        assert "local map: helper process" in node_log.read_text(), node_log.read_text()[-4000:]

    report = json.loads((tmp_path / "out" / "metrics.json").read_text())
    n = len(hdl64_drive)
    gt = np.einsum("ij,njk->nik", np.linalg.inv(hdl64_drive.poses[0]), hdl64_drive.poses)
    identity = sequence_metrics(gt, np.repeat(np.eye(4)[None], n, axis=0))["ate_rmse_m"]
    print(f"replay from the install space: {report['scans_trusted']}/{n} trusted, "
          f"ATE {report['metrics']['ate_rmse_m']:.3f} m (identity {identity:.3f} m), "
          f"processing p50 {report.get('step_ms', {}).get('p50', float('nan')):.0f} ms")
    assert report["scans_published"] == n and report["scans_answered"] == n, report
    assert report["scans_trusted"] >= n - 1, report
    # Measured: 10/10 trusted, ATE 0.002 m; a node that published identity would score 1.49 m.
    assert report["metrics"]["ate_rmse_m"] < min(0.1, identity / 10), (report, identity)
