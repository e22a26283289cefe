"""Sensor presets with their datasheet patterns, the rosette scan, mounts, and per-sensor noise."""
from __future__ import annotations

import numpy as np
import pytest

from s2h_ros.datasets.synthetic import LIDAR_PRESETS, LidarModel, simulate_sequence
from s2h_ros.datasets.synthetic.scene import Hits

# name: (beams, vertical field of view in degrees, top elevation), as documented in sensor.py.
SPINNING = {
    "hdl32": (32, 41.34, 10.67),
    "vlp32c": (32, 40.0, 15.0),
    "os1_32": (32, 45.0, 22.5),
    "os1_64": (64, 45.0, 22.5),
    "os1_64_gen1": (64, 33.2, 16.6),
    "os1_128": (128, 45.0, 22.5),
    "os0_128": (128, 90.0, 45.0),
    "xt32m2x": (32, 40.3, 19.5),
}


def _field_coverage(dirs: np.ndarray, cell_deg: float, radius_deg: float) -> float:
    """Fraction of the cells (cell_deg square, wholly inside the circular field) that hold a ray."""
    theta = np.degrees(np.arccos(np.clip(dirs[:, 0], -1.0, 1.0)))
    phi = np.arctan2(dirs[:, 2], dirs[:, 1])
    edges = np.arange(-radius_deg - cell_deg, radius_deg + 2 * cell_deg, cell_deg)
    counts = np.histogram2d(theta * np.cos(phi), theta * np.sin(phi), [edges, edges])[0]
    c = (edges[:-1] + edges[1:]) / 2
    U, V = np.meshgrid(np.abs(c) + cell_deg / 2, np.abs(c) + cell_deg / 2, indexing="ij")
    inside = np.hypot(U, V) <= radius_deg
    return float((counts[inside] > 0).mean())


def test_original_presets_keep_their_names_first():
    assert LIDAR_PRESETS[:5] == ("hdl64", "vlp32", "vlp16", "os128", "depth_camera")


@pytest.mark.parametrize("name", sorted(SPINNING))
def test_spinning_presets_have_their_beams_and_vertical_field(name):
    beams, fov, top = SPINNING[name]
    model = LidarModel.preset(name)
    el = np.asarray(model.elevations_deg)
    assert model.n_rings == beams and model.vertical_fov_deg == pytest.approx(fov, abs=0.01)
    assert el[0] == pytest.approx(top) and np.all(np.diff(el) < 0)  # top to bottom
    seq = simulate_sequence(n_frames=1, seed=6, sensor=name, family="warehouse", noise=False)
    scan = seq[0]
    assert set(np.unique(scan.ring)) == set(range(beams))  # the hall closes every beam
    p = scan.points.astype(np.float64)
    elev = np.degrees(np.arctan2(p[:, 2], np.linalg.norm(p[:, :2], axis=1)))
    np.testing.assert_allclose(elev, el[scan.ring], atol=1e-3)


def test_vlp32c_table_is_dense_at_the_horizon_and_sparse_at_the_edges():
    gaps = -np.diff(LidarModel.preset("vlp32c").elevations_deg)
    assert gaps.min() == pytest.approx(0.333, abs=0.002) and gaps.max() > 9.0
    uniform = -np.diff(LidarModel.preset("hdl32").elevations_deg)
    np.testing.assert_allclose(uniform, 1.334, atol=0.002)


def test_rosette_covers_its_circular_field_and_does_not_repeat():
    model = LidarModel.preset("livox")
    assert model.n_rings == 1 and model.n_columns == 10000  # 100k points/s at 10 Hz
    d0 = model.ray_directions(0.0)[0]
    theta = np.degrees(np.arccos(np.clip(d0[:, 0], -1.0, 1.0)))
    assert theta.max() <= 70.4 / 2 + 1e-6 and theta.max() > 35.0  # reaches the edge, never beyond
    assert _field_coverage(d0, 3.0, 35.2) > 0.9  # one 100 ms scan covers the field at 3 deg
    d1 = model.ray_directions(0.1)[0]
    assert np.degrees(np.arccos(np.clip((d0 * d1).sum(1), -1, 1))).mean() > 5.0  # the next scan differs
    one_second = np.concatenate([model.ray_directions(0.1 * k)[0] for k in range(10)])
    assert _field_coverage(one_second, 1.0, 35.2) > 0.98 > _field_coverage(d0, 1.0, 35.2)
    scan = simulate_sequence(n_frames=3, seed=0, sensor="livox", family="suburban")[2]
    assert len(scan.points) > 3000 and np.all(scan.points[:, 0] > 0)  # a forward-looking sensor


@pytest.mark.parametrize("height", [0.3, 2.5])
def test_mount_height_shifts_the_ground(height):
    seq = simulate_sequence(n_frames=1, seed=3, sensor="os1_64", family="parking_lot", mount_height=height,
                            noise=False)
    z = seq[0].points[:, 2]
    assert np.percentile(z, 5) == pytest.approx(-height, abs=0.08)  # the ground lies the mount height below
    default = simulate_sequence(n_frames=1, seed=3, sensor="os1_64", family="parking_lot", noise=False)
    assert np.percentile(default[0].points[:, 2], 5) == pytest.approx(-1.73, abs=0.08)


def test_tilt_pitches_the_sensor_down():
    level = simulate_sequence(n_frames=1, seed=3, sensor="vlp16", family="open_field")
    tilted = simulate_sequence(n_frames=1, seed=3, sensor="vlp16", family="open_field", tilt_deg=10.0)
    pitch = [np.degrees(np.arcsin(-s.world_poses[0][2, 0])) for s in (level, tilted)]
    assert pitch[1] - pitch[0] == pytest.approx(10.0, abs=0.05)  # (less the roll wobble)
    assert np.mean(tilted[0].points[:, 0] > 0) > np.mean(level[0].points[:, 0] > 0) + 0.05  # more ground ahead
    with pytest.raises(ValueError, match="mount_height"):
        simulate_sequence(n_frames=1, seed=3, mount_height=-1.0)


def test_a_carried_sensor_sways_about_its_centre_on_the_same_walk():
    """``sway_deg``: the sensor's lean from level varies over the walk by about the sway (12 deg
    about a 20 deg tilt), while its positions (the route, the speeds) are those of the walk without
    sway; out of range is refused."""
    kwargs = dict(n_frames=150, seed=5, sensor="os1_64", family="town", mount_height=1.6, tilt_deg=20.0,
                  speed=(1.0, 1.6))
    steady = simulate_sequence(**kwargs).world_poses
    swaying = simulate_sequence(**kwargs, sway_deg=12.0).world_poses
    lean = lambda T: np.degrees(np.arccos(np.clip(T[:, 2, 2], -1.0, 1.0)))  # noqa: E731
    assert np.ptp(lean(steady)) < 2.0
    assert 8.0 < np.ptp(lean(swaying)) < 30.0 and abs(np.median(lean(swaying)) - 20.0) < 5.0
    np.testing.assert_allclose(swaying[:, :3, 3], steady[:, :3, 3], atol=1e-9)
    with pytest.raises(ValueError, match="sway_deg"):
        simulate_sequence(n_frames=1, seed=5, sway_deg=90.0)


def test_the_simulate_command_walks_a_handheld_sensor(tmp_path):
    """``s2h simulate --carrier handheld``: a walk (1.0-1.6 m/s) whose scans lean about 20 deg, as
    the ground in them says (``s2h_ros.gravity``), and sway; a value given on the command line wins
    over the carrier's (``--tilt-deg 0``: about level)."""
    from s2h_ros.cli import main
    from s2h_ros.datasets.kitti import KittiSequence
    from s2h_ros.gravity import ground_up

    for tilt, out in ((None, tmp_path / "hand"), (0.0, tmp_path / "level")):
        args = ["simulate", "--out", str(out), "--frames", "30", "--seed", "5", "--sensor", "vlp16",
                "--family", "parking_lot", "--carrier", "handheld"]
        assert main(args + ([] if tilt is None else ["--tilt-deg", str(tilt)])) == 0
    hand, level = KittiSequence(tmp_path / "hand"), KittiSequence(tmp_path / "level")
    speed = np.linalg.norm(hand.poses[-1][:3, 3] - hand.poses[0][:3, 3]) / 2.9
    assert 0.8 < speed < 1.7, speed
    turns = [np.degrees(np.arccos(np.clip((np.trace(T[:3, :3]) - 1) / 2, -1, 1))) for T in hand.poses]
    assert max(turns) > 2.0  # the sway (and the walk's own turns) over 3 s
    assert 8.0 < ground_up(hand[0].points).tilt_deg < 32.0
    assert ground_up(level[0].points).tilt_deg < 14.0  # the sway alone: at most 12 deg


@pytest.mark.parametrize("name", ["vlp16", "hdl32", "os1_64", "livox"])
def test_each_preset_measures_with_its_own_noise_and_dropout(name):
    model = LidarModel.preset(name)
    n = 40000
    hits = Hits(t=np.full(n, 10.0, np.float32), albedo=np.ones(n, np.float32), cos_incidence=np.ones(n, np.float32))
    dirs = np.tile([1.0, 0.0, 0.0], (n, 1))
    r, _ = model.measure(hits, dirs, np.random.default_rng(0))
    ok = np.isfinite(r)
    assert 1 - ok.mean() == pytest.approx(model.dropout, abs=0.004)
    assert np.std(r[ok]) == pytest.approx(model.range_noise_std, rel=0.05)


def test_simulate_command_lists_every_preset_and_carrier():
    from s2h_ros.commands.simulate import CARRIER_NAMES, SENSOR_NAMES
    from s2h_ros.datasets.synthetic import CARRIERS

    assert SENSOR_NAMES == LIDAR_PRESETS
    assert CARRIER_NAMES == tuple(CARRIERS)


def test_raw_comparison_sets_real_scans_beside_the_matching_presets(tmp_path):
    from s2h_ros.datasets.synthetic.realism import RAW_CASES, SHARED_DATA, compare_with_raw, raw_comparison_markdown

    if not (SHARED_DATA / RAW_CASES[0][1][0]).exists():
        pytest.skip(f"no real raw scans under {SHARED_DATA}")
    result = compare_with_raw(n_scans=1)
    kitti, college = result["cases"]
    real_points = np.fromfile(SHARED_DATA / RAW_CASES[0][1][0], np.float32).size // 3
    assert kitti["real"]["points"] == pytest.approx((real_points + 124605) / 2)  # frames 0 and 1
    for case in (kitti, college):  # the presets' elevation spans match the real sensors' within ~1 deg
        for sim in case["simulated"].values():
            assert np.allclose(sim["elevation_span_deg"], case["real"]["elevation_span_deg"], atol=1.2)
            assert sum(sim["range_histogram"]) == pytest.approx(1.0, abs=1e-3)
    other = LidarModel.preset("vlp16").elevations_deg  # a wrong preset would not match KITTI's span
    assert abs(min(other) - kitti["real"]["elevation_span_deg"][0]) > 5.0
    text = raw_comparison_markdown(result)
    assert "| points per scan | 124636.5 |" in text and "Newer College" in text
