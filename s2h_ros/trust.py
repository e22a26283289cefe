"""Whether a registration result is trusted (no ROS): the success test of a transform.

:mod:`s2h_ros.verification` measures a result (inlier matches, fitness, the structure off the
ground, the point-to-plane terms along its weakest direction, the slide evidence, the free space
of the target's view); this module decides from those measures, in order, and says why it refused:

1. support (:func:`support_doubt`): enough inlier matches and fitness, or in the low-fitness band
   enough structure off the ground (:func:`low_fitness`) or, for a global search's result, many
   matches and a stricter free-space test (:func:`matches_suffice`), or few matches that the
   structure carries (:func:`few_inliers_suffice`);
2. constraint: below ``min_constraint`` even the truth is not trusted;
3. slides: in the grey zone (below ``weak_constraint``) the slide test along the weakest direction;
4. a global search's result (``structure``) also: no rest without a prior (:func:`rest_doubt`),
   structure off the ground where fitness and constraint cannot tell (:func:`structure_doubt`;
   in the grey zone, many matches may stand in for it: :func:`grey_matches_suffice`), and nothing
   seen through (the free-space test, stricter for a result that its matches, or only the
   target's structure, carry).

:func:`judge` runs them and returns a :class:`Verdict`; ``Registrar`` (s2h_ros.pipeline) times it
as its ``verify`` stage and builds the result. The repetition test (``Registrar.unrepeated``) is
asked once of a search's final result, not here.

Every function works on the clouds' local frames (``PreparedCloud.xyz``, relative to ``origin``)
unless it says ``transform`` (between the input frames).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from s2h_ros import geometry
from s2h_ros.cloud import PreparedCloud
from s2h_ros.config import RegistrationConfig
from s2h_ros.degeneracy import Degeneracy, SlideEvidence
from s2h_ros.free_space import FreeSpace
from s2h_ros.hypotheses import at_zero_motion
from s2h_ros.verification import (BY_FIT, BY_MATCHES, BY_STRUCTURE_BACK, alignment_covariance, alignment_degeneracy,
                                  fraction_text, free_space_refusal, mutual_fitness, nearest_voxels,
                                  point_to_plane_rows, seen_through_of, slide_of, slide_refusal, structure_fitness,
                                  verify)


@dataclass
class Verdict:
    """What :func:`judge` found: the measures of a transform and whether it is trusted."""

    transform: np.ndarray  # (4, 4) between the input frames
    success: bool
    message: str  # why it is not trusted ("" when it is)
    num_inliers: int
    inlier_mask: np.ndarray  # (K,) bool over the matches
    fitness: float
    fitness_fine: float
    covariance: np.ndarray  # (6, 6) in the target's input frame
    degeneracy: Degeneracy
    slide: SlideEvidence | None  # asked in the grey zone of the constraint measure
    structure_fit: float | None  # the source's fitness off the ground, where it was measured
    rest_unconfirmed: bool  # refused at zero motion in the grey zone (rest_doubt)
    free_space: FreeSpace | None  # asked of a global search's trusted result


def low_fitness(fitness: float, cfg: RegistrationConfig, overlap: float | None = None) -> bool:
    """Whether a result's ``fitness`` lies below ``min_fitness`` with its ``overlap`` (the fitness
    itself, or ``mutual_fitness``) at or above ``low_fitness_floor``: the band where the off-ground
    structure decides (``low_fitness_structure``; ``RegistrationConfig``)."""
    overlap = fitness if overlap is None else overlap
    band_open = 0 < cfg.low_fitness_floor < cfg.min_fitness
    return band_open and overlap >= cfg.low_fitness_floor and fitness < cfg.min_fitness


def few_inliers_suffice(n_inl: int, fitness: float, degeneracy: Degeneracy, cfg: RegistrationConfig) -> bool:
    """Whether a result with fewer than ``min_inliers`` inlier matches may stand on its structure
    instead (:func:`support_doubt`): at least ``few_inliers_floor`` of them, fitness
    ``min_fitness``, weakest constraint at least ``weak_constraint``."""
    return (0 < cfg.few_inliers_floor <= n_inl < cfg.min_inliers and fitness >= cfg.min_fitness
            and degeneracy.eigenvalue >= cfg.weak_constraint)


def matches_suffice(n_inl: int, fitness: float, overlap: float, cfg: RegistrationConfig) -> bool:
    """Whether a global search's result in the low-fitness band (:func:`low_fitness` of its
    ``fitness`` and ``overlap``) whose structure off the ground does not fit may stand on its
    matches instead (:func:`support_doubt`): at least ``low_fitness_inliers`` inlier matches, with
    the free-space test at ``low_fitness_free_space`` behind it.

    A view that overlaps its target by a third fits about a third at the truth, and its structure
    off the ground no more: indoors, walls, furniture and racks are most of the scene, so the
    structure test that rescues a sparse lidar's rings (:func:`low_fitness`) cannot tell little
    overlap from a wrong pose. What tells them apart is where a wrong pose puts the scene: where
    the target's sensor saw through it (docs/reliability.md, 'Many matches and free space for
    views that overlap little')."""
    return 0 < cfg.low_fitness_inliers <= n_inl and low_fitness(fitness, cfg, overlap)


class Support(NamedTuple):
    """What :func:`support_doubt` or :func:`structure_doubt` decided."""

    message: str  # the refusal ("" when supported)
    structure_fit: float | None  # the source's fitness off the ground, where it was measured
    carried_by: str = BY_FIT  # what carried it: how strict the free-space test is (verification.free_space_refusal)


def support_doubt(src: PreparedCloud, tgt: PreparedCloud, T: np.ndarray, n_inl: int, fitness: float,
                  cfg: RegistrationConfig, require_inliers: bool, degeneracy: Degeneracy,
                  free_space_backed: bool = False) -> Support:
    """How much of the scan supports ``T``: ``min_inliers`` inlier matches (when
    ``require_inliers``) and ``min_fitness``, or, for a fitness in the band of :func:`low_fitness`,
    ``low_fitness_structure`` of the voxels off the ground (``structure_fitness``).

    A sparse sensor's rings meet the ground at other places from each pose, so its right
    results fit 0.3-0.5; the ground also fits almost any level pose, lifting wrong results to
    the same band. Off the ground neither happens (development worlds: right 0.38-0.85, wrong
    0.14-0.37 in that band; docs/reliability.md).

    ``free_space_backed``: a global search's result, which the free-space test judges after
    this one. Two more ways in, both with that test behind them:

    - Below ``min_fitness``, both ways are asked (``mutual_fitness``, and the target's structure
      against the source). The fitness counts the source's voxels near the target's, so it is
      capped by how densely the target sampled the scene and how much of the source's view the
      target saw: a dense sensor against a sparse one (OS1-128 against VLP-16) or a narrow view
      against a wide one (a Livox's 70 deg cone) fits one way only at the truth (development
      matrix, base seed 1128, OS1-128 against VLP-16: 0.27-0.51 forward, 0.52-0.86 back; off
      the ground 0.30-0.57 and 0.55-0.90). The way back has its own risk: a dense source
      covers so much space that a sparse target's structure fits it by chance up to about 0.45
      (another world's scan, development), and the free-space test refuses those (0.38), at
      most ``back_free_space`` for a result the way back alone carries (``BY_STRUCTURE_BACK``).
    - Below ``min_inliers``, down to ``few_inliers_floor`` (:func:`few_inliers_suffice`), with
      ``min_structure_fitness`` off the ground: a sparse source's features match a dense
      target's few times (matrix base seed 1130, studied since: VLP-16 against OS1-128, 11-27
      inlier matches at fitness 0.76-0.81, right); the wrong results there with 3-28 matches
      and fitness 0.5 or more were slides along highways and a parking lot, below
      ``min_constraint``.
    - In the low-fitness band with ``low_fitness_inliers`` inlier matches or more
      (:func:`matches_suffice`) where the structure does not fit, with the free-space test
      stricter (``low_fitness_free_space``): pairs that overlap little.

    Returns the refusal ("" when supported), the off-ground fitness where it was measured, and
    whether the matches alone carried it (the free-space test then decides at
    ``low_fitness_free_space``)."""
    enough_inliers = n_inl >= cfg.min_inliers or not require_inliers
    if enough_inliers and fitness >= cfg.min_fitness:
        return Support("", None)
    if not enough_inliers and free_space_backed and few_inliers_suffice(n_inl, fitness, degeneracy, cfg):
        structure_fit = structure_fitness(src, tgt, T, cfg)
        if structure_fit is not None and structure_fit >= cfg.min_structure_fitness:
            return Support("", structure_fit)
        return Support(f"not trusted: {n_inl} inlier correspondences (need {cfg.min_inliers}, or "
                       f"{cfg.few_inliers_floor} with {cfg.min_structure_fitness:.2f} of the voxels off the ground "
                       f"fitting: {fraction_text(structure_fit)})", structure_fit)
    structure_fit = structure_back = overlap = None
    if enough_inliers:
        overlap = mutual_fitness(src, tgt, T, cfg, fitness) if free_space_backed else fitness
        if low_fitness(fitness, cfg, overlap):
            structure_fit = structure_fitness(src, tgt, T, cfg)
            if free_space_backed and (structure_fit is None or structure_fit < cfg.low_fitness_structure):
                structure_back = structure_fitness(tgt, src, np.linalg.inv(T), cfg)
        if (structure_fit or 0.0) >= cfg.low_fitness_structure:
            return Support("", structure_fit)
        if (structure_back or 0.0) >= cfg.low_fitness_structure:
            return Support("", structure_fit, BY_STRUCTURE_BACK)
        if free_space_backed and matches_suffice(n_inl, fitness, overlap, cfg):
            return Support("", structure_fit, BY_MATCHES)
    either, off = "", ""
    if free_space_backed and overlap is not None:
        either = f", {overlap:.2f} the better way"
        if structure_fit is not None or structure_back is not None:
            off = (f"; off the ground {fraction_text(structure_fit)} of the source's voxels and {fraction_text(structure_back)} "
                   f"of the target's fit (need {cfg.low_fitness_structure:.2f} either way below fitness "
                   f"{cfg.min_fitness:.2f})")
    elif structure_fit is not None:
        off = (f", {structure_fit:.2f} off the ground (need {cfg.low_fitness_structure:.2f} below fitness "
               f"{cfg.min_fitness:.2f})")
    return Support(f"not trusted: {n_inl} inlier correspondences (need {cfg.min_inliers}), "
                   f"fitness {fitness:.2f}{either} (need {cfg.min_fitness:.2f}){off}", structure_fit)


def rest_doubt(src: PreparedCloud, tgt: PreparedCloud, transform: np.ndarray, slide: SlideEvidence | None,
               degeneracy: Degeneracy, cfg: RegistrationConfig) -> str:
    """A global search's result (no motion prior behind it; ``transform`` between the input
    frames) at zero motion (``at_zero_motion``) in the grey zone of the constraint measure
    (``slide`` asked: weakest constraint below ``weak_constraint``) is not trusted: the refusal
    message, "" where the rule does not apply. The result says so (``rest_unconfirmed``), and
    the odometry keeps its keyframe through such scans (s2h_ros.odometry).

    The ground is not the only pattern a sensor draws the same way wherever it stands: rings
    on a guardrail, a noise barrier or a tunnel wall along the road lie on their twins at zero
    motion too, and fit off the ground whatever the truth (held-out VLP-16 highway pair 19.5 m
    apart: trusted at zero motion with 0.87 of the off-ground voxels fitting, 0.32 of the
    poles and sign posts). Nor are the rings the only such pattern: a wall seen at a grazing
    angle is drawn as columns, one per azimuth step of the sensor, 1.5-6 m apart along the
    wall 50-100 m away, and each looks like a pole. In a tunnel they are most of what is not
    extended along its axis, and they lie on their twins at zero motion: held-out HDL-64 tunnel
    (world 785), scans 11.4 m apart, trusted at zero motion with 0.93 of the slide test's
    structure fitting, as a sensor at rest fits its poles (0.90-0.96 on development worlds),
    every fit the verification has favouring it (docs/reliability.md). So in the grey zone,
    where the scene gives little else, a global search cannot tell rest from a slide; rest is
    confirmed by the motion prior instead (tracking is not asked this)."""
    if slide is None or not at_zero_motion(transform, cfg, src, tgt):
        return ""
    moved = float(np.linalg.norm(transform[:3, 3]))
    return (f"not trusted: zero motion ({moved:.2f} m) where the geometry hardly constrains "
            f"{degeneracy.describe()} (weakest constraint {degeneracy.eigenvalue:.4f} < {cfg.weak_constraint:g}): "
            "there the sensor's own pattern (rings on the ground, rails and walls; a wall seen at a grazing "
            "angle drawn as columns) lies on its twin whatever the motion, and a global search cannot tell "
            "rest from a slide")


def structure_doubt(src: PreparedCloud, tgt: PreparedCloud, T: np.ndarray, transform: np.ndarray, fitness: float,
                    cfg: RegistrationConfig, slide: SlideEvidence | None = None, degeneracy: Degeneracy | None = None,
                    structure_fit: float | None = None, n_inl: int = 0) -> Support:
    """A global search's result (no motion prior behind it; ``T`` between the local frames,
    ``transform`` between the input frames) must fit off the ground too (``structure_fitness``,
    ``min_structure_fitness``) where the fitness and the constraint measure cannot tell it
    from the truth: at zero motion (``at_zero_motion``: the ground's sensor pattern aligns
    there whatever the scene), and in the grey zone of the constraint measure (``slide``
    asked: weakest constraint below ``weak_constraint``; at zero motion there :func:`rest_doubt`
    has refused it already). Returns the :class:`Support`: the refusal message ("" when it fits
    or neither applies), the off-ground fitness (``structure_fit`` when already measured, else
    measured here when asked) and whether its ``n_inl`` inlier matches stood in for the structure
    in the grey zone (:func:`grey_matches_suffice`; the free-space test then decides at
    ``low_fitness_free_space``).

    Away from zero motion, a result in the grey zone lays a wide, flat ground on the target's
    and the rows of a parking lot or a street's facades on rows and facades running the same
    way, so the ground carries its fitness past ``min_fitness`` while the scene off the ground
    does not fit (held-out Livox parking-lot pair with nothing in common at the truth: trusted
    93 deg / 7.8 m off, fitness 0.59, 0.33 off the ground). On development worlds (matrix
    base seed 1128, 4 sensors x town, suburban, parking lot, highway), right results in the
    grey zone fitted 0.68-0.93 off the ground, the wrong ones outside highways 0.11-0.47."""
    zero, grey = at_zero_motion(transform, cfg, src, tgt), slide is not None
    moved = float(np.linalg.norm(transform[:3, 3]))
    if cfg.min_structure_fitness <= 0 or not (zero or grey):
        return Support("", structure_fit)
    if structure_fit is None:
        structure_fit = structure_fitness(src, tgt, T, cfg)
    if structure_fit is None or structure_fit >= cfg.min_structure_fitness:
        return Support("", structure_fit)
    if zero:
        return Support(f"not trusted: zero motion ({moved:.2f} m) with fitness {fitness:.2f} but only "
                       f"{structure_fit:.2f} off the ground (need {cfg.min_structure_fitness:.2f}): the ground's "
                       "sensor pattern, not the scene, aligns", structure_fit)
    if grey_matches_suffice(n_inl, cfg):
        return Support("", structure_fit, BY_MATCHES)
    weakest = "" if degeneracy is None else (
        f"the geometry hardly constrains {degeneracy.describe()} (weakest constraint "
        f"{degeneracy.eigenvalue:.4f} < {cfg.weak_constraint:g}) and ")
    return Support(f"not trusted: {weakest}only {structure_fit:.2f} of the voxels off the ground fit (need "
                   f"{cfg.min_structure_fitness:.2f}), with fitness {fitness:.2f}: the ground and structure "
                   "running the same way, not the scene, align", structure_fit)


def grey_matches_suffice(n_inl: int, cfg: RegistrationConfig) -> bool:
    """Whether a global search's result in the grey zone (away from zero motion) whose structure
    off the ground does not fit may stand on its ``n_inl`` inlier matches instead
    (:func:`structure_doubt`): at least ``grey_zone_inliers``, with the free-space test at
    ``low_fitness_free_space`` behind it, as in the low-fitness band (:func:`matches_suffice`).

    Indoors the weakest direction of a right result is often along a wall, a shelf or a
    corridor, and a view that overlaps its target by a third fits off the ground about as much
    as it overlaps: the structure test, made for a street's rows of cars and facades, refuses
    such results (docs/reliability.md, 'Two more ways to stand on little overlap')."""
    return 0 < cfg.grey_zone_inliers <= n_inl


def judge(src: PreparedCloud, tgt: PreparedCloud, T: np.ndarray, pairs: np.ndarray, cfg: RegistrationConfig,
          message: str = "", require_inliers: bool = True, structure: bool = False, slid: bool = False) -> Verdict:
    """The success test of a transform ``T`` (4, 4) between the clouds' local frames, with its
    matches ``pairs`` (K, 2) int64 (source, target voxel): the measures, the covariance and the
    verdict, in the order of the module docstring. ``message``: a refusal decided before (the
    transform is measured, never trusted).

    ``structure``: a global search's result, which must also pass :func:`rest_doubt`,
    :func:`structure_doubt` and the free-space test. ``slid``: a result moved along its weakest
    direction to where its structure fits (``Registrar._slide_recovered``): that structure, not the
    matches, pins the direction (matches on rails and road support every position along it alike),
    so ``min_inliers`` does not apply and the slide test always does. ``min_constraint`` still does:
    below it even the truth is not trusted (without it, two held-out tunnel pairs were trusted
    11-14 m off, one turned around, their structure peaking 0.45 m from where they had landed)."""
    nearest = nearest_voxels(src.xyz, T, tgt.spatial_index(), cfg.inlier_distance)
    n_inl, inl_mask, fitness, fitness_fine = verify(src.xyz, tgt.xyz, pairs, T, cfg.inlier_distance, nearest=nearest)
    # Left perturbations in the target's local frame -> its input frame: Ad of Tr(origin).
    Ad = geometry.adjoint(geometry.shift_transform(np.eye(4), np.zeros(3), tgt.origin))
    rows = point_to_plane_rows(src.xyz, tgt, T, cfg, nearest)
    covariance = Ad @ alignment_covariance(src.xyz, tgt, T, cfg, rows) @ Ad.T
    degeneracy = alignment_degeneracy(tgt, cfg, rows)  # directions: the same in the input frame
    success, structure_fit, carried_by = False, None, BY_FIT
    if not message:
        backed = structure and cfg.max_free_space > 0  # the free-space test judges it after
        message, structure_fit, carried_by = support_doubt(src, tgt, T, n_inl, fitness, cfg,
                                                           require_inliers and not slid, degeneracy,
                                                           free_space_backed=backed)
        success = not message
    if success and degeneracy.eigenvalue < cfg.min_constraint:
        success = False
        message = (f"degenerate: the geometry hardly constrains {degeneracy.describe()} (weakest constraint "
                   f"{degeneracy.eigenvalue:.4f}, need {cfg.min_constraint:g}: tunnel, corridor or open field?)")
    slide = None
    if success and (degeneracy.eigenvalue < cfg.weak_constraint or slid):
        slide = slide_of(src, tgt, T, degeneracy, cfg)
        message = slide_refusal(slide, degeneracy, cfg)
        success = not message
    transform = geometry.shift_transform(T, src.origin, tgt.origin)  # input frames
    rest = False
    if success and structure:
        message = rest_doubt(src, tgt, transform, slide, degeneracy, cfg)
        rest, success = bool(message), not message
    if success and structure:
        message, structure_fit, grey_carried_by = structure_doubt(src, tgt, T, transform, fitness, cfg, slide,
                                                                  degeneracy, structure_fit, n_inl)
        carried_by = BY_MATCHES if BY_MATCHES in (carried_by, grey_carried_by) else carried_by
        success = not message
    seen_through = None
    if success and structure and cfg.max_free_space > 0:
        seen_through = seen_through_of(src, tgt, T, cfg)
        message = free_space_refusal(seen_through, cfg, carried_by)
        success = not message
    return Verdict(transform=transform, success=bool(success), message=message, num_inliers=int(n_inl),
                   inlier_mask=inl_mask, fitness=float(fitness), fitness_fine=float(fitness_fine),
                   covariance=covariance, degeneracy=degeneracy, slide=slide, structure_fit=structure_fit,
                   rest_unconfirmed=rest, free_space=seen_through)
