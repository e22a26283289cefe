"""``s2h bench trust``: which held-out drives the bench plans and with which settings; a distorted
drive reaches the odometry with its per-point times."""
from __future__ import annotations

import pytest

from s2h_ros.benchmarks.trust import drive_settings, plan_cells
from s2h_ros.config import OdometryConfig, RegistrationConfig
from s2h_ros.paths import config_dir


def test_without_families_one_drive_per_sensor_as_before():
    cells = plan_cells(["vlp16", "hdl64", "depth_camera"], [], 41)
    assert cells == [("vlp16", None, 41), ("hdl64", None, 42), ("depth_camera", None, 43)]


def test_families_pair_lidars_with_outdoor_and_the_depth_camera_with_indoor_worlds():
    cells = plan_cells(["vlp16", "depth_camera"], ["tunnel", "office", "suburban", "warehouse"], 100)
    assert cells == [("vlp16", "tunnel", 100), ("vlp16", "suburban", 101),
                     ("depth_camera", "office", 102), ("depth_camera", "warehouse", 103)]


def test_seeds_outside_the_held_out_worlds_and_unknown_families_are_refused():
    with pytest.raises(ValueError, match="outside the held-out seeds 0-999"):
        plan_cells(["vlp16"], ["tunnel", "highway"], 999)
    with pytest.raises(ValueError, match="unknown families"):
        plan_cells(["vlp16"], ["moon"], 0)
    with pytest.raises(ValueError, match="no cell"):
        plan_cells(["depth_camera"], ["tunnel"], 0)


def test_each_sensor_runs_with_what_the_node_would_run_with_for_it():
    """Lidars: the defaults; the depth camera: config/depth_camera.yaml (0.05 m voxels, the indoor
    FCGF through features: auto); --params-file files replace that choice for every drive."""
    files, reg, odo = drive_settings("vlp16", [])
    assert files == [] and reg == RegistrationConfig() and odo == OdometryConfig()
    files, reg, odo = drive_settings("depth_camera", [])
    assert [f.rsplit("/", 1)[-1] for f in files] == ["depth_camera.yaml"]
    assert reg.voxel_size == 0.05 and reg.inlier_distance == 0.1 and odo.keyframe_distance == 1.0
    kitti = str(config_dir() / "kitti.yaml")
    files, reg, _ = drive_settings("depth_camera", [kitti])
    assert files == [kitti] and reg.voxel_size == RegistrationConfig().voxel_size


def test_a_distorted_drive_hands_the_odometry_its_per_point_times():
    """``--motion-distortion``: the sweeps drawn while moving reach the odometry with their times,
    which it deskews from the third scan on (a trusted motion known); without it nothing is."""
    from s2h_ros.benchmarks.trust import drive_trust
    from s2h_ros.pipeline import Registrar

    registrar = Registrar(RegistrationConfig())
    for distorted, expected in ((True, 4), (False, 0)):
        # development world 1532 (the deskew tests' town), VLP-16 at 10 m/s
        drive = drive_trust("vlp16", 1532, 6, 1, 0.3, 2.0, registrar, motion_distortion=distorted)
        assert drive["motion_distortion"] is distorted
        assert drive["deskewed"] == expected
        assert [s["deskewed"] for s in drive["trusted_steps"]] == [False, False] + [distorted] * 4
        assert drive["trusted"] == 6 and drive["wrong_trusted"] == 0
