"""The global search's hypotheses and the choice between them.

A global search turns the source to several headings and may re-estimate each heading's
matches with DGR's RANSAC safeguard, so one call holds several candidate transforms. This module
is how they are told apart: the order headings are tried in (``heading_order``), when a result is
decisive enough to stop (``decisive``), which of two wins (``better``), when two agree
(``agree``), when a result sits where the sensor's own pattern fits its twin (``at_zero_motion``),
when a trusted result stands beside a rival (``without_rival``), and where refused hypotheses
landed together (``agreed_move``). The stages that produce the hypotheses live in
:mod:`s2h_ros.pipeline`; these are functions of the results and the config alone.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from s2h_ros import geometry
from s2h_ros.cloud import PreparedCloud
from s2h_ros.config import RegistrationConfig
from s2h_ros.registration_result import RegistrationResult


# A trusted heading hypothesis whose S2H matches are at least this fraction inliers ends the
# search over headings. Measured with the shipped features: the right heading of 64-beam pairs
# keeps 15-35 % (the real KITTI loop pair through its 180 deg hypothesis: 35 %), while a barely
# trusted chance alignment keeps about 1 % (that pair as given: 34 of 2,683, right by luck of
# the geometry); sparse 16-beam pairs keep 2-5 % at the right heading, so they try every heading.
DECISIVE_INLIER_RATIO = 0.1

# Two hypotheses of one scan closer than this (and a distance: ``agree``) agree: the global
# search's rivals here, the odometry's hypotheses (s2h_ros.odometry), the fine stage's turn.
AGREE_ROTATION_DEG = 2.0

# A refused global search without a prior returns where the slide moves of hypotheses at this many
# headings landed together (``agreed_move``).
AGREED_MOVES = 2

# A global search's trusted result stands against a rival (another hypothesis of the same search
# that disagrees with it yet has min_inliers inlier matches and RIVAL_FITNESS_SHARE of min_fitness,
# whichever test refused it) only with this many times the rival's inlier matches
# (without_rival).
RIVAL_INLIER_RATIO = 1.5
# ... and against a rival turned more than RIVAL_HEADING_DEG that passed every test itself, this many:
# counts found at different source headings compare poorly (the features see a turned scan
# differently). Set on few cases (docs/reliability.md, "Two trusted headings"): a road turned
# around trusted with 2.1x the truth's matches; right results beside trusted turned copies 1.7-6.5x.
TURNED_RIVAL_INLIER_RATIO = 2.5
RIVAL_FITNESS_SHARE = 0.5
# A degenerate hypothesis turned this much from the result (another heading hypothesis's half of
# the 90 deg between two) is still a rival: the structure along the weak direction leaves the
# position along it open, not the heading; and a trusted hypothesis turned this much needs
# TURNED_RIVAL_INLIER_RATIO (without_rival).
RIVAL_HEADING_DEG = 45.0

# Sensors whose pattern axes (``PreparedCloud.pattern_axis``) a result tilts by more than this
# against each other are not at zero motion, however close: a spinning lidar's rings are circles
# about its axis, and a turn about the axis maps them onto themselves, a tilt does not (tilted by 20
# deg, a ring that meets level ground 5 m from a sensor 1.7 m up meets it 2.1 m away, or beyond 80
# m, except near the tilt's own axis). Vehicles tilt a few degrees between scans; the real handheld
# Newer College OS1-64 scans, 0.5 m apart, 43-46 deg.
ZERO_MOTION_TILT_DEG = 20.0
_Z = np.array([0.0, 0.0, 1.0])  # a pattern axis when none is given: z


def headings_of(results: list[RegistrationResult]) -> int:
    """How many source headings ``results`` came from."""
    return len({r.heading_deg for r in results})


def agree(A: np.ndarray, B: np.ndarray, distance: float) -> bool:
    """Two (4, 4) transforms of one scan agree: within ``distance`` metres and ``AGREE_ROTATION_DEG``."""
    re, te = geometry.transform_errors(A, B)
    return te < distance and re < AGREE_ROTATION_DEG


def at_zero_motion(transform: np.ndarray, cfg: RegistrationConfig, src: PreparedCloud | None = None,
                   tgt: PreparedCloud | None = None) -> bool:
    """The (4, 4) result (input frames) puts the sensors less than ``inlier_distance`` apart and
    the axes their patterns are drawn about (``PreparedCloud.pattern_axis`` of ``src`` and ``tgt``;
    z when not given) within ``ZERO_MOTION_TILT_DEG``: where a sensor's own pattern (rings,
    rosette) lies on its twin whatever the scene."""
    if float(np.linalg.norm(transform[:3, 3])) >= cfg.inlier_distance:
        return False
    axis_src = _Z if src is None else src.pattern_axis()
    axis_tgt = _Z if tgt is None else tgt.pattern_axis()
    return tilt_deg(transform, axis_src, axis_tgt) < ZERO_MOTION_TILT_DEG


def tilt_deg(T: np.ndarray, axis_src: np.ndarray = _Z, axis_tgt: np.ndarray = _Z) -> float:
    """Degrees ``T`` (4, 4) turns the source's unit ``axis_src`` (3,) away from the target's
    ``axis_tgt`` (z: how far it tilts the source sensor against the target's)."""
    return float(np.degrees(np.arccos(np.clip((T[:3, :3] @ axis_src) @ axis_tgt, -1.0, 1.0))))


def better(candidate: RegistrationResult, current: RegistrationResult) -> bool:
    """Heading hypotheses: a trusted result beats an untrusted one, and among trusted ones more
    inlier correspondences win; among untrusted ones the higher fitness (the least wrong)."""
    if candidate.success != current.success:
        return candidate.success
    if candidate.success:
        return candidate.num_inliers > current.num_inliers
    return candidate.fitness > current.fitness


@dataclass
class Hypothesis:
    """One candidate transform of ``register`` (local frames) and what produced it."""

    T: np.ndarray  # (4, 4) float64
    pairs: np.ndarray  # (K, 2) int64 correspondences
    weights: np.ndarray  # (K,) float32
    num_candidates: int
    fallback: str  # why RANSAC estimated T instead of the learned weights ("": weighted Procrustes)
    message: str  # non-empty: no transform could be estimated
    heading: float  # deg, the source heading whose features found the pairs
    deferred: bool = False  # the weight-sum safeguard applies but RANSAC has not run yet (T not estimated)

    @property
    def learned(self) -> bool:
        """T is the weighted Procrustes of learned inlier weights."""
        return not self.fallback and not self.message and not self.deferred


def pins_no_pose(result: RegistrationResult, cfg: RegistrationConfig, against: np.ndarray,
                 src: PreparedCloud | None = None, tgt: PreparedCloud | None = None) -> bool:
    """An untrusted result whose inlier matches say nothing about one pose of the scene: at zero
    motion (``at_zero_motion`` of ``src`` and ``tgt``: the sensors less than ``inlier_distance``
    apart, their patterns' axes together), where they may be the pattern the
    sensor draws the same way wherever it stands (rings on the road and on guardrails along it,
    ``trust.rest_doubt``; a held-out 16-beam highway drive had such aliases with 731-790 inlier
    matches beside right results with 37-56), or where the geometry hardly constrains a direction
    (weakest constraint below ``min_constraint``): matches of structure extended along it support
    every position along it alike (a held-out OS1-64 highway pair: 101 beside a right result's 31).
    A degenerate result, or one in the grey zone below ``weak_constraint`` (refused as a slide),
    still pins the heading, at zero motion too (its matches lie on structure along the road or the
    room, which turns with the scan): turned more than ``RIVAL_HEADING_DEG`` from the transform
    ``against`` (the result it may rival), it contradicts that one (held-out OS1-64 highway, world
    822: a relocalisation trusted the road turned around, 16.6 m / 180 deg off, with 68 inlier
    matches at fitness 0.36, beside the heading as given with 609, degenerate along the road and
    slid to zero motion; a held-out depth-camera office at 0.3 m, world 487: trusted turned around,
    13 m off, moved along its weak direction to where 4 inlier matches remained, beside the right
    heading with 842, refused as a slide at zero motion in the grey zone)."""
    if result.success:
        return False
    weak = result.degeneracy is not None and result.degeneracy.eigenvalue < cfg.weak_constraint
    if weak and geometry.transform_errors(result.transform, against)[0] > RIVAL_HEADING_DEG:
        return False
    if result.degeneracy is not None and result.degeneracy.eigenvalue < cfg.min_constraint:
        return True
    return at_zero_motion(result.transform, cfg, src, tgt)


def decisive(result: RegistrationResult) -> bool:
    """Trusted with enough inlier matches to stop trying other hypotheses."""
    return result.success and result.inlier_ratio >= DECISIVE_INLIER_RATIO


def without_rival(result: RegistrationResult, verified: list[RegistrationResult], cfg: RegistrationConfig,
                  src: PreparedCloud | None = None, tgt: PreparedCloud | None = None) -> RegistrationResult:
    """``result``, the global search's best, still trusted only if no rival stands beside it: a
    hypothesis of the same search (another heading, the RANSAC safeguard's re-estimate) that
    disagrees with it (by the inlier distance or ``AGREE_ROTATION_DEG``), has
    ``min_inliers`` inlier matches and explains some of the scan (``RIVAL_FITNESS_SHARE`` of
    ``min_fitness``), whichever test refused it, unless the result has ``RIVAL_INLIER_RATIO``
    times its inlier matches. Inlier matches are what the features say; a second pose that
    nearly as many of them support means the scene fits both. The rival's fitness need not
    reach ``min_fitness``: fitness also measures overlap, low at the truth of a pair seen from
    far apart. An untrusted hypothesis that pins no pose (at zero motion, or degenerate at
    about the result's heading) is no rival (``pins_no_pose``).

    A scene symmetric under a turn fits the scan turned as well as the right way: a held-out
    HDL-32 highway pair 14 m apart was trusted turned around (58 inlier matches, fitness 0.66,
    180 deg / 27 m off; the right heading, 118 and 0.73, refused by the slide test), a
    development HDL-64 parking-lot pair turned by 90 deg (121, 0.60, 23 m off; the right
    heading 94, fitness 0.29). Development worlds (36 drives, 288 pairs, every hypothesis
    kept): this refuses that one wrong result and none of the 151 right ones trusted. The ratio,
    the fitness share and what pins no pose were set on two held-out runs (right results
    refused beside rivals 1.7x short, fitting 0.11, degenerate, or at zero motion) and checked
    on a fresh one (docs/reliability.md). Two right hypotheses of one pair land up to 0.35 m
    apart outdoors (development worlds) and 0.1 m at 0.05 m voxels (a held-out depth-camera
    pair was refused beside its twin 0.1 m away), while the wrong rivals found were 6-27 m
    off: they agree within the inlier distance.

    A rival turned more than ``RIVAL_HEADING_DEG`` from the result that passed every test
    itself needs ``TURNED_RIVAL_INLIER_RATIO`` times its matches: the features of a scan turned
    to another heading see it differently, so counts found at different headings compare
    poorly (a held-out VLP-16 highway pair, turned 157 deg: the road turned around, 11 m / 180
    deg off, 62 inlier matches at the 180 deg heading, beside the truth with 30 at 270 deg, both
    trusted; docs/reliability.md, "Two trusted headings")."""
    if not result.success:
        return result
    rivals = [c for c in verified if c.num_inliers >= cfg.min_inliers
              and c.fitness >= RIVAL_FITNESS_SHARE * cfg.min_fitness
              and not pins_no_pose(c, cfg, result.transform, src, tgt)
              and not agree(c.transform, result.transform, cfg.inlier_distance)]
    if not rivals:
        return result
    turned = [c for c in rivals
              if c.success and geometry.transform_errors(c.transform, result.transform)[0] > RIVAL_HEADING_DEG]
    rival = max(turned, key=lambda c: c.num_inliers, default=None)
    if rival is not None and result.num_inliers < TURNED_RIVAL_INLIER_RATIO * rival.num_inliers:
        re, te = geometry.transform_errors(rival.transform, result.transform)
        result.success = False
        result.message = (f"ambiguous: the heading {rival.heading_deg:.0f} deg hypothesis, turned {re:.0f} deg and "
                          f"{te:.1f} m away, passed every test too ({rival.num_inliers} inlier matches, fitness "
                          f"{rival.fitness:.2f}; this one {result.num_inliers}, {result.fitness:.2f}; need "
                          f"{TURNED_RIVAL_INLIER_RATIO:g}x its matches to stand): the scene fits the scan turned "
                          "as well as the right way, and inlier counts found at different headings compare poorly")
        return result
    rival = max(rivals, key=lambda c: c.num_inliers)
    if result.num_inliers >= RIVAL_INLIER_RATIO * rival.num_inliers:
        return result
    re, te = geometry.transform_errors(rival.transform, result.transform)
    result.success = False
    result.message = (f"ambiguous: the heading {rival.heading_deg:.0f} deg hypothesis, {te:.1f} m / {re:.0f} deg "
                      f"away, has {rival.num_inliers} inlier matches and fitness {rival.fitness:.2f} (this one "
                      f"{result.num_inliers}, {result.fitness:.2f}; need {RIVAL_INLIER_RATIO:g}x its matches to "
                      f"stand): the scene fits both{'; it was refused: ' + rival.message if rival.message else ''}")
    return result


def agreed_move(result: RegistrationResult, verified: list[RegistrationResult], cfg: RegistrationConfig,
                src: PreparedCloud | None = None, tgt: PreparedCloud | None = None) -> RegistrationResult:
    """A global search without a prior that trusted nothing: where hypotheses of ``AGREED_MOVES``
    or more headings (each heading's source features are its own; the RANSAC safeguard's
    re-estimate of the same matches is no second opinion) landed together (within ``agree``),
    that place is the estimate returned, still refused, its message saying so; else ``result``.
    First the places the slide recovery moved refused hypotheses to (``refused_move``); when
    no two agree, the places the hypotheses landed, moved or not, where more headings agree
    than on ``result`` and not at zero motion (``at_zero_motion``).

    Each move is made only to a clear peak of the structure that refuted the hypothesis where it
    had landed (``Registrar._slide_recovered``), and below ``min_constraint`` it must stay refused: there
    slide evidence cannot be told from a tunnel's. On sparse-sensor highways the hypotheses of
    several headings land at one place 10-20 m along the road (often zero motion, where the
    sensor's rings lie on their twins) and are moved together to within a few cm of the truth
    (held out, base seed 1135: 80 pairs, right 60 -> 62, none made wrong; docs/reliability.md).
    One move alone is no better a guess than the estimate (returning single moves was measured
    and withdrawn: a moved hypothesis of the real Newer College Ouster cycle landed 105 deg off,
    one of a cross-world pair had no inlier match). On a dense lidar's highway the hypotheses of
    most headings can land right, unmoved, while the one that fits best (the refused result's
    choice, ``better``) lies 12 m along the road: a held-out OS1-64 pair, 13 hypotheses of 8
    headings within 5 cm of the truth (docs/reliability.md). Only places at the rotation of the
    search's best estimate count: a move corrects a slide, not a heading (in the VLP-16 tunnel of
    ``test_sensor_fixed_scan_lines_do_not_count_as_constraints`` three hypotheses turned by 180
    deg, the tunnel's symmetry, moved together 6.9 m off, the truth 5.8 m away). With a prior
    (the odometry) nothing changes: the odometry weighs the search's estimate against
    its own hypotheses by how well each explains the scan, and a move can explain it less."""

    def at_best(o: RegistrationResult) -> bool:
        return geometry.transform_errors(o.transform, result.transform)[0] < AGREE_ROTATION_DEG

    moves = [v.refused_move for v in verified if v.refused_move is not None and at_best(v.refused_move)]
    group = landed_together(moves, cfg)
    if group:
        chosen = max(group, key=lambda o: o.fitness)
        chosen.message = (f"not trusted: {len(group)} refused hypotheses at {headings_of(group)} headings, each "
                          f"moved along the weakest direction to where the structure fits, landed together; this "
                          f"is where ({chosen.message}). The search's best unmoved: {result.message}")
        return chosen
    landed = [v for v in verified if at_best(v) and not at_zero_motion(v.transform, cfg, src, tgt)]
    group = landed_together(landed + moves, cfg, prefer=result)
    if not group or any(o is result for o in group):
        return result
    chosen = max(group, key=lambda o: o.fitness)
    chosen.message = (f"not trusted: {len(group)} refused hypotheses at {headings_of(group)} headings landed "
                      f"together, more than beside the best fitting one; this is where ({chosen.message}). The "
                      f"search's best: {result.message}")
    return chosen


def landed_together(places: list[RegistrationResult], cfg: RegistrationConfig,
                    prefer: RegistrationResult | None = None) -> list[RegistrationResult]:
    """The largest group of ``places`` that agree with one of them (``agree`` at the inlier
    distance) and hold ``AGREED_MOVES`` or more headings, by headings; on a tie the group holding
    ``prefer``, then the larger. Empty when none holds enough."""
    best: list[RegistrationResult] = []

    def rank(group: list[RegistrationResult]) -> tuple[int, bool, int]:
        return headings_of(group), any(o is prefer for o in group), len(group)

    for m in places:
        group = [o for o in places if agree(o.transform, m.transform, cfg.inlier_distance)]
        if headings_of(group) >= AGREED_MOVES and (not best or rank(group) > rank(best)):
            best = group
    return best


def heading_order(hypotheses: int, prior_yaw_deg: float | None = None) -> list[float]:
    """The ``hypotheses`` headings (deg, ``360 k / hypotheses``) in the order the global search
    tries them (``Registrar.headings`` says why): without a prior yaw 0 first, then the
    turn-around and the rest by distance from it; with one the heading nearest it first, 0 second
    (when not first), the rest by distance from it."""
    if hypotheses <= 1:
        return [0.0]
    headings = [360.0 * h / hypotheses for h in range(hypotheses)]
    if prior_yaw_deg is None:
        return [0.0] + sorted(headings[1:], key=lambda a: abs(a - 180.0))
    nearest = sorted(headings, key=lambda a: abs(geometry.angle_difference_deg(a, prior_yaw_deg)))
    return nearest[:1] + [0.0] + [a for a in nearest[1:] if a != 0.0] if nearest[0] != 0.0 else nearest
