"""Synthetic lidar world: determinism, exact poses, KITTI layout, sensor rings, >= 10 m pairs."""
from __future__ import annotations

import dataclasses

import numpy as np
import open3d as o3d
import pytest
from scipy.spatial import cKDTree

from s2h_ros.datasets.kitti import KittiSequence, velodyne_to_camera
from s2h_ros.datasets.synthetic import (
    LIDAR_PRESETS,
    LidarModel,
    SyntheticWorld,
    KITTI_CALIB,
    simulate_sequence,
    synthetic_pairs,
)


def _short_range(name: str, max_range: float = 40.0) -> LidarModel:
    """A preset with a shorter range: fewer tiles to build, so the test stays fast."""
    return dataclasses.replace(LidarModel.preset(name), max_range=max_range)


def _surface_distance(world: SyntheticWorld, points_world: np.ndarray) -> np.ndarray:
    """Unsigned distance of (N, 3) world points to the static geometry of the tiles built so far."""
    scene = o3d.t.geometry.RaycastingScene()
    for key in list(world._tiles):
        v, t, _ = world.tile_mesh(*key)
        scene.add_triangles(o3d.core.Tensor(v), o3d.core.Tensor(t))
    return scene.compute_distance(o3d.core.Tensor(points_world.astype(np.float32))).numpy()


def _perturbed(T: np.ndarray) -> np.ndarray:
    """T followed by a 1 deg yaw and a (0.2, 0.2, 0.1) m shift: a small but real pose error."""
    c, s = np.cos(np.radians(1.0)), np.sin(np.radians(1.0))
    E = np.array([[c, -s, 0, 0.2], [s, c, 0, 0.2], [0, 0, 1, 0.1], [0, 0, 0, 1.0]])
    return E @ T


def _to_world(seq, scan) -> np.ndarray:
    T = seq.world_poses[0] @ scan.pose
    return scan.points.astype(np.float64) @ T[:3, :3].T + T[:3, 3]


@pytest.fixture(scope="module")
def exact_drive():
    """An HDL-64E drive without noise: every return must lie exactly on the scene."""
    return simulate_sequence(n_frames=11, seed=3, noise=False)


def test_same_seed_gives_identical_scans_and_another_seed_does_not():
    a = simulate_sequence(n_frames=3, seed=11, sensor=_short_range("vlp32"))
    b = simulate_sequence(n_frames=3, seed=11, sensor=_short_range("vlp32"))
    c = simulate_sequence(n_frames=3, seed=12, sensor=_short_range("vlp32"))
    sa, sb = b[2], a[2]  # different access order on purpose
    np.testing.assert_array_equal(sa.points, sb.points)
    np.testing.assert_array_equal(sa.intensity, sb.intensity)
    np.testing.assert_array_equal(sa.ring, sb.ring)
    np.testing.assert_array_equal(a.poses, b.poses)
    assert len(c[2].points) != len(sa.points) or not np.array_equal(c[2].points, sa.points)


def test_points_lie_on_the_scene_surface_through_the_exact_pose(exact_drive):
    scan = exact_drive[10]
    assert len(scan.points) > 100_000
    np.testing.assert_allclose(exact_drive.poses[0], np.eye(4), atol=1e-12)
    assert np.linalg.norm(scan.pose[:3, 3]) > 0.5  # the vehicle moved
    d = _surface_distance(exact_drive.world, _to_world(exact_drive, scan))
    assert np.percentile(d, 99.9) < 1e-3 and d.max() < 5e-3
    # A 10 cm pose error is plainly visible against that (for ground and facades alike).
    wrong = _to_world(exact_drive, scan) + [0.06, 0.06, 0.06]
    assert np.median(_surface_distance(exact_drive.world, wrong)) > 0.02


def test_ground_truth_registers_two_noisy_scans_to_noise_level():
    seq = simulate_sequence(n_frames=11, seed=4, sensor=_short_range("hdl64"))
    src, tgt = seq[0], seq[10]
    T = np.linalg.inv(tgt.pose) @ src.pose
    near = np.linalg.norm(src.points, axis=1) < 15.0
    tree = cKDTree(tgt.points)

    def nn(T_):
        return tree.query(src.points[near] @ T_[:3, :3].T + T_[:3, 3], workers=1)[0]

    exact, wrong = nn(T), nn(_perturbed(T))
    # The closest quarter sits at the range-noise level (2 cm per scan); sampling spacing and
    # sparse foliage set the rest. A 1 deg / 0.3 m error moves most points off.
    assert np.percentile(exact, 25) < 0.05
    assert np.mean(exact < 0.05) > 4 * np.mean(wrong < 0.05)


def test_kitti_layout_is_read_back_equal_by_the_kitti_reader(tmp_path):
    seq = simulate_sequence(n_frames=3, seed=5, sensor="vlp16", out_dir=tmp_path)
    names = sorted(p.name for p in (tmp_path / "velodyne").iterdir())
    assert names == ["000000.bin", "000001.bin", "000002.bin"]
    raw = np.fromfile(tmp_path / "velodyne" / "000001.bin", dtype=np.float32).reshape(-1, 4)
    scan = seq[1]
    np.testing.assert_array_equal(raw[:, :3], scan.points)
    np.testing.assert_array_equal(raw[:, 3], scan.intensity)
    # poses.txt holds camera-0 poses: Tr^-1 P_i Tr gives back the Velodyne poses (KITTI convention).
    P = np.loadtxt(tmp_path / "poses.txt").reshape(-1, 3, 4)
    Tr = velodyne_to_camera(KITTI_CALIB)
    P4 = np.tile(np.eye(4), (3, 1, 1))
    P4[:, :3] = P
    np.testing.assert_allclose(np.linalg.inv(Tr) @ P4 @ Tr, seq.poses, atol=1e-9)
    read = KittiSequence(tmp_path)
    assert len(read) == 3
    np.testing.assert_allclose(read.Tr, Tr)
    np.testing.assert_allclose(read.poses, seq.poses, atol=1e-9)
    np.testing.assert_allclose(read.times, seq.stamps, rtol=1e-6)
    np.testing.assert_array_equal(read[2].points, seq[2].points)


@pytest.mark.parametrize("name, rings", [("hdl64", 64), ("vlp32", 32), ("vlp16", 16), ("os128", 128),
                                         ("depth_camera", 240)])
def test_sensor_presets_have_their_ring_count_and_every_ring_returns(name, rings):
    model = LidarModel.preset(name)
    assert model.n_rings == rings
    seq = simulate_sequence(n_frames=1, seed=6, sensor=name, kind="indoor", noise=False)
    scan = seq[0]
    assert set(np.unique(scan.ring)) == set(range(rings))  # the room closes every beam
    if model.projection == "spinning":  # each return sits on its beam's elevation
        p = scan.points.astype(np.float64)
        elev = np.degrees(np.arctan2(p[:, 2], np.linalg.norm(p[:, :2], axis=1)))
        np.testing.assert_allclose(elev, np.asarray(model.elevations_deg)[scan.ring], atol=1e-3)
    else:
        assert scan.points[:, 0].min() >= model.min_range - 1e-4 and scan.points[:, 0].max() <= model.max_range


def test_hdl64_matches_kitti_scale():
    model = LidarModel.preset("hdl64")
    el = np.asarray(model.elevations_deg)
    assert el.max() == pytest.approx(2.0) and el.min() == pytest.approx(-24.9)
    assert 360.0 / model.n_columns == pytest.approx(0.173, abs=0.002)
    assert 100 <= model.max_range <= 120


def test_pairs_are_at_least_ten_metres_apart_with_the_exact_transform():
    pairs = synthetic_pairs(2, seed=7, sensor="vlp32", noise=False)
    assert len(pairs) == 2
    for pair in pairs:
        distance = np.linalg.norm(pair.T_gt[:3, 3])
        assert 10.0 <= distance <= 20.0
        np.testing.assert_allclose(pair.T_gt[:3, :3] @ pair.T_gt[:3, :3].T, np.eye(3), atol=1e-9)
        assert pair.meta["distance"] == pytest.approx(distance)
        p = pair.source[np.linalg.norm(pair.source, axis=1) < 25.0]
        tree = cKDTree(pair.target)

        def close(T):  # fraction of source points within 5 cm of a target point
            return np.mean(tree.query(p @ T[:3, :3].T + T[:3, 3], workers=1)[0] < 0.05)

        # Sparse 32-beam rings at 10-20 m apart rarely coincide, but a small pose error loses most of them.
        assert close(pair.T_gt) > 3 * close(_perturbed(pair.T_gt))


def test_different_seeds_build_disjoint_worlds():
    a, b = SyntheticWorld(21), SyntheticWorld(22)
    va = {tuple(v) for v in np.round(a.tile_mesh(0, 0)[0], 3)}
    vb = {tuple(v) for v in np.round(b.tile_mesh(0, 0)[0], 3)}
    assert len(va & vb) < 0.01 * min(len(va), len(vb))
    np.testing.assert_array_equal(a.tile_mesh(0, 0)[0], SyntheticWorld(21).tile_mesh(0, 0)[0])


def test_long_drive_is_generated_lazily_with_bounded_speed_and_tilt():
    seq = simulate_sequence(length_m=1000.0, seed=2, sensor="vlp16")
    pos = seq.poses[:, :3, 3]
    travelled = np.linalg.norm(np.diff(pos, axis=0), axis=1).sum()
    assert 990.0 <= travelled <= 1030.0
    speed = np.linalg.norm(np.diff(pos, axis=0), axis=1) * seq.sensor.rate_hz
    assert speed.max() <= 15.5
    tilt = np.degrees(np.arccos(np.clip(seq.world_poses[:, 2, 2], -1, 1)))
    assert tilt.max() < 5.0 and tilt.max() > 0.05  # small pitch/roll, but not none
    seq[len(seq) - 1]  # a scan at the far end builds only the tiles around it
    assert len(seq.world._tiles) <= 40


def test_a_distorted_sweeps_point_times_are_written_beside_it_and_read_back(tmp_path):
    distorted = simulate_sequence(n_frames=2, seed=5, sensor="vlp16", motion_distortion=True,
                                  out_dir=tmp_path / "distorted")
    read = KittiSequence(tmp_path / "distorted")[1]
    np.testing.assert_array_equal(read.times, distorted[1].times.astype(np.float32))
    assert np.ptp(read.times) > 0.09  # a 10 Hz sweep
    simulate_sequence(n_frames=2, seed=5, sensor="vlp16", out_dir=tmp_path / "still")
    assert KittiSequence(tmp_path / "still")[1].times is None and not (tmp_path / "still" / "point_times").exists()


def test_motion_distortion_follows_the_per_firing_poses():
    seq = simulate_sequence(n_frames=6, seed=8, speed=15.0, noise=False, motion_distortion=True,
                            sensor=_short_range("hdl64"))
    scan = seq[5]
    C = seq.sensor.n_columns
    az = np.arctan2(scan.points[:, 1], scan.points[:, 0]).astype(np.float64)
    col = np.round((np.pi - az) / (2 * np.pi) * C - 0.5).astype(np.int64) % C
    T = seq.trajectory.poses(scan.stamp + seq.sensor.column_times())[col]
    world = np.einsum("nij,nj->ni", T[:, :3, :3], scan.points.astype(np.float64)) + T[:, :3, 3]
    assert np.percentile(_surface_distance(seq.world, world), 99) < 5e-3
    # Each point's time is its column's firing time (the odometry deskews with it).
    assert np.mean(np.isclose(scan.times, seq.sensor.column_times()[col])) > 0.99
    # Reading the scan through its single pose instead shows the skew: up to speed x 50 ms at the back.
    speed = np.linalg.norm(seq.poses[5][:3, 3] - seq.poses[4][:3, 3]) * seq.sensor.rate_hz
    assert speed > 3.0
    assert np.percentile(_surface_distance(seq.world, _to_world(seq, scan)), 99) > 0.02 * speed


def test_moving_objects_are_off_the_static_scene_only_when_asked():
    still = simulate_sequence(n_frames=1, seed=9, noise=False, sensor=_short_range("vlp32", 60.0))
    moving = simulate_sequence(n_frames=1, seed=9, noise=False, sensor=_short_range("vlp32", 60.0), moving_objects=4)
    off_still = _surface_distance(still.world, _to_world(still, still[0])) > 0.05
    off_moving = _surface_distance(moving.world, _to_world(moving, moving[0])) > 0.05
    assert off_still.sum() == 0
    assert off_moving.sum() > 100


@pytest.mark.parametrize("call, message", [
    (lambda: simulate_sequence(n_frames=0), "n_frames"),
    (lambda: simulate_sequence(n_frames=2, length_m=5.0), "exactly one"),
    (lambda: simulate_sequence(length_m=float("nan")), "length_m"),
    (lambda: simulate_sequence(n_frames=2, sensor="hdl32x"), "unknown sensor"),
    (lambda: simulate_sequence(n_frames=2, kind="underwater"), "kind"),
    (lambda: simulate_sequence(n_frames=2, speed=(10.0, 2.0)), "speed"),
    (lambda: synthetic_pairs(1, seed=0, min_distance=20.0, max_distance=10.0), "min_distance"),
])
def test_bad_arguments_raise_one_clear_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_presets_list_is_complete():
    assert set(LIDAR_PRESETS) == {"hdl64", "vlp32", "vlp16", "os128", "depth_camera", "hdl32", "vlp32c", "os1_32",
                                  "os1_64", "os1_64_gen1", "os1_128", "os0_128", "livox", "xt32m2x"}


@pytest.mark.parametrize("seed, kind", [(0, "outdoor"), (5, "outdoor"), (1, "indoor")])
def test_scenes_constrain_every_translation_direction(seed, kind):
    from s2h_ros.datasets.synthetic.realism import grid_average, translation_constraint

    scan = simulate_sequence(n_frames=1, seed=seed, kind=kind, sensor="hdl64" if kind == "outdoor" else "vlp16")[0]
    smallest = translation_constraint(grid_average(scan.points)[:, 3:])[0]
    assert smallest > 0.1  # a featureless corridor or open plane would be near 0 (real KITTI: ~0.2)


def test_compare_with_kitti_reports_real_and_simulated_side_by_side():
    from s2h_ros.datasets.synthetic.realism import compare_with_kitti, comparison_markdown

    result = compare_with_kitti(seed=0, n_scans=1)
    assert result["kitti_real"]["points"] == pytest.approx((29291 + 30609) / 2)
    assert 0.5 < result["simulated"]["points"] / result["kitti_real"]["points"] < 1.5  # same order
    assert 100_000 < result["simulated_raw"]["points_per_scan"] < 140_000
    assert abs(sum(result["simulated"]["range_histogram"]) - 1.0) < 1e-3
    assert "| points after 0.2 m grid + 80 m crop |" in comparison_markdown(result)


def test_simulate_command_writes_kitti_layout_and_bag(tmp_path):
    from s2h_ros.cli import main
    from s2h_ros.datasets.rosbag import read_pointcloud_bag

    out = tmp_path / "seq"
    assert main(["simulate", "--out", str(out), "--frames", "3", "--seed", "2", "--sensor", "vlp16", "--bag",
                 "--json", str(tmp_path / "summary.json")]) == 0
    seq = simulate_sequence(n_frames=3, seed=2, sensor="vlp16")
    read = KittiSequence(out)
    np.testing.assert_array_equal(read[1].points, seq[1].points)
    scans = list(read_pointcloud_bag(out / "bag", "/velodyne_points"))
    assert len(scans) == 3
    np.testing.assert_array_equal(scans[2].points, seq[2].points)
    np.testing.assert_allclose(scans[2].pose, seq.poses[2], atol=1e-9)
    assert (tmp_path / "summary.json").exists()


@pytest.mark.parametrize("seed", range(4))
def test_pair_sampler_fills_narrow_distance_windows(seed):
    """A window narrower than one frame's travel must not exhaust the sampler (it skips that start)."""
    from s2h_ros.datasets.synthetic import Trajectory
    from s2h_ros.datasets.synthetic.scene import seeded_rng
    from s2h_ros.datasets.synthetic.sequence import _pair_frames

    world = SyntheticWorld(seed)
    traj = Trajectory.generate(world, 30 * 36.0 + 2 * world.pitch, seed)
    stamps = np.arange(0.0, traj.duration, 0.1)
    pos = traj.poses(stamps)[:, :3, 3]
    frames = _pair_frames(pos, traj.arc_at(stamps), 30, 10.0, 11.0, seeded_rng(seed, 6, 0))
    assert len(frames) == 30
    d = np.array([np.linalg.norm(pos[b] - pos[a]) for a, b in frames])
    assert np.all((d >= 10.0) & (d <= 11.0))
    assert all(a < b for a, b in frames)
