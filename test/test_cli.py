"""The `s2h` console script: lists its subcommands, registers files, fails clearly."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np

from s2h_ros.cli import BENCHMARKS, COMMANDS
from s2h_ros.datasets.io import write_points
from s2h_ros.paths import THREEDMATCH_DEMO_DIR

S2H = str(Path(__file__).resolve().parents[1] / ".venv" / "bin" / "s2h")


def s2h(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([S2H, *args], capture_output=True, text=True, timeout=600)


def test_help_lists_every_subcommand():
    out = s2h("--help")
    assert out.returncode == 0
    for name in COMMANDS:
        assert name in out.stdout


def test_every_listed_module_exists():
    import importlib.util

    for module, _ in list(COMMANDS.values()) + list(BENCHMARKS.values()):
        assert not module or importlib.util.find_spec(module) is not None, module


def test_register_reads_ply_and_pcd_and_reports_the_error_to_ground_truth(tmp_path):
    src = np.load(THREEDMATCH_DEMO_DIR / "src.npy")
    tgt = np.load(THREEDMATCH_DEMO_DIR / "ref.npy")
    write_points(tmp_path / "src.ply", src)
    write_points(tmp_path / "tgt.pcd", tgt)
    out = s2h("register", str(tmp_path / "src.ply"), str(tmp_path / "tgt.pcd"), "--gt", str(THREEDMATCH_DEMO_DIR / "gt.npy"),
              "--voxel-size", "0.05", "--features", "fpfh", "--matcher", "mutual_nn", "--inlier-distance", "0.1",
              "--json", str(tmp_path / "r.json"))
    assert out.returncode == 0, out.stdout + out.stderr
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["success"] and result["rotation_error_deg"] < 15 and result["translation_error_m"] < 0.3
    assert np.array(result["transform"]).shape == (4, 4)
    assert "warning" not in out.stderr  # 0.05 m suits a room


def test_register_says_when_the_voxel_size_is_an_outdoor_one_for_a_room(tmp_path):
    """The real 3DMatch fragments at the default 0.3 m voxels: the result stands, and stderr says
    which settings suit a room (s2h_ros.scene_scale)."""
    for name in ("src", "ref"):
        write_points(tmp_path / f"{name}.ply", np.load(THREEDMATCH_DEMO_DIR / f"{name}.npy"))
    out = s2h("register", str(tmp_path / "src.ply"), str(tmp_path / "ref.ply"), "--features", "fpfh")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = [line for line in out.stderr.splitlines() if "room's scale" in line]
    assert [line.split(":")[2].strip() for line in lines] == ["source", "target"], out.stderr
    assert all("config/depth_camera.yaml" in line for line in lines)


def test_register_missing_file_and_bad_option_fail_with_one_line_on_stderr(tmp_path):
    """Exit 2 for bad input, the reason on stderr (the whole catalogue: test_bad_input.py)."""
    out = s2h("register", str(tmp_path / "nope.ply"), str(tmp_path / "nope.pcd"))
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == f"s2h register: point-cloud file not found: {tmp_path / 'nope.ply'}\n"
    out = s2h("register", "a.ply", "b.ply", "--voxel-size", "-1")
    assert out.returncode == 2 and out.stderr == "s2h register: voxel_size: -1.0 is outside [0.001, 10.0]\n"
