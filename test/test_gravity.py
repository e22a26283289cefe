"""Gravity from the ground (s2h_ros.gravity) and the levelled features of tilted clouds
(RegistrationConfig.level_above_deg), on real RAW KITTI and Newer College Ouster scans."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from scipy.spatial.transform import Rotation
from test_degeneracy import message_round_trip

from s2h_ros import geometry
from s2h_ros.config import RegistrationConfig
from s2h_ros.evaluation.baselines import FpfhRansac
from s2h_ros.gravity import ground_up, levelling_rotation
from s2h_ros.pipeline import Registrar
from s2h_ros.refinement import refine_icp

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
NEWER_COLLEGE = DATA / "newer_college_os1_64"


def _raw_kitti(i: int) -> np.ndarray:
    return np.fromfile(DATA / "kitti" / "raw_00" / f"00000{i}.bin", np.float32).reshape(-1, 3)


def _newer_college(i: int) -> np.ndarray:
    return np.fromfile(NEWER_COLLEGE / f"deskewed_0{i}.bin", np.float32).reshape(-1, 3)


def _tilt(angle_deg: float, axis_deg: float) -> np.ndarray:
    axis = np.radians(axis_deg)
    return Rotation.from_rotvec(np.radians(angle_deg) * np.array([np.cos(axis), np.sin(axis), 0.0])).as_matrix()


def _voxels(xyz: np.ndarray) -> np.ndarray:
    return xyz[geometry.voxel_downsample(xyz, 0.3)].astype(np.float64)


def test_a_level_car_scan_measures_level_and_a_tilted_one_its_tilt():
    """A real HDL-64E scan from a car (RAW KITTI 00): up within 2 deg of z; the same scan tilted by
    20 / 32 / 42 deg about three horizontal axes: its up found within 1.5 deg of where z went."""
    scan = _voxels(_raw_kitti(0))
    level = ground_up(scan)
    assert level.found and level.tilt_deg < 2.0 and level.height < -1.0  # the sensor sits 1.73 m up
    for angle, axis in ((20.0, 10.0), (32.0, 130.0), (42.0, 250.0)):
        R = _tilt(angle, axis)
        up = ground_up(scan @ R.T)
        error = np.degrees(np.arccos(np.clip(up.direction @ (R @ level.direction), -1.0, 1.0)))
        assert error < 1.5 and abs(up.tilt_deg - angle) < 3.0, (angle, error, up.tilt_deg)


def test_a_cloud_without_ground_within_the_cap_is_left_as_given(rng):
    """Points on a sphere 20 m around the sensor, a cloud hovering above it, and the real scan
    turned on its side (its ground 70 deg from z, beyond the 45 deg searched: as a camera's optical
    frame or a 3DMatch fragment would have it): no ground found, up stays z."""
    sphere = rng.normal(size=(5000, 3))
    sphere = 20.0 * sphere / np.linalg.norm(sphere, axis=1, keepdims=True)
    above = rng.uniform([-20, -20, 1], [20, 20, 15], size=(5000, 3))
    on_its_side = _voxels(_raw_kitti(0)) @ _tilt(70.0, 45.0).T
    for cloud in (sphere, above, on_its_side):
        up = ground_up(cloud)
        assert not up.found and up.tilt_deg == 0.0 and np.array_equal(up.direction, [0.0, 0.0, 1.0])


def test_levelling_turns_up_onto_z_by_the_tilt_alone():
    for up in ([0.3, -0.2, 0.93], [0.0, 0.0, 1.0], [-0.7, 0.1, 0.7]):
        up = np.asarray(up) / np.linalg.norm(up)
        R = levelling_rotation(up)
        np.testing.assert_allclose(R @ up, [0.0, 0.0, 1.0], atol=1e-12)
        np.testing.assert_allclose(R @ R.T, np.eye(3), atol=1e-12)
        assert np.degrees(Rotation.from_matrix(R).magnitude()) == pytest.approx(np.degrees(np.arccos(up[2])), abs=1e-9)


@pytest.fixture(scope="module")
def kitti_reference():
    """RAW KITTI 00 frames 1 -> 0 registered as given (level): the reference the tilted copies must find."""
    src, tgt = _raw_kitti(1), _raw_kitti(0)
    result = Registrar().register(src, tgt)
    assert result.success and result.levelled_deg == (0.0, 0.0)  # a level car: features as given
    return src, tgt, result.transform


def test_a_pair_from_tilted_sensors_registers_through_levelled_features(kitti_reference):
    """The real pair with the source tilted 40 deg and the target 35 deg about other axes (a
    handheld rig, a robot on a ramp): features of the clouds as given keep too few matches to
    trust on the matches (29 inlier matches of 1300, against about 8000 levelled; with
    ``few_inliers_floor`` the structure they land on would vouch for them); levelled, the pair
    lands within 0.3 deg / 5 cm of the level pair's result, trusted, and the result says by how
    much each cloud was levelled."""
    src, tgt, reference = kitti_reference
    Rs, Rt = _tilt(40.0, 20.0), _tilt(35.0, 200.0)
    tilted_src = (src.astype(np.float64) @ Rs.T).astype(np.float32)
    tilted_tgt = (tgt.astype(np.float64) @ Rt.T).astype(np.float32)
    truth = geometry.make_transform(Rt, np.zeros(3)) @ reference @ geometry.make_transform(Rs.T, np.zeros(3))
    levelled = Registrar().register(tilted_src, tilted_tgt)
    as_given = Registrar(RegistrationConfig(level_above_deg=90.0, few_inliers_floor=0)).register(tilted_src,
                                                                                             tilted_tgt)
    re, te = geometry.transform_errors(levelled.transform, truth)
    assert levelled.success and re < 0.3 and te < 0.05, (levelled.message, re, te)
    assert levelled.levelled_deg[0] == pytest.approx(40.0, abs=2.0)
    assert levelled.levelled_deg[1] == pytest.approx(35.0, abs=2.0)
    assert as_given.levelled_deg == (0.0, 0.0)
    assert not as_given.success and levelled.num_inliers >= 5 * max(as_given.num_inliers, 1)
    if importlib.util.find_spec("rclpy") is not None:  # registration_node's result message says it too
        msg = message_round_trip(levelled)
        np.testing.assert_allclose(msg.levelled_deg, levelled.levelled_deg, atol=1e-4)


def test_a_handheld_ouster_scans_tilt_is_measured_and_its_features_levelled():
    """Real Newer College OS1-64 scans (handheld): 17-27 deg from level, so their features are
    computed levelled; scans 2 and 1 (41 deg apart) as given keep a handful of inlier matches,
    levelled several hundred, and the result agrees within 1 deg / 10 cm with Open3D's FPFH +
    RANSAC (rotation invariant, the evaluation's baseline) refined by the same ICP. The scans as the
    source motion-compensated them: the rig turns fast enough to bend the raw ones."""
    registrar, as_given = Registrar(), Registrar(RegistrationConfig(level_above_deg=90.0))
    src, tgt = _newer_college(2), _newer_college(1)
    prepared = [registrar.prepare(c) for c in (src, tgt)]
    assert all(15.0 < p.tilt_deg < 30.0 and p.level is not None for p in prepared)
    levelled = registrar.register(*prepared)
    given = as_given.register(src, tgt)
    baseline = FpfhRansac(voxel=0.3).register(src, tgt).transform
    fpfh = refine_icp(_voxels(src), _voxels(tgt), baseline, RegistrationConfig())
    assert levelled.num_inliers >= 200 and levelled.num_inliers >= 5 * max(given.num_inliers, 1), (
        levelled.num_inliers, given.num_inliers)
    re, te = geometry.transform_errors(levelled.transform, fpfh)
    assert re < 1.0 and te < 0.1, (re, te)


def test_tilted_pairs_keep_their_ground_truth_and_record_the_tilts(rng):
    """`s2h eval --tilt`: both clouds turned about their own horizontal axes within the range; the
    new T_gt still maps the source onto the target point for point."""
    from s2h_ros.datasets.types import PointCloudPair, tilted_pairs

    target = rng.uniform(-20, 20, size=(500, 3)).astype(np.float32)
    T = geometry.make_transform(geometry.yaw_transform(30.0)[:3, :3], np.array([4.0, -1.0, 0.2]))
    source = geometry.apply_transform(geometry.invert_transform(T), target.astype(np.float64)).astype(np.float32)
    pairs = list(tilted_pairs([PointCloudPair(source, target, T, "p", {})] * 3, 20.0, 45.0, seed=3))
    for pair in pairs:
        np.testing.assert_allclose(geometry.apply_transform(pair.T_gt, pair.source.astype(np.float64)), pair.target, atol=1e-4)
        assert all(20.0 - 1e-6 <= t <= 45.0 + 1e-6 for t in pair.meta["tilt_deg"])
        # the target turned about a horizontal axis by the angle recorded
        turn = Rotation.align_vectors(pair.target.astype(np.float64), target.astype(np.float64))[0]
        assert np.degrees(turn.magnitude()) == pytest.approx(pair.meta["tilt_deg"][1], abs=1e-3)
        assert abs(turn.as_rotvec()[2]) < 1e-6
    assert len({tuple(np.round(p.meta["tilt_deg"], 6)) for p in pairs}) == 3  # drawn anew per pair


def test_handheld_scans_tilted_against_each_other_are_not_at_zero_motion():
    """Real Newer College OS1-64 scans (handheld, deskewed, no ground truth) 0.1-0.6 m apart, tilted
    11-46 deg against each other. Zero motion (where a sensor's rings lie on their twins whatever
    the scene, so the structure off the ground must fit too) needs the axes the rings are drawn
    about within ``ZERO_MOTION_TILT_DEG``: a tilt moves the rings, a turn about the axis does not.
    The scans lean 17-27 deg, but their rings are about their own z, as a sensor's frame has them.
    Scans 0 -> 1 and 1 -> 2 were refused as zero motion (0.32 and 0.47 of the structure fitting);
    now all three pairs are trusted, and the three registrations close their cycle 0 -> 1 -> 2 -> 0
    to the identity within 0.3 deg / 5 cm, which two wrong results would not."""
    from s2h_ros.hypotheses import ZERO_MOTION_TILT_DEG, at_zero_motion

    registrar = Registrar()
    scans = [_newer_college(i) for i in range(3)]
    prepared = [registrar.prepare(scan) for scan in scans]
    for cloud in prepared:
        assert cloud.level is not None  # levelled for its features ...
        np.testing.assert_array_equal(cloud.pattern_axis(), [0.0, 0.0, 1.0])  # ... its rings about z
    found = {(a, b): registrar.register(prepared[a], prepared[b]) for a, b in ((0, 1), (1, 2), (0, 2))}
    for (a, b), result in found.items():
        assert result.success, ((a, b), result.message)
        assert np.linalg.norm(result.transform[:3, 3]) < 0.6
    tilted = found[0, 1].transform
    assert np.degrees(np.arccos(tilted[2, 2])) > 2 * ZERO_MOTION_TILT_DEG
    assert not at_zero_motion(tilted, RegistrationConfig(), prepared[0], prepared[1])
    untilted = geometry.yaw_transform(geometry.yaw_deg(tilted))
    untilted[:3, 3] = tilted[:3, 3]
    assert at_zero_motion(untilted, RegistrationConfig(), prepared[0], prepared[1])
    cycle = np.linalg.inv(found[0, 2].transform) @ found[1, 2].transform @ found[0, 1].transform
    re, te = geometry.transform_errors(cycle, np.eye(4))
    assert re < 0.3 and te < 0.05, (re, te)


def test_a_level_scan_tilted_afterwards_keeps_its_rings_about_its_ground():
    """A simulated level HDL-32 scan of a held-out world, turned by 30 deg about a horizontal axis
    afterwards (the evaluation's ``--tilt``): its rings stay about its ground's up, so two such
    clouds of one place tilted differently are at zero motion where their grounds agree, as the
    sensors were; the same scan untilted has them about z."""
    from s2h_ros.datasets.types import tilted_pair
    from s2h_ros.evaluation.matrix import PairSettings, cell_pairs, matrix_cells
    from s2h_ros.hypotheses import at_zero_motion
    from s2h_ros.scan_pattern import ring_sharpness

    cell = matrix_cells(1150, sensors="hdl32", families="town", indoor_sensors="", mixed="", real="")[0]
    pair = cell_pairs(cell, PairSettings(n=1))[0]
    registrar = Registrar()
    level = registrar.prepare(pair.source)
    np.testing.assert_array_equal(level.pattern_axis(), [0.0, 0.0, 1.0])
    tilt_a, tilt_b = _tilt(30.0, 40.0), _tilt(25.0, 200.0)
    turned = tilted_pair(pair, tilt_a, tilt_b)
    a, b = registrar.prepare(turned.source), registrar.prepare(turned.target)
    for cloud, tilt in ((a, tilt_a), (b, tilt_b)):
        assert cloud.level is not None
        assert np.degrees(np.arccos(cloud.pattern_axis() @ tilt[:, 2])) < 2.0  # the ground's up, not z
        assert ring_sharpness(cloud.input_frame_xyz(), cloud.pattern_axis()) > 2 * ring_sharpness(
            cloud.input_frame_xyz(), np.array([0.0, 0.0, 1.0]))
    same_place = geometry.make_transform(tilt_b @ tilt_a.T, np.zeros(3))  # the source scan onto itself
    assert not at_zero_motion(same_place, RegistrationConfig())  # read as a sensor's own z: 50+ deg tilted
    aa = registrar.prepare(geometry.apply_transform(geometry.make_transform(tilt_b, np.zeros(3)),
                                                    pair.source.astype(np.float64)).astype(np.float32))
    assert at_zero_motion(same_place, RegistrationConfig(), a, aa)
