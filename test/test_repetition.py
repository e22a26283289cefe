"""Repetition: a result that a sideways-shifted copy explains as well (a colonnade, rack bays) is
not trusted; a scene whose structure does not repeat still is. The measure on point sets with a
known period, then the registration's verdict on analytic colonnades ray-cast with the HDL-64
pattern (exact ground truth)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy.spatial.transform import Rotation
from test_degeneracy import GROUND_Z, _plane, message_round_trip, scan

from s2h_ros import geometry
from s2h_ros.config import RegistrationConfig
from s2h_ros.pipeline import Registrar
from s2h_ros.repetition import peak_shifts, repetition, shift_correlation
from s2h_ros.verification import result_repetition

MAX_REPETITION = RegistrationConfig().max_repetition
KITTI = Path(__file__).resolve().parents[2] / "shared" / "data" / "kitti"


# ---------------------------------------------------------------- the measure

def _posts(xs, y: float, rng: np.random.Generator, per_post: int = 300) -> tuple[np.ndarray, np.ndarray]:
    """``(len(xs) * per_post, 3)`` points on the surfaces of thin vertical posts at ``(x, y)`` and
    their unit normals (horizontal, pointing out of the post)."""
    a = rng.uniform(0, 2 * np.pi, (len(xs), per_post))
    z = rng.uniform(0.0, 3.0, (len(xs), per_post))
    x = np.asarray(xs, float)[:, None] + 0.1 * np.cos(a)
    points = np.column_stack([x.ravel(), (y + 0.1 * np.sin(a)).ravel(), z.ravel()])
    normals = np.column_stack([np.cos(a).ravel(), np.sin(a).ravel(), np.zeros(a.size)])
    return points, normals


def _wall(x0: float, x1: float, y: float, rng: np.random.Generator, n: int = 3000):
    """Points of a wall ``y = const`` from ``x0`` to ``x1``, 3 m high, and its normals (along y)."""
    points = np.column_stack([rng.uniform(x0, x1, n), np.full(n, y), rng.uniform(0.0, 3.0, n)])
    return points, np.tile([0.0, 1.0, 0.0], (n, 1))


def _stack(*parts):
    return np.vstack([p for p, _ in parts]), np.vstack([n for _, n in parts])


def test_a_row_of_posts_one_period_apart_is_a_copy_that_fits_as_well():
    """Posts every 2.5 m along x: the source seeing five of the nine, aligned, fits as well one or
    two posts further on; the measure finds such a copy, a whole number of periods along x, with a
    ratio of about 1."""
    rng = np.random.default_rng(0)
    target, _ = _posts(np.arange(-4, 5) * 2.5, 3.0, rng)
    aligned, normals = _posts(np.arange(-2, 3) * 2.5, 3.0, rng)
    rep = repetition(aligned, normals, target, 0.1, 0.5, 5.0)
    assert rep.ratio > 0.9, rep
    periods = abs(rep.shift[0]) / 2.5
    assert round(periods) >= 1 and abs(periods - round(periods)) < 0.06 and abs(rep.shift[1]) < 0.15, rep.describe()
    assert rep.fit > 0.9



def test_a_copy_the_data_contradict_is_passed_over_for_the_next_one():
    """The posts every 2.5 m again, the copies on both sides of the result fitting as well. Told
    that copies towards -x contradict the data (as the pipeline's free-space test says of a copy
    that lays the scan where the target's rays passed), the measure names a copy towards +x and
    counts what it passed over; told that none is allowed, no copy stands and the ratio is 0."""
    rng = np.random.default_rng(0)
    target, _ = _posts(np.arange(-4, 5) * 2.5, 3.0, rng)
    aligned, normals = _posts(np.arange(-2, 3) * 2.5, 3.0, rng)
    unchecked = repetition(aligned, normals, target, 0.1, 0.5, 5.0)
    asked = []

    def towards_plus_x(shift: np.ndarray) -> bool:
        asked.append(shift.copy())
        return bool(shift[0] > 0.0)

    plus = repetition(aligned, normals, target, 0.1, 0.5, 5.0, admissible=towards_plus_x)
    assert plus.shift[0] > 2.0 and plus.ratio > 0.9, plus
    assert plus.set_aside == sum(s[0] <= 0.0 for s in asked) and len(asked) == plus.set_aside + 1
    assert plus.ratio <= unchecked.ratio and unchecked.set_aside == 0
    none = repetition(aligned, normals, target, 0.1, 0.5, 5.0, admissible=lambda shift: False)
    assert none.ratio == 0.0 and not none.shift.any() and none.set_aside >= 2 and none.fit > 0.9

def test_posts_at_irregular_spacing_have_no_copy_that_fits():
    """The same posts at spacings drawn from 1-4 m: no shifted copy lands more than some of the
    posts (a few spacings agree to a cell)."""
    rng = np.random.default_rng(1)
    xs = np.cumsum(rng.uniform(1.0, 4.0, 9)) - 10.0
    target, _ = _posts(xs, 3.0, rng)
    aligned, normals = _posts(xs[2:7], 3.0, rng)
    rep = repetition(aligned, normals, target, 0.1, 0.5, 5.0)
    assert rep.fit > 0.9
    assert rep.ratio < 0.7, rep


def test_a_wall_along_the_shift_fits_any_shift_but_counts_for_nothing():
    """Irregular posts in front of a long wall along x: slid along x the wall still fits (the plain
    correlation stays above half the fit), but its normals face y, so it carries no constraint
    along the slide; the posts decide, and they do not repeat."""
    rng = np.random.default_rng(4)
    xs = np.cumsum(rng.uniform(1.0, 4.0, 9)) - 10.0
    target, _ = _stack(_posts(xs, 3.0, rng), _wall(-20.0, 20.0, 5.0, rng))
    aligned, normals = _stack(_posts(xs[2:7], 3.0, rng), _wall(-6.0, 6.0, 5.0, rng))
    scores = shift_correlation(aligned, target, 0.1, 5.0)
    assert scores[50 + 10:, 50].min() > 0.5 * scores[50, 50]  # C(d) along x never drops below half the fit
    rep = repetition(aligned, normals, target, 0.1, 0.5, 5.0)
    assert rep.ratio < 0.7, rep


def test_a_copy_that_lands_structure_where_the_result_lands_none_is_infinitely_better():
    """The source's posts land nowhere at the result; 3 m along x they land on the target's posts.
    At the result nothing holds the source along x and the copy something: the ratio is infinite,
    not 0 (which would call the result unrivalled), and the refusal says why in words. Where the
    copy lands nothing either, there is no copy (0)."""
    rng = np.random.default_rng(5)
    target, _ = _posts([3.0, 6.5], 3.0, rng)
    aligned, normals = _posts([0.0, 3.5], 3.0, rng)
    aligned[:, 2] += 0.02  # the source's own samples: none coincides with a target point
    rep = repetition(aligned, normals, target, 0.1, 0.5, 5.0)
    np.testing.assert_allclose(rep.shift, [3.0, 0.0, 0.0], atol=0.11)
    assert rep.ratio == np.inf and rep.fit < 1e-6, rep
    assert "nothing off the ground holds it along the shift" in rep.refusal(MAX_REPETITION)
    assert rep.to_dict()["ratio"] == np.inf  # strict JSON writers turn it into null (s2h_ros.outputs)
    alone = repetition(aligned, normals, _posts([-30.0], 3.0, rng)[0], 0.1, 0.5, 5.0)
    assert alone.ratio == 0.0 and not alone.shift.any()


def test_the_copy_is_found_in_the_direction_it_lies():
    """A source that fits only part of the target (two of its three posts) with the third post
    2 m further along +y: the copy that lands it is found at (0, +2) and fits better than the result
    (a ratio above 1: the result is not even the best translation)."""
    rng = np.random.default_rng(2)
    target, _ = _stack(_posts([0.0, 1.5], 0.0, rng), _posts([0.0, 1.5], 2.0, rng), _posts([3.0], 2.0, rng))
    aligned, normals = _stack(_posts([0.0, 1.5], 0.0, rng), _posts([3.0], 0.0, rng))
    rep = repetition(aligned, normals, target, 0.1, 0.5, 5.0)
    np.testing.assert_allclose(rep.shift, [0.0, 2.0, 0.0], atol=0.11)
    assert rep.ratio > 1.2, rep


def test_a_slope_that_runs_out_of_the_searched_square_is_not_a_peak():
    """A map rising towards its border (a structure continuing beyond the largest shift) has no
    competing peak there."""
    m = 10
    i, _ = np.meshgrid(np.arange(2 * m + 1), np.arange(2 * m + 1), indexing="ij")
    scores = 0.2 + 0.05 * i  # rises along +x to the border
    scores[m - 1:m + 2, m - 1:m + 2] = 1.0
    assert len(peak_shifts(scores, 0.1, 0.5, 8)) == 0
    scores[m + 5, m] = 2.0  # a real peak inside
    np.testing.assert_allclose(peak_shifts(scores, 0.1, 0.5, 8), [[0.5, 0.0]])


def test_a_far_copy_is_heard_beside_the_many_nearer_peaks_of_a_wider_square():
    """A far copy overlaps the target less, so its correlation is lower than that of the nearer
    peaks (a wall sliding along itself): ranked over the whole square it is not among the
    candidates; each square beyond the first ranks its own peaks, so it is."""
    m = 60  # 6 m at 0.1 m
    i, j = np.meshgrid(np.arange(2 * m + 1) - m, np.arange(2 * m + 1) - m, indexing="ij")
    scores = -0.001 * np.hypot(i, j)  # falling away from the result: no peak but those set below
    scores[m, m] = 1.0
    for k in range(-15, 16, 3):  # eleven peaks within 1.5 m along x
        if k:
            scores[m + k, m] = 0.9
    scores[m + 45, m] = 0.3  # the copy 4.5 m away
    scores[m, m - 20] = 0.25  # one on the inner square's border: a slope there, a peak in the wider map
    whole = peak_shifts(scores, 0.1, 0.2, 8)
    assert len(whole) == 8 and not np.any(np.all(np.isclose(whole, [4.5, 0.0]), axis=1))
    inner = peak_shifts(scores[m - 20:m + 21, m - 20:m + 21], 0.1, 0.2, 20)
    assert not np.any(np.all(np.isclose(inner, [0.0, -2.0]), axis=1))
    beyond = peak_shifts(scores, 0.1, 0.2, 8, beyond=2.0)
    np.testing.assert_allclose(beyond, [[4.5, 0.0], [0.0, -2.0]])


def test_the_correlation_at_zero_is_the_fit_of_the_aligned_points():
    """C(0) counts the aligned points within about one cell of the target: all of a copy of the
    target, only the part still overlapping a target cut in height when lifted by 1 m."""
    rng = np.random.default_rng(3)
    target, _ = _posts([0.0, 2.5], 0.0, rng)
    scores = shift_correlation(target, target, 0.1, 1.0)
    assert scores[10, 10] == pytest.approx(1.0)
    above = shift_correlation(target + np.array([0.0, 0.0, 1.0]), target[target[:, 2] < 1.5], 0.1, 1.0)
    assert above[10, 10] < 0.55


# ---------------------------------------------------------------- the registration's verdict

def _column(x0: float, y0: float, half: float, top_z: float):
    """The outside of a square column ``2 half`` wide, axis-aligned, from the ground to ``top_z``."""
    lo, hi = np.array([x0 - half, y0 - half, GROUND_Z]), np.array([x0 + half, y0 + half, top_z])

    def distance(o, d):
        with np.errstate(divide="ignore", invalid="ignore"):
            t1, t2 = (lo - o) / d, (hi - o) / d
        near = np.nanmax(np.minimum(t1, t2), axis=1)
        far = np.nanmin(np.maximum(t1, t2), axis=1)
        return np.where((near <= far) & (near > 0), near, np.inf)

    return distance


def colonnade(near, far, sizes=None) -> list:
    """Ground, a row of square columns at x in ``near`` (y = -5), another at ``far`` (y = +4) and a
    wall behind it (y = +8): no half-turn maps it onto itself. ``sizes``: ``(half width, top z)``
    per column, near then far (default: all 1 m wide, 4 m high)."""
    centres = [(x, -5.0) for x in near] + [(x, 4.0) for x in far]
    sizes = [(0.5, 4.0)] * len(centres) if sizes is None else sizes
    return ([_plane([0, 0, 1], GROUND_Z), _plane([0, 1, 0], 8.0, below_z=6.0)]
            + [_column(x, y, half, top) for (x, y), (half, top) in zip(centres, sizes)])


@pytest.fixture(scope="module")
def registrar():
    return Registrar(RegistrationConfig())  # shipped FCGF + S2H, as the node runs


def test_a_colonnade_that_repeats_every_5_m_is_not_trusted(registrar):
    """The sensor moved one column spacing (5 m) along a colonnade that repeats every 5 m: the two
    scans are the same picture, so the data cannot tell 0 from 5 m. Without the test the result
    passes every other check; with it, it is refused and says why."""
    rng = np.random.default_rng(5)
    xs = np.arange(-60.0, 61.0, 5.0)
    surfaces = colonnade(xs, xs + 2.0)
    target, source = scan(surfaces, "hdl64", 0.0, rng), scan(surfaces, "hdl64", 5.0, rng)
    unchecked = registrar.with_config(RegistrationConfig(max_repetition=0.0))
    loose = unchecked.register(source, target)
    assert loose.success, loose.message
    assert loose.repetition is None  # not asked when off
    result = registrar.register(source, target)
    assert not result.success
    assert result.message.startswith("ambiguous: shifted by"), result.message
    assert result.repetition.ratio >= MAX_REPETITION
    periods = abs(result.repetition.shift[0]) / 5.0
    assert round(periods) >= 1 and abs(periods - round(periods)) < 0.15, result.repetition.describe()
    assert result.to_dict()["repetition"]["ratio"] == result.repetition.ratio


def test_the_result_message_carries_the_repeated_copy(registrar):
    """registration_node's s2h_ros/RegistrationResult: the periodic colonnade's refused result keeps
    its repetition and the copy's shift through the conversion and a serialisation round trip."""
    rng = np.random.default_rng(5)
    xs = np.arange(-60.0, 61.0, 5.0)
    surfaces = colonnade(xs, xs + 2.0)
    result = registrar.register(scan(surfaces, "hdl64", 5.0, rng), scan(surfaces, "hdl64", 0.0, rng))
    msg = message_round_trip(result)
    assert not msg.success and msg.message.startswith("ambiguous: shifted by")
    assert msg.repetition == pytest.approx(result.repetition.ratio, rel=1e-6)
    assert msg.repetition >= MAX_REPETITION
    np.testing.assert_allclose(msg.repetition_shift, result.repetition.shift, atol=1e-5)


def _irregular_colonnade():
    """Columns 3-8 m apart, 0.6-1.6 m wide and 2-6 m high; HDL-64 scans at x = 0 (target) and 5 m."""
    rng, draw = np.random.default_rng(6), np.random.default_rng(8)
    spacing = draw.uniform(3.0, 8.0, (2, 26))
    sizes = list(zip(draw.uniform(0.3, 0.8, 52), draw.uniform(2.0, 6.0, 52)))
    surfaces = colonnade(np.cumsum(spacing[0]) - 70.0, np.cumsum(spacing[1]) - 70.0, sizes)
    return scan(surfaces, "hdl64", 5.0, rng), scan(surfaces, "hdl64", 0.0, rng)


def test_a_colonnade_at_irregular_spacing_is_still_trusted(registrar):
    """The sensor 5 m along columns at irregular spacing: right, trusted, and the strongest shifted
    copy well below the threshold, though the wall behind slides onto itself under any shift
    along it (measured 0.52; 0.87 if the wall's points counted)."""
    source, target = _irregular_colonnade()
    result = registrar.register(source, target)
    re, te = geometry.transform_errors(result.transform, geometry.make_transform(np.eye(3), np.array([5.0, 0, 0])))
    assert result.success, result.message
    assert te < 0.1 and re < 0.5
    assert result.repetition is not None and result.repetition.ratio < 0.8 * MAX_REPETITION, result.repetition


def test_at_a_wrong_pose_the_copy_that_fits_better_is_the_truth(registrar):
    """The same scans at zero motion (the wrong pose where the ground and the wall align, 5 m off):
    shifted by the truth the scan's columns fit about twice as well (ratio above 1.5, the copy within
    0.3 m of the truth); at the truth nothing comes near."""
    source, target = _irregular_colonnade()
    src, tgt = registrar.prepare(source), registrar.prepare(target)
    local = lambda T: geometry.shift_transform(T, -src.origin, -tgt.origin)  # noqa: E731
    cfg = registrar.config
    wrong = result_repetition(src, tgt, local(np.eye(4)), cfg)
    assert wrong.ratio > 1.5, wrong
    assert np.linalg.norm(wrong.shift - [5.0, 0.0, 0.0]) < 0.3, wrong.describe()
    right = result_repetition(src, tgt, local(geometry.make_transform(np.eye(3), np.array([5.0, 0, 0]))), cfg)
    assert right.ratio < 0.7, right


def test_a_tilted_sensors_copy_is_looked_for_along_its_ground(registrar):
    """The wrong pose of the test above with both scans tilted (a handheld lidar: source 30 deg,
    target 25 deg, about different axes): the shifts are looked for along the levelled keyframe's
    ground and the copy's shift is given in the keyframe's own, tilted frame, so the truth is still
    found (within 0.3 m). Searched in the tilted x, y, a 5 m slide is 2 m out of plane and no copy
    fits as well (the check as given, ``level_above_deg`` 90)."""
    source, target = _irregular_colonnade()
    R_s = Rotation.from_rotvec(np.radians(30.0) * np.array([1.0, 0.3, 0.0]) / np.hypot(1.0, 0.3)).as_matrix()
    R_t = Rotation.from_rotvec(np.radians(25.0) * np.array([-0.2, 1.0, 0.0]) / np.hypot(0.2, 1.0)).as_matrix()
    wrong_pose = geometry.make_transform(R_t @ R_s.T, np.zeros(3))  # zero motion, in the tilted frames
    truth_shift = R_t @ np.array([5.0, 0.0, 0.0])
    for levelled in (True, False):
        reg = registrar if levelled else Registrar(RegistrationConfig(level_above_deg=90.0))
        src, tgt = reg.prepare(source @ R_s.T), reg.prepare(target @ R_t.T)
        local = geometry.shift_transform(wrong_pose, -src.origin, -tgt.origin)
        wrong = result_repetition(src, tgt, local, reg.config)
        if levelled:
            assert src.level is not None and tgt.level is not None
            assert wrong.ratio > 1.5, wrong
            assert np.linalg.norm(wrong.shift - truth_shift) < 0.3, wrong.describe()
        else:
            assert wrong.ratio < 1.0 or np.linalg.norm(wrong.shift - truth_shift) > 1.0, wrong


def test_a_narrow_views_copy_that_the_target_saw_through_does_not_refuse_a_right_result(registrar):
    """A 32-beam scan against a Livox's 70 deg view 13 m away in a town (development world 878, the
    source turned by its drawn heading): the search's result is right (TE 1 cm), but it shares only
    an eighth of the scan with the narrow target, and the scan shifted 24 m along the street lands
    1.2 times as much of its structure on the target's facades. That copy lays more of the scan
    where the target's rays passed than the free-space test allows a result, so it is not a pose the
    data support: the result is trusted, its strongest copies set aside."""
    from s2h_ros.datasets.synthetic.sequence import synthetic_pairs
    from s2h_ros.datasets.types import turned_pairs
    from s2h_ros.verification import seen_through_of

    pairs = synthetic_pairs(10, 878, sensor="hdl32", target_sensor="livox", family="town",
                            min_distance=10.0, max_distance=20.0)
    pair = list(turned_pairs(pairs, 0.0, 180.0, 878))[4]
    src, tgt = registrar.prepare(pair.source), registrar.prepare(pair.target)
    result = registrar.register(src, tgt)
    re, te = geometry.transform_errors(result.transform, pair.T_gt)
    assert result.success and te < 0.1 and re < 0.5, (result.message, te, re)
    assert result.repetition.ratio < MAX_REPETITION and result.repetition.set_aside >= 1, result.repetition
    cfg = registrar.config
    local = geometry.shift_transform(result.transform, -src.origin, -tgt.origin)
    unchecked = result_repetition(src, tgt, local, cfg.replace(max_free_space=0.0))
    assert unchecked.ratio >= MAX_REPETITION and unchecked.set_aside == 0, unchecked  # it would refuse the result
    copy = local.copy()
    copy[:3, 3] += unchecked.shift  # the target is level: the shift is in its own frame
    at_result, at_copy = seen_through_of(src, tgt, local, cfg), seen_through_of(src, tgt, copy, cfg)
    assert tgt.level is None and at_result.through < 0.03 and at_copy.through > cfg.max_free_space, (at_result, at_copy)


def _raw_kitti() -> tuple[np.ndarray, np.ndarray]:
    raw = KITTI / "raw_00"
    return tuple(np.fromfile(raw / f"00000{i}.bin", np.float32).reshape(-1, 3) for i in (1, 0))


def test_a_highway_scan_one_lamp_period_off_is_not_trusted(registrar):
    """Held-out simulated OS1-32 highway (world 634): the scan 32 m on from its target, registered
    globally, lands one lamp period (about 48 m) behind the truth, where it overlaps the target more
    and fits better (fitness 0.43 against 0.27 at the truth), passing every other test. The road
    leaves the pose nearly free along it (weakest constraint 0.020, below weak_constraint), so the
    copies are looked for to 72 m: the one a period along the road (at the truth) fits the
    structure as well, and the result is refused as ambiguous. Searched within 30 m only, as
    before, it was trusted (docs/reliability.md)."""
    from s2h_ros.datasets.synthetic import simulate_sequence

    drive = simulate_sequence(n_frames=13, seed=634, sensor="os1_32", family="highway")
    truth = np.linalg.inv(drive.poses[0]) @ drive.poses[12]
    result = registrar.register(drive[12].points, drive[0].points)
    re, te = geometry.transform_errors(result.transform, truth)
    assert te > 40.0, (re, te)  # the lamp period's copy: what the global search finds here
    assert not result.success, result.message
    assert result.message.startswith("ambiguous: shifted by") and "lamp posts" in result.message
    assert 40.0 < float(np.linalg.norm(result.repetition.shift)) < 56.0, result.repetition
    assert result.degeneracy.eigenvalue < registrar.config.weak_constraint


@pytest.mark.parametrize("name", ["raw_kitti_00_1_to_0", "kitti_loop_pair"])
def test_real_scans_are_still_trusted_with_no_copy_near_the_threshold(name, registrar):
    """Real HDL-64E scans: RAW KITTI 00 frames 1 -> 0 (0.68 m) and the KITTI loop pair (148 deg):
    trusted and right, the strongest shifted copy far below the threshold."""
    if name == "kitti_loop_pair":
        from s2h_ros.datasets.kitti import kitti_loop_pair

        pair = kitti_loop_pair()
        source, target, truth = pair.source, pair.target, pair.T_gt
    else:
        source, target = _raw_kitti()
        truth = None
    result = registrar.register(source, target)
    assert result.success, result.message
    if truth is not None:
        re, te = geometry.transform_errors(result.transform, truth)
        assert te < 0.3 and re < 1.0
    else:
        assert 0.5 < np.linalg.norm(result.transform[:3, 3]) < 0.9  # about 0.68 m forward
    assert result.repetition is not None and result.repetition.ratio < 0.8 * MAX_REPETITION, result.repetition
