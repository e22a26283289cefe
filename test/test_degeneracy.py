"""Degeneracy gate: a registration along a direction the geometry does not constrain (a straight
tunnel, a street of two parallel walls and the ground, an open field with sparse clutter) is not
trusted; a street of a held-out simulated town still is. The degenerate scenes are ray-cast here
analytically with the VLP-16 / HDL-64 ray patterns, with exact ground truth."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from s2h_ros import geometry
from s2h_ros.cloud import PreparedCloud
from s2h_ros.config import RegistrationConfig
from s2h_ros.datasets.synthetic.sensor import LidarModel
from s2h_ros.degeneracy import weakest_direction
from s2h_ros.hypotheses import agreed_move, at_zero_motion
from s2h_ros.pipeline import Registrar
from s2h_ros.verification import alignment_degeneracy, point_to_plane_rows

GROUND_Z = -1.73  # the sensor's height above the ground, as on KITTI's car
MIN_CONSTRAINT = RegistrationConfig().min_constraint


# ---------------------------------------------------------------- analytic scenes (ray distance)

def _plane(normal, offset, below_z: float = np.inf):
    """Surface ``normal . x = offset`` (up to ``below_z``): distance along each ray, inf for a miss."""
    n = np.asarray(normal, float)

    def distance(o, d):
        den = d @ n
        with np.errstate(divide="ignore", invalid="ignore"):
            t = (offset - o @ n) / den
        t = np.where(np.isfinite(t) & (t > 0), t, np.inf)
        z = o[2] + d[:, 2] * np.where(np.isfinite(t), t, 0.0)
        return np.where(z < below_z, t, np.inf)

    return distance


def _circle_hits(u, v, du, dv, radius, sign):
    """Ray parameter where ``(u + t du, v + t dv)`` meets the circle of ``radius`` about 0
    (``sign`` -1: the near hit, from outside; +1: the far one, from inside), inf for a miss."""
    a = du ** 2 + dv ** 2
    b = 2 * (u * du + v * dv)
    disc = b * b - 4 * a * (u ** 2 + v ** 2 - radius ** 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = (-b + sign * np.sqrt(np.maximum(disc, 0))) / (2 * a)
    return np.where((disc >= 0) & (a > 1e-12) & (t > 0), t, np.inf)


def _tube_along_x(y0, z0, radius):
    """The inside of an endless round tube along x (a tunnel's vault)."""
    return lambda o, d: _circle_hits(o[1] - y0, o[2] - z0, d[:, 1], d[:, 2], radius, +1)


def _pole(x0, y0, radius, top_z):
    """The outside of a vertical pole from the ground up to ``top_z``."""

    def distance(o, d):
        t = _circle_hits(o[0] - x0, o[1] - y0, d[:, 0], d[:, 1], radius, -1)
        z = o[2] + d[:, 2] * np.where(np.isfinite(t), t, 0.0)
        return np.where(z < top_z, t, np.inf)

    return distance


def tunnel():
    return [_tube_along_x(0.0, 0.5, 4.0), _plane([0, 0, 1], GROUND_Z)]


def two_walls_and_ground():
    return [_plane([0, 0, 1], GROUND_Z), _plane([0, 1, 0], 7.0, below_z=12.0), _plane([0, 1, 0], -6.0, below_z=12.0)]


def open_field(seed: int = 1, poles: int = 5):
    xy = np.random.default_rng(seed).uniform(-40, 40, (poles, 2))
    return [_plane([0, 0, 1], GROUND_Z)] + [_pole(x, y, 0.1, 1.0) for x, y in xy]


SCENES = {"tunnel": tunnel, "two_walls_and_ground": two_walls_and_ground, "open_field": open_field}


def scan(surfaces, sensor: str, x: float, rng: np.random.Generator) -> np.ndarray:
    """``(N, 3)`` float32 points of ``sensor`` at ``(x, 0, 0)`` (axes aligned with the world), in its
    own frame, with the preset's range limits and range noise."""
    lidar = LidarModel.preset(sensor)
    d = lidar.ray_directions().reshape(-1, 3)
    origin = np.array([x, 0.0, 0.0])
    t = np.min([s(origin, d) for s in surfaces], axis=0)
    ok = (t > lidar.min_range) & (t < lidar.max_range)
    r = t[ok] + rng.normal(0.0, lidar.range_noise_std, int(ok.sum()))
    return (d[ok] * r[:, None]).astype(np.float32)


def _translation(x: float) -> np.ndarray:
    return geometry.make_transform(np.eye(3), np.array([x, 0.0, 0.0]))


def _constraint_at(source: np.ndarray, target: np.ndarray, T: np.ndarray, cfg: RegistrationConfig):
    """weakest_direction of ``source`` moved by ``T`` onto ``target`` (voxelised as the pipeline does)."""
    def voxels(xyz):
        v = xyz[geometry.voxel_downsample(xyz, cfg.voxel_size)]
        return PreparedCloud(v, None, len(v), "none")

    tgt = voxels(target)
    return alignment_degeneracy(tgt, cfg, point_to_plane_rows(voxels(source).xyz, tgt, T, cfg))


# ---------------------------------------------------------------- the measure itself

def _about_x(d) -> bool:
    """The weakest direction is a translation along, or a rotation about, the x axis."""
    return d.describe().startswith(("translation along (1.00", "rotation about (1.00"))


@pytest.mark.parametrize("sensor", ["vlp16", "hdl64"])
@pytest.mark.parametrize("name", ["tunnel", "two_walls_and_ground", "open_field"])
def test_degenerate_scenes_have_a_free_direction_below_the_threshold(name, sensor, rng):
    surfaces = SCENES[name]()
    target, source = scan(surfaces, sensor, 0.0, rng), scan(surfaces, sensor, 1.5, rng)
    d = _constraint_at(source, target, _translation(1.5), RegistrationConfig())
    # Measured 0.0000-0.0018 at the truth (0.005 at the wrong poses registration returns); the
    # default threshold sits below the streets' 0.0099.
    assert d.eigenvalue < MIN_CONSTRAINT / 2, (name, sensor, d.eigenvalue, d.describe())
    if name != "open_field":  # along the tube / between the walls; the field leaves x, y and yaw free
        assert _about_x(d), d.describe()
    # the constrained translations are well constrained (a tube's radial normals share y and z:
    # 0.35 each after rotation has absorbed what it can; the ground's z: above 0.5)
    assert d.eigenvalues[-1] > 0.25, d.eigenvalues


def test_the_measure_is_scale_free_and_a_closed_box_constrains_everything(rng):
    """A room (four walls, floor, ceiling) constrains every direction; making it twice as large
    leaves the weakest constraint as it is (it is a mean over points, not a sum)."""
    def room(scale):
        return [_plane([0, 0, 1], -1.2 * scale), _plane([0, 0, 1], 1.5 * scale), _plane([1, 0, 0], 4.0 * scale),
                _plane([1, 0, 0], -3.0 * scale), _plane([0, 1, 0], 2.5 * scale), _plane([0, 1, 0], -2.0 * scale)]

    values = []
    for scale in (2.0, 4.0):
        pts = scan(room(scale), "hdl64", 0.0, rng)
        values.append(_constraint_at(pts, pts, np.eye(4), RegistrationConfig()).eigenvalue)
    assert min(values) > 5 * MIN_CONSTRAINT, values  # measured 0.06
    assert abs(values[0] - values[1]) < 0.25 * max(values), values


# ---------------------------------------------------------------- the registration's verdict

@pytest.fixture(scope="module")
def registrar():
    return Registrar(RegistrationConfig())  # shipped FCGF + S2H, as the node runs


@pytest.mark.parametrize("name", ["tunnel", "two_walls_and_ground"])
def test_a_degenerate_pair_is_not_trusted(name, registrar):
    """The sensor moved 1.5 m along the tube / street. Registration cannot tell how far; with the
    gates off (``min_constraint``, ``weak_constraint``) the result passes every other check. With
    them, it is not trusted and says why."""
    rng = np.random.default_rng(7)
    surfaces = SCENES[name]()
    target, source = scan(surfaces, "hdl64", 0.0, rng), scan(surfaces, "hdl64", 1.5, rng)
    result = registrar.register(source, target)
    assert not result.success
    assert result.message.startswith("degenerate: the geometry hardly constrains"), result.message
    assert result.degeneracy.eigenvalue < MIN_CONSTRAINT
    # Free: sliding along x (and, in the round tube, rolling about it, as free as the slide).
    assert _about_x(result.degeneracy), result.degeneracy.describe()
    assert result.to_dict()["degeneracy"]["weakest_constraint"] == result.degeneracy.eigenvalue
    # Without the gate the same data is "trusted": fitness and inliers do not see the free direction.
    # (Its grey zone off too: there a global search's result at zero motion is not trusted either.)
    ungated = registrar.with_config(RegistrationConfig(min_constraint=0.0, weak_constraint=0.0))
    loose = ungated.register(source, target)
    assert loose.success and loose.fitness > 0.9, loose.message


def test_a_street_of_a_held_out_town_is_still_trusted(registrar):
    """Two scans 0.2 s apart (about 2 m) on a held-out simulated town drive (seed 300, never
    trained on): trusted, right, and clearly above the threshold."""
    from s2h_ros.datasets.synthetic import simulate_sequence

    seq = simulate_sequence(n_frames=3, seed=300, sensor="hdl64", speed=10.0)
    result = registrar.register(seq[2].points, seq[0].points)
    truth = geometry.invert_transform(seq.poses[0]) @ seq.poses[2]
    re, te = geometry.transform_errors(result.transform, truth)
    assert result.success, result.message
    assert te < 0.1 and re < 0.5
    assert result.degeneracy.eigenvalue > 2 * MIN_CONSTRAINT, result.degeneracy.to_dict()


def message_round_trip(result):
    """registration_node's s2h_ros/RegistrationResult for ``result`` (as one odometry step),
    serialised and read back; skips where rclpy is not installed."""
    pytest.importorskip("rclpy")
    from rclpy.serialization import deserialize_message, serialize_message
    from std_msgs.msg import Header

    from s2h_ros.msg import RegistrationResult as RegistrationResultMsg
    from s2h_ros.odometry import OdometryStep
    from s2h_ros.ros.messages import result_message

    step = OdometryStep(3, 0.3, result.success, result.message, None, None, 0, 0.0, False, result)
    return deserialize_message(serialize_message(result_message(step, Header(frame_id="velodyne"), 3)),
                               RegistrationResultMsg)


def test_the_result_message_carries_the_weakest_direction(registrar):
    """registration_node's s2h_ros/RegistrationResult: the degenerate tunnel result's weakest
    constraint and direction survive the conversion and a serialisation round trip."""
    rng = np.random.default_rng(7)
    surfaces = tunnel()
    result = registrar.register(scan(surfaces, "hdl64", 1.5, rng), scan(surfaces, "hdl64", 0.0, rng))
    msg = message_round_trip(result)
    assert not msg.success and msg.message.startswith("degenerate")
    assert msg.weakest_constraint == pytest.approx(result.degeneracy.eigenvalue, rel=1e-6)
    assert 0.0 < msg.weakest_constraint < RegistrationConfig().min_constraint
    np.testing.assert_allclose(msg.weakest_direction, result.degeneracy.direction, atol=1e-6)
    assert abs(np.linalg.norm(msg.weakest_direction) - 1.0) < 1e-5


def test_sensor_fixed_scan_lines_do_not_count_as_constraints(registrar):
    """The trust bench's wrong-but-trusted case (``s2h bench trust --families tunnel``, VLP-16, the
    held-out tunnel of seed 41, drive of 40 scans): scan 12 against scan 6 (5.8 m apart) registers
    at about zero motion, where every ring of the scan lies on its twin in the keyframe. Counting
    every row alike, the line-shaped neighbourhoods of the rings crossing the tunnel gave arbitrary
    normals along it, 0.0079 > the gate, and the 5.8 m error was trusted. Weighted by planarity
    (only surfaces count) the same result is degenerate."""
    from s2h_ros.datasets.synthetic import simulate_sequence

    seq = simulate_sequence(n_frames=40, seed=41, sensor="vlp16", family="tunnel")
    result = registrar.register(seq[12].points, seq[6].points)
    truth = geometry.invert_transform(seq.poses[6]) @ seq.poses[12]
    te = geometry.transform_errors(result.transform, truth)[1]
    assert te > 3.0 and np.linalg.norm(result.transform[:3, 3]) < 1.0, te  # the zero-motion alias
    assert result.fitness > 0.9  # fitness cannot tell
    assert not result.success
    assert result.message.startswith("degenerate: the geometry hardly constrains translation along (1.00"), \
        result.message
    assert result.degeneracy.eigenvalue < MIN_CONSTRAINT / 2, result.degeneracy.eigenvalue
    # Every row alike (the measure before): above the gate, so this wrong result was trusted.
    src, tgt = registrar.prepare(seq[12].points), registrar.prepare(seq[6].points)
    T = geometry.shift_transform(result.transform, -src.origin, -tgt.origin)
    rows = point_to_plane_rows(src.xyz, tgt, T, registrar.config)
    assert weakest_direction(rows.points, rows.normals).eigenvalue > MIN_CONSTRAINT


# ---------------------------------------------------------------- slide evidence (grey zone)

def highway(pole_spacing: float = 25.0):
    """Ground, two guardrails 0.8 m high along x at y = -7 / +8, and a pole behind each every
    ``pole_spacing`` metres: invariant along x but for the poles."""
    rail = GROUND_Z + 0.8
    poles = [_pole(x, y, 0.15, GROUND_Z + 6.0) for x in np.arange(-100.0, 101.0, pole_spacing) for y in (-8.5, 9.5)]
    return [_plane([0, 0, 1], GROUND_Z), _plane([0, 1, 0], -7.0, below_z=rail), _plane([0, 1, 0], 8.0, below_z=rail)] + poles


def test_slide_evidence_finds_where_the_structure_that_shows_a_slide_fits():
    """A VLP-16 4 m on along the highway: at zero motion its rings on the road and on the rails lie
    on their twins, so only the poles can show the slide. From the zero-motion result the poles fit
    the keyframe's best 4 m along the road (the truth); from the truth they fit best where they are.
    A result off sideways fits the poles nowhere. Ground and rails (extended along x) are not
    counted: without poles nothing shows the slide."""
    from s2h_ros.degeneracy import MIN_SLIDE_FIT, MIN_SLIDE_STRUCTURES, slide_evidence

    rng = np.random.default_rng(3)
    surfaces = highway()
    target, source = scan(surfaces, "vlp16", 0.0, rng), scan(surfaces, "vlp16", 4.0, rng)
    distance = RegistrationConfig().inlier_distance
    along_x = np.array([1.0, 0.0, 0.0])
    alias = slide_evidence(source, target, np.eye(4), along_x, distance)
    assert alias.structures >= MIN_SLIDE_STRUCTURES
    assert alias.at_result < 0.2 and alias.best > 0.8, alias
    assert abs(alias.shift - 4.0) <= distance / 2, alias
    truth = slide_evidence(source, target, _translation(4.0), along_x, distance)
    assert truth.at_result > 0.8 and truth.gain < 0.0, truth
    assert truth.fits >= MIN_SLIDE_FIT
    # Off sideways by 3 m as well: the poles fit nowhere along the road, and not where it is.
    sideways = slide_evidence(source, target, geometry.make_transform(np.eye(3), np.array([0.0, 3.0, 0.0])),
                              along_x, distance)
    assert sideways.fits < MIN_SLIDE_FIT and sideways.best < 0.2, sideways
    bare = highway(pole_spacing=1e4)
    bare_target, bare_source = scan(bare, "vlp16", 0.0, rng), scan(bare, "vlp16", 4.0, rng)
    nothing = slide_evidence(bare_source, bare_target, np.eye(4), along_x, distance)
    assert nothing.structures < MIN_SLIDE_STRUCTURES, nothing


def test_a_16_beam_slide_in_the_grey_zone_is_not_trusted(registrar):
    """Development world 1530 (VLP-16 highway, never used for evaluation): scan 26 against scan 14,
    3.8 m on. ICP from zero motion (what tracking confirmed there, scan after scan, before this test)
    stays at zero motion with fitness 0.66 and a weakest constraint just above the gate; its slide
    evidence refuses it: the poles fit the keyframe's where the truth is. Without the slide test
    the same result is trusted."""
    from s2h_ros.datasets.synthetic import simulate_sequence

    seq = simulate_sequence(n_frames=40, seed=1530, sensor="vlp16", family="highway")
    src, tgt = registrar.prepare(seq[26].points), registrar.prepare(seq[14].points)
    truth = geometry.invert_transform(seq.poses[14]) @ seq.poses[26]
    alias = registrar.refine(src, tgt, np.eye(4))
    assert geometry.transform_errors(alias.transform, truth)[1] > 3.0
    cfg = registrar.config
    assert cfg.min_constraint <= alias.degeneracy.eigenvalue < cfg.weak_constraint, alias.degeneracy
    assert not alias.success
    assert alias.message.startswith("degenerate: a slide along the weakest direction"), alias.message
    # The structure that shows the slide fits clearly better about 3.8 m on: where the truth is.
    assert alias.slide.gain >= cfg.slide_margin, alias.slide
    assert abs(alias.slide.shift - np.linalg.norm(truth[:3, 3])) < 0.7, alias.slide
    assert alias.to_dict()["slide_evidence"]["structures"] >= 10
    ungated = registrar.with_config(cfg.replace(weak_constraint=0.0))
    assert ungated.refine(src, tgt, np.eye(4)).success


def test_evenly_spaced_poles_name_no_single_position_to_slide_to():
    """The slide evidence of the zero-motion alias 4 m short: poles every 25 m fit as well one
    spacing on (within the 30 m searched), so no position stands out (``peak_margin``); poles 40 m
    apart fit at the truth alone. Only a position that stands out is one a result may be moved to."""
    from s2h_ros.degeneracy import slide_evidence

    margin = RegistrationConfig().slide_margin
    distance = RegistrationConfig().inlier_distance
    for spacing, stands_out in ((25.0, False), (40.0, True)):
        rng = np.random.default_rng(3)
        surfaces = highway(pole_spacing=spacing)
        target, source = scan(surfaces, "vlp16", 0.0, rng), scan(surfaces, "vlp16", 4.0, rng)
        alias = slide_evidence(source, target, np.eye(4), np.array([1.0, 0.0, 0.0]), distance)
        assert alias.gain >= margin and abs(alias.shift - 4.0) <= distance / 2, (spacing, alias)
        assert (alias.peak_margin >= margin) == stands_out, (spacing, alias)


def test_a_slide_is_moved_to_where_its_poles_fit_and_trusted_there(registrar):
    """Development world 1530 (VLP-16 highway): the zero-motion alias 3.8 m short of the truth,
    refused as a slide, is moved along the road to where its poles fit the keyframe's, refined and
    verified again: trusted within 0.2 m of the truth, ``slid_m`` saying how far it moved. With
    ``slide_recovery`` off it stays refused. On the analytic highway with poles every 25 m the same
    alias is refused and stays so: its poles fit as well one spacing on."""
    from s2h_ros.datasets.synthetic import simulate_sequence
    from s2h_ros.pipeline import _Timer

    seq = simulate_sequence(n_frames=40, seed=1530, sensor="vlp16", family="highway")
    src, tgt = registrar.prepare(seq[26].points), registrar.prepare(seq[14].points)
    truth = geometry.invert_transform(seq.poses[14]) @ seq.poses[26]
    alias = registrar.refine(src, tgt, np.eye(4))
    assert not alias.success and alias.message.startswith("degenerate: a slide"), alias.message
    moved = registrar._slide_recovered(src, tgt, alias, _Timer())
    assert moved.success, moved.message
    re, te = geometry.transform_errors(moved.transform, truth)
    assert te < 0.2 and re < 0.5, (te, re)
    assert abs(moved.slid_m - np.linalg.norm(truth[:3, 3])) < 0.7 and moved.to_dict()["slid_m"] == moved.slid_m
    off = registrar.with_config(registrar.config.replace(slide_recovery=False))
    assert off._slide_recovered(src, tgt, alias, _Timer()) is alias and not alias.success

    rng = np.random.default_rng(3)
    surfaces = highway(pole_spacing=25.0)
    target, source = scan(surfaces, "vlp16", 0.0, rng), scan(surfaces, "vlp16", 4.0, rng)
    src, tgt = registrar.prepare(source), registrar.prepare(target)
    periodic = registrar.refine(src, tgt, np.eye(4))
    assert not periodic.success and geometry.transform_errors(periodic.transform, _translation(4.0))[1] > 3.0
    kept = registrar._slide_recovered(src, tgt, periodic, _Timer())
    assert not kept.success and kept.slid_m is None


def test_tracking_that_collapses_onto_the_rings_is_moved_to_where_its_poles_fit(registrar):
    """Held-out world 802 (VLP-16 highway), consecutive scans 1.4-1.5 m apart, the prediction 0.2 m
    off. With ICP against every voxel (``icp_min_planarity`` 0) tracking (candidates around the
    prediction) lands near zero motion, where the rings on the road and rails lie on their twins,
    and the slide test refuses it; moved along the road to where its poles fit, as a global
    search's result is, it is trusted within 0.15 m of the truth. With ``slide_recovery`` off it
    stays refused 1.2-1.5 m short (every scan of the drive's first three seconds then cost a full
    global search). ICP against the keyframe's planes (the default) does not collapse at scan 10:
    trusted without a move, 0.8 cm off (12 cm moved); at scan 20 the planes alone would let the
    scan slide (``facing_area``), every voxel stays, and the move is the same (1.4 cm off)."""
    from s2h_ros.datasets.synthetic import simulate_sequence

    seq = simulate_sequence(n_frames=150, seed=802, sensor="vlp16", family="highway")
    every_voxel = registrar.with_config(registrar.config.replace(icp_min_planarity=0.0))
    off = registrar.with_config(every_voxel.config.replace(slide_recovery=False))
    for a in (10, 20):
        truth = geometry.invert_transform(seq.poses[a]) @ seq.poses[a + 1]
        prediction = truth.copy()
        prediction[0, 3] += 0.2
        src, tgt = registrar.prepare(seq[a + 1].points), registrar.prepare(seq[a].points)
        tracked = every_voxel.register(src, tgt, init=prediction, search="prior")
        assert tracked.success and tracked.slid_m is not None, tracked.message
        re, te = geometry.transform_errors(tracked.transform, truth)
        assert te < 0.15 and re < 0.3, (te, re)
        collapsed = off.register(src, tgt, init=prediction, search="prior")
        assert not collapsed.success and collapsed.message.startswith("degenerate: a slide"), collapsed.message
        assert geometry.transform_errors(collapsed.transform, truth)[1] > 1.0
        planes = registrar.register(src, tgt, init=prediction, search="prior")
        assert planes.success and (planes.slid_m is None) == (a == 10), planes.message
        assert geometry.transform_errors(planes.transform, truth)[1] < 0.03


def test_a_slide_never_ends_at_zero_motion(registrar):
    """The scan seen at rest (source = target) with a result 4 m along the road: the poles fit
    best 4 m back, at zero motion, and the result is not moved there. At zero motion the sensor's
    own pattern on the structure (ring arcs on rails and walls) fits its twin whatever the truth:
    on a development OS1-64 highway pair 16 m apart (base seed 1131) a right result was moved
    16.2 m to zero motion, where the structure fitted 0.46 against 0.31 at the truth."""
    from s2h_ros.pipeline import _Timer
    from s2h_ros.verification import slide_of

    rng = np.random.default_rng(3)
    cloud = scan(highway(pole_spacing=40.0), "vlp16", 0.0, rng)
    src, tgt = registrar.prepare(cloud), registrar.prepare(cloud)
    off = registrar.refine(src, tgt, _translation(4.0))
    assert not off.success and geometry.transform_errors(off.transform, np.eye(4))[1] > 3.0, off.message
    cfg = registrar.config
    local = geometry.shift_transform(off.transform, -src.origin, -tgt.origin)
    slide = slide_of(src, tgt, local, off.degeneracy, cfg)
    back = off.transform.copy()
    back[:3, 3] += slide.shift * off.degeneracy.direction[:3]
    assert at_zero_motion(back, cfg), (slide, back)
    assert min(slide.gain, slide.peak_margin) >= cfg.slide_margin, slide
    kept = registrar._slide_recovered(src, tgt, off, _Timer())
    assert kept is off and kept.slid_m is None and not kept.success


def _refused(t_x: float, yaw_deg: float = 0.0, fitness: float = 0.5, moved_to: float | None = None,
             heading: float = 0.0):
    """A refused result at ``t_x`` metres along x (turned by ``yaw_deg``) of the hypothesis at
    ``heading``, with the slide recovery's refused move to ``moved_to`` metres when given."""
    from s2h_ros.registration_result import RegistrationResult

    def result(x):
        T = geometry.make_transform(Rotation.from_euler("z", yaw_deg, degrees=True).as_matrix(), np.array([x, 0.0, 0.0]))
        return RegistrationResult(T, False, f"refused at {x:.1f} m", np.zeros((0, 2), np.int64), np.zeros(0, np.float32),
                                  np.zeros((0, 3)), np.zeros((0, 3)), fitness=fitness)

    r = result(t_x)
    r.heading_deg = heading
    if moved_to is not None:
        r.refused_move = result(moved_to)
        r.refused_move.slid_m, r.refused_move.heading_deg = moved_to - t_x, heading
    return r


def test_a_refused_search_returns_a_move_only_where_several_hypotheses_landed_together():
    """``agreed_move`` (no prior): hypotheses of two headings moved to one place give that place,
    refused; one move alone, two of one heading (the learned estimate and RANSAC's on the same
    matches), moves that land apart and moves turned from the search's best do not replace the
    search's estimate."""
    cfg = RegistrationConfig()
    best = _refused(15.0)
    together = [best, _refused(15.0, moved_to=4.0), _refused(15.1, moved_to=4.1, fitness=0.6, heading=90.0)]
    got = agreed_move(best, together, cfg)
    assert got is together[2].refused_move and not got.success
    assert got.message.startswith("not trusted: 2 refused hypotheses at 2 headings") and "refused at 15.0 m" in got.message
    assert got.heading_deg == 90.0
    assert agreed_move(best, [best, _refused(15.0, moved_to=4.0)], cfg) is best  # one move alone
    one_heading = [_refused(15.0, moved_to=4.0), _refused(15.1, moved_to=4.1)]
    assert agreed_move(best, [best] + one_heading, cfg) is best
    apart = [_refused(15.0, moved_to=4.0), _refused(15.0, moved_to=9.0, heading=90.0)]
    assert agreed_move(best, [best] + apart, cfg) is best
    turned = [_refused(15.0, 180.0, moved_to=4.0), _refused(15.0, 180.0, moved_to=4.1, heading=90.0)]
    assert agreed_move(best, [best] + turned, cfg) is best


def test_a_refused_search_returns_where_more_headings_landed_than_beside_its_best():
    """``agreed_move`` without moves: where the hypotheses of more headings landed, unmoved, than
    beside the best fitting one, that place comes back, refused; not when the best has as many
    beside it, nor at zero motion (a sensor's rings on their twins), nor turned from the best."""
    cfg = RegistrationConfig()
    best = _refused(15.0, fitness=0.8)
    landed = [_refused(4.0, heading=90.0), _refused(4.1, fitness=0.6, heading=180.0), _refused(4.05, heading=180.0)]
    got = agreed_move(best, [best] + landed, cfg)
    assert got is landed[1] and not got.success
    assert got.message.startswith("not trusted: 3 refused hypotheses at 2 headings landed together")
    assert "The search's best: refused at 15.0 m" in got.message
    beside = [_refused(15.05, heading=45.0), _refused(15.1, heading=270.0)]
    assert agreed_move(best, [best] + landed + beside[:1], cfg) is best  # 2 headings each: the best stays
    assert agreed_move(best, [best] + landed + beside, cfg) is best
    at_zero = [_refused(0.05, heading=90.0), _refused(0.0, heading=180.0)]
    assert agreed_move(best, [best] + at_zero, cfg) is best
    turned = [_refused(4.0, 90.0, heading=90.0), _refused(4.1, 90.0, heading=180.0)]
    assert agreed_move(best, [best] + turned, cfg) is best


def test_a_sparse_highway_pair_returns_where_its_hypotheses_slides_landed(registrar):
    """Development VLP-16 highway pair (matrix base seed 1131, world 138, scans 22 -> 16, 12.7 m
    apart): the hypotheses of every heading land at zero motion, 12.7 m along the road from the
    truth, and are refused; the slide
    recovery moves several of them to within 10 cm of the truth, refused there too (the weakest
    constraint stays below ``min_constraint``). That place is what comes back, still untrusted."""
    from s2h_ros.evaluation.matrix import PairSettings, cell_pairs, matrix_cells

    (cell,) = matrix_cells(1131, sensors="vlp16", families="highway", mixed=[], indoor_sensors=[], real=[])
    (pair,) = [p for p in cell_pairs(cell, PairSettings()) if p.name.endswith("00022_00016")]
    result = registrar.register(pair.source, pair.target)
    re, te = geometry.transform_errors(result.transform, pair.T_gt)
    assert not result.success
    assert te < 0.3 and re < 1.0, (te, re, result.message)
    assert result.slid_m is not None and abs(result.slid_m) > 10.0
    assert result.message.startswith("not trusted: "), result.message
    assert result.num_candidates > 0 and result.weight_sum > 0  # the moved hypothesis's own match statistics


def test_a_dense_highway_pair_returns_where_most_headings_landed(registrar):
    """OS1-64 highway pair (matrix base seed 1156, world 518, scans 7 -> 12, 12.4 m apart, turned
    131 deg; held out until it was studied here): the hypotheses of 8 headings land within 5 cm of
    the truth, refused (too few inlier matches, degenerate along the road), while the one that fits
    best lies 12.3 m along the road and its slide recovery's move has no second heading beside it.
    The place where most headings landed is what comes back, still untrusted."""
    from s2h_ros.evaluation.matrix import PairSettings, cell_pairs, matrix_cells

    (cell,) = matrix_cells(1156, sensors="os1_64", families="highway", mixed=[], indoor_sensors=[], real=[])
    (pair,) = [p for p in cell_pairs(cell, PairSettings(n=4)) if p.name.endswith("00007_00012")]
    result = registrar.register(pair.source, pair.target)
    re, te = geometry.transform_errors(result.transform, pair.T_gt)
    assert not result.success
    assert te < 0.1 and re < 0.5, (te, re, result.message)
    assert "headings landed together, more than beside the best fitting one" in result.message, result.message
    best = result.message.split("The search's best: ")[1]
    assert "moved -12.3 m along it" in best, best


def test_a_tilted_16_beam_slide_is_judged_along_the_ground_and_not_trusted(registrar):
    """The slide above with both scans tilted (a handheld or pitched VLP-16: source 25 deg, target
    20 deg about other axes). Ground and structure are told apart against each cloud's levelled
    up, so the poles still show the slide and the result 4.2 m off is refused. (Judged in the
    tilted frames, the ground rising across the plan cells counted as structure, and the same slide
    was trusted: measured with ``level_above_deg`` 90 before levelled frames reached this test.)"""
    from s2h_ros.datasets.synthetic import simulate_sequence

    seq = simulate_sequence(n_frames=40, seed=1530, sensor="vlp16", family="highway")
    R_s = Rotation.from_rotvec(np.radians(25.0) * np.array([1.0, 0.3, 0.0]) / np.hypot(1.0, 0.3)).as_matrix()
    R_t = Rotation.from_rotvec(np.radians(20.0) * np.array([-0.2, 1.0, 0.0]) / np.hypot(0.2, 1.0)).as_matrix()
    source, target = seq[26].points @ R_s.T.astype(np.float32), seq[14].points @ R_t.T.astype(np.float32)
    tilt = lambda R: geometry.make_transform(R, np.zeros(3))  # noqa: E731
    truth = tilt(R_t) @ geometry.invert_transform(seq.poses[14]) @ seq.poses[26] @ tilt(R_s.T)
    zero_motion = tilt(R_t @ R_s.T)
    src, tgt = registrar.prepare(source), registrar.prepare(target)
    assert src.levelled_deg == pytest.approx(25.0, abs=2.0) and tgt.levelled_deg == pytest.approx(20.0, abs=2.0)
    alias = registrar.refine(src, tgt, zero_motion)
    assert geometry.transform_errors(alias.transform, truth)[1] > 3.0
    assert not alias.success
    assert alias.message.startswith("degenerate: a slide along the weakest direction"), alias.message
    assert abs(alias.slide.shift - np.linalg.norm(truth[:3, 3])) < 0.7, alias.slide


def test_a_right_result_in_the_grey_zone_is_still_trusted(registrar):
    """Development world 1533 (OS1-64 highway): scan 38 against scan 32; ICP from the truth is right,
    its weakest constraint in the grey zone, and its poles fit best where it is."""
    from s2h_ros.datasets.synthetic import simulate_sequence

    seq = simulate_sequence(n_frames=40, seed=1533, sensor="os1_64", family="highway")
    truth = geometry.invert_transform(seq.poses[32]) @ seq.poses[38]
    result = registrar.refine(registrar.prepare(seq[38].points), registrar.prepare(seq[32].points), truth)
    assert result.success, result.message
    assert geometry.transform_errors(result.transform, truth)[1] < 0.2
    assert result.degeneracy.eigenvalue < registrar.config.weak_constraint
    assert result.slide.gain < registrar.config.slide_margin, result.slide
