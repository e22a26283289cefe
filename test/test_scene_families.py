"""Scene families of the synthetic world: deterministic per seed, each with the property it is for."""
from __future__ import annotations

import numpy as np
import pytest

from s2h_ros.datasets.synthetic import SyntheticWorld, Trajectory, simulate_sequence, synthetic_pairs
from s2h_ros.datasets.synthetic.families import DEFAULT_FAMILY, FAMILIES
from s2h_ros.datasets.synthetic.realism import grid_average, translation_constraint

NEW_FAMILIES = ("suburban", "parking_lot", "open_field", "highway", "tunnel", "office", "warehouse")


def _scan(family: str, seed: int, sensor: str = "hdl64", frame: int = 20):
    seq = simulate_sequence(n_frames=frame + 1, seed=seed, family=family, sensor=sensor)
    return seq, seq[frame]


def _normal_scatter(points: np.ndarray, voxel: float, crop: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Eigenvalues (ascending) and eigenvectors of mean(n n^T) of the grid-averaged scan, and its normals."""
    cloud = grid_average(points, voxel, crop)
    n = cloud[:, 3:].astype(np.float64)
    w, v = np.linalg.eigh(n.T @ n / len(n))
    return w, v, n


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_family_is_a_pure_function_of_its_seed(family):
    a, b, c = SyntheticWorld(11, family=family), SyntheticWorld(11, family=family), SyntheticWorld(12, family=family)
    tile = (0, 0)
    va, ta, aa = a.tile_mesh(*tile)
    vb, tb, ab = b.tile_mesh(*tile)
    assert len(ta) > 0
    np.testing.assert_array_equal(va, vb)
    np.testing.assert_array_equal(aa, ab)
    vc = c.tile_mesh(*tile)[0]
    assert vc.shape != va.shape or not np.array_equal(vc, va)
    assert a.pitch == b.pitch
    ra, rb = Trajectory.generate(a, 200.0, 11), Trajectory.generate(b, 200.0, 11)
    np.testing.assert_array_equal(ra.poses(np.arange(0, 10.0, 0.5)), rb.poses(np.arange(0, 10.0, 0.5)))


def test_families_of_one_seed_draw_their_own_parameters():
    pitches = {f: SyntheticWorld(5, family=f).pitch for f in ("town", "suburban", "parking_lot", "open_field")}
    assert len(set(pitches.values())) == len(pitches)


def test_default_family_follows_kind_and_mismatches_raise():
    assert SyntheticWorld(3).family == DEFAULT_FAMILY["outdoor"] == "town"
    assert SyntheticWorld(3, kind="indoor").family == "rooms"
    assert SyntheticWorld(3, family="office").kind == "indoor"
    with pytest.raises(ValueError, match="family 'office' is indoor"):
        SyntheticWorld(3, kind="outdoor", family="office")
    with pytest.raises(ValueError, match="family must be one of"):
        SyntheticWorld(3, family="moon")


@pytest.mark.parametrize("seed", [0, 1])
def test_tunnel_pins_only_two_translation_directions(seed):
    """The normals' scatter has one near-zero eigenvalue, along the drive; a town has none."""
    seq, scan = _scan("tunnel", seed)
    w, v, _ = _normal_scatter(scan.points, 0.2, 80.0)
    assert w[0] < 0.03 and w[1] > 0.25, w
    heading = np.array([1.0, 0.0, 0.0])  # the sensor's x axis points along the drive
    assert abs(v[:, 0] @ heading) > 0.95
    town = translation_constraint(grid_average(_scan("town", seed)[1].points, 0.2, 80.0)[:, 3:])
    assert town[0] > 0.1, town


def test_open_field_is_almost_flat_ground():
    _, scan = _scan("open_field", 2)
    w, v, n = _normal_scatter(scan.points, 0.2, 80.0)
    assert np.mean(np.abs(n[:, 2]) > 0.9) > 0.95
    assert w[2] > 0.97 and abs(v[2, 2]) > 0.99  # the dominant normal is the vertical
    assert np.percentile(np.abs(scan.points[:, 2] + 1.5), 90) < 1.5  # all near the ground 1.5 m below
    _, town = _scan("town", 2)
    assert np.mean(np.abs(grid_average(town.points, 0.2, 80.0)[:, 5]) > 0.9) < 0.7


@pytest.mark.parametrize("family", ["rooms", "office", "warehouse"])
def test_indoor_families_are_closed_within_sensor_range(family):
    """Nearly every ray of a 100 m lidar hits a wall, floor, ceiling or furniture, well inside its range."""
    seq = simulate_sequence(n_frames=11, seed=4, family=family, sensor="vlp16")
    T = seq.world_poses[10]
    dirs = (seq.sensor.ray_directions().reshape(-1, 3) @ T[:3, :3].T).astype(np.float32)
    seq.world.prepare(T[:2, 3], seq.sensor.max_range)
    t = seq.world.cast(np.broadcast_to(T[:3, 3].astype(np.float32), dirs.shape), dirs).t
    hit = np.isfinite(t)
    assert hit.mean() > 0.995
    w = seq.world
    if w.bounds is not None:  # a closed hall: nothing reaches past its far corner
        assert t[hit].max() < np.hypot(w.bounds[1] - w.bounds[0] + 1, w.bounds[3] - w.bounds[2] + 1) * w.pitch
    else:  # rooms occlude: the far returns are a few rooms away, seen through doors
        assert np.percentile(t[hit], 99) < 6 * w.pitch
    up = dirs[:, 2] > 0.2
    assert np.median(t[up] * dirs[up, 2]) < w.room_height  # a ceiling above


def test_warehouse_drive_stays_inside_the_hall():
    world = SyntheticWorld(8, family="warehouse")
    traj = Trajectory.generate(world, 400.0, 8)
    i0, i1, j0, j1 = world.bounds
    p = world.pitch
    assert traj.length > 400.0
    assert traj.xy[:, 0].min() > i0 * p and traj.xy[:, 0].max() < (i1 + 1) * p
    assert traj.xy[:, 1].min() > j0 * p and traj.xy[:, 1].max() < (j1 + 1) * p


@pytest.mark.parametrize("family", ["highway", "tunnel"])
def test_line_families_drive_along_the_road_axis_in_a_lane(family):
    world = SyntheticWorld(9, family=family)
    traj = Trajectory.generate(world, 500.0, 9)
    off = traj.xy[:, 1] - world.centerline.y(traj.xy[:, 0])
    np.testing.assert_allclose(np.abs(off), world.lane_offset, atol=0.05)
    assert np.ptp(traj.xy[:, 0]) > 500.0
    assert world.centerline.min_radius > 300.0


@pytest.mark.parametrize("family", NEW_FAMILIES)
def test_pairs_come_from_every_family(family):
    indoor = FAMILIES[family].kind == "indoor"
    lo, hi = (2.0, 5.0) if indoor else (10.0, 20.0)
    pairs = synthetic_pairs(1, seed=13, family=family, sensor="vlp16", min_distance=lo, max_distance=hi)
    p = pairs[0]
    assert p.meta["family"] == family and p.meta["kind"] == FAMILIES[family].kind
    assert lo <= np.linalg.norm(p.T_gt[:3, 3]) <= hi + 1.0
    assert len(p.source) > 5000 and len(p.target) > 5000


def test_simulate_command_takes_a_family(tmp_path):
    from s2h_ros.cli import main
    from s2h_ros.commands.simulate import FAMILY_NAMES

    assert set(FAMILY_NAMES) == set(FAMILIES)
    out = tmp_path / "tunnel"
    assert main(["simulate", "--out", str(out), "--frames", "2", "--family", "tunnel", "--sensor", "vlp16"]) == 0
    assert len(list((out / "velodyne").glob("*.bin"))) == 2
    assert '"family": "tunnel"' in (out / "simulation.json").read_text()


def test_training_pairs_take_a_family():
    from s2h_ros.training.data import synthetic_training_pairs

    pairs = list(synthetic_training_pairs(2, 1000, per_world=2, sensor="vlp16", family="tunnel"))
    assert [p.meta["family"] for p in pairs] == ["tunnel", "tunnel"]
