"""s2h_ros.scene_scale: the hint when the voxel size does not suit a cloud's scale, on real scans."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from s2h_ros.scene_scale import FIRST_SCANS, ScaleCheck, reach_m, voxel_hint

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture(scope="module")
def kitti_scan() -> np.ndarray:
    return np.fromfile(DATA / "kitti" / "raw_00" / "000000.bin", np.float32).reshape(-1, 3)


@pytest.fixture(scope="module")
def room_fragment() -> np.ndarray:
    from s2h_ros.datasets.threedmatch import threedmatch_demo_pair

    return np.asarray(threedmatch_demo_pair().source, np.float32)


def test_outdoor_settings_suit_real_lidar_and_warn_for_a_real_room(kitti_scan, room_fragment):
    assert voxel_hint(reach_m(kitti_scan), 0.3) == ""
    for name in ("deskewed_00", "deskewed_01"):  # Newer College OS1-64, handheld
        scan = np.fromfile(DATA / "newer_college_os1_64" / f"{name}.bin", np.float32).reshape(-1, 3)
        assert voxel_hint(reach_m(scan), 0.3) == "", name
    hint = voxel_hint(reach_m(room_fragment), 0.3)
    assert "room's scale" in hint and "config/depth_camera.yaml" in hint


def test_indoor_settings_suit_a_real_room_and_warn_for_real_lidar(kitti_scan, room_fragment):
    assert voxel_hint(reach_m(room_fragment), 0.05) == ""
    hint = voxel_hint(reach_m(kitti_scan), 0.05)
    assert "street's or a hall's scale" in hint and "config/register.yaml" in hint


def test_reach_ignores_non_finite_points_and_an_empty_cloud_gives_no_hint(kitti_scan):
    spoiled = kitti_scan.copy()
    spoiled[::3] = np.nan
    assert reach_m(spoiled) == pytest.approx(reach_m(kitti_scan), rel=0.05)
    assert reach_m(np.full((4, 3), np.nan)) == 0.0
    assert voxel_hint(0.0, 0.3) == ""


def test_a_stream_is_judged_once_on_its_first_scans_so_one_wall_does_not_decide(kitti_scan, room_fragment):
    check = ScaleCheck(0.3)
    answers = [check.add(room_fragment)] + [check.add(kitti_scan) for _ in range(FIRST_SCANS - 1)]
    assert answers[:-1] == [None] * (FIRST_SCANS - 1) and answers[-1] == ""  # a wall first, then the street
    assert check.add(room_fragment) is None  # judged once
    indoors = ScaleCheck(0.3)
    hints = [indoors.add(room_fragment) for _ in range(FIRST_SCANS)]
    assert "config/depth_camera.yaml" in hints[-1]
