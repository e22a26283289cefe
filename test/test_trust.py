"""The success test (s2h_ros.trust): the low-fitness band, few matches carried by structure, many
matches carried by free space (views that overlap little: the real pair cut to two sectors; results
in the grey zone of the constraint measure), the verdict on a real scan pair at its registered pose
and moved off it, and the zero-motion rule of a global search."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from s2h_ros import geometry, trust
from s2h_ros.config import RegistrationConfig
from s2h_ros.degeneracy import Degeneracy
from s2h_ros.free_space import FreeSpace
from s2h_ros.pipeline import Registrar
from s2h_ros.verification import BY_FIT, BY_MATCHES, BY_STRUCTURE_BACK, MIN_STRUCTURE_VOXELS, free_space_refusal

RAW = Path(__file__).resolve().parents[2] / "shared" / "data" / "kitti" / "raw_00"


def weakest(eigenvalue: float) -> Degeneracy:
    """A constraint measure whose weakest direction is x, at ``eigenvalue``."""
    return Degeneracy(eigenvalue, np.eye(6)[0], np.full(3, eigenvalue), 1000)


@pytest.fixture(scope="module")
def raw_scans() -> list[np.ndarray]:
    """RAW KITTI 00 frames 1 and 0 (real HDL-64E), (N, 3) float32 each: source, target."""
    return [np.fromfile(RAW / f"00000{i}.bin", np.float32).reshape(-1, 3) for i in (1, 0)]


@pytest.fixture(scope="module")
def real_pair(raw_scans):
    """RAW KITTI 00 frames 1 -> 0 (real HDL-64E, 0.68 m apart) prepared and registered with the
    defaults: the registrar, the clouds and the result between their local frames."""
    reg = Registrar(RegistrationConfig())
    src, tgt = (reg.prepare(s) for s in raw_scans)
    result = reg.register(src, tgt)
    assert result.success, result.message
    return reg, src, tgt, result, geometry.shift_transform(result.transform, -src.origin, -tgt.origin)


def test_the_structure_off_the_ground_is_asked_only_between_the_floor_and_min_fitness():
    cfg = RegistrationConfig()
    assert trust.low_fitness(cfg.low_fitness_floor, cfg) and trust.low_fitness(cfg.min_fitness - 0.01, cfg)
    assert not trust.low_fitness(cfg.low_fitness_floor - 0.01, cfg) and not trust.low_fitness(cfg.min_fitness, cfg)
    assert not trust.low_fitness(0.4, cfg.replace(low_fitness_floor=0.0))  # off
    assert not trust.low_fitness(0.55, cfg.replace(low_fitness_floor=0.6))  # a floor above min_fitness: off
    # the overlap, when measured both ways, opens the band; the fitness still has to lie in it
    assert trust.low_fitness(cfg.low_fitness_floor - 0.1, cfg, overlap=cfg.min_fitness)


def test_few_matches_suffice_only_above_the_floor_at_min_fitness_clear_of_the_grey_zone():
    cfg = RegistrationConfig()
    clear = weakest(cfg.weak_constraint)
    assert trust.few_inliers_suffice(cfg.few_inliers_floor, cfg.min_fitness, clear, cfg)
    assert not trust.few_inliers_suffice(cfg.few_inliers_floor - 1, cfg.min_fitness, clear, cfg)
    assert not trust.few_inliers_suffice(cfg.few_inliers_floor, cfg.min_fitness - 0.01, clear, cfg)
    assert not trust.few_inliers_suffice(cfg.few_inliers_floor, cfg.min_fitness, weakest(cfg.weak_constraint * 0.9), cfg)
    assert not trust.few_inliers_suffice(cfg.min_inliers, cfg.min_fitness, clear, cfg)  # enough: not "few"
    assert not trust.few_inliers_suffice(20, 0.8, clear, cfg.replace(few_inliers_floor=0))  # off


def test_the_verdict_at_the_registered_pose_is_the_pipelines_and_trusts_it(real_pair):
    reg, src, tgt, result, local = real_pair
    verdict = trust.judge(src, tgt, local, result.correspondences, reg.config, structure=True)
    assert verdict.success and verdict.message == ""
    assert verdict.num_inliers == result.num_inliers and verdict.fitness == pytest.approx(result.fitness)
    np.testing.assert_allclose(verdict.transform, result.transform, atol=1e-9)
    assert verdict.degeneracy.eigenvalue >= reg.config.weak_constraint and verdict.slide is None
    assert verdict.free_space is not None and verdict.free_space.through <= reg.config.max_free_space
    assert verdict.covariance.shape == (6, 6) and np.all(np.linalg.eigvalsh(verdict.covariance) > 0)


def test_the_same_scans_moved_across_the_street_are_refused_with_the_reason(real_pair):
    reg, src, tgt, result, local = real_pair
    moved = geometry.make_transform(np.eye(3), np.array([0.0, 3.0, 0.0])) @ local
    verdict = trust.judge(src, tgt, moved, result.correspondences, reg.config, structure=True)
    assert not verdict.success and verdict.message.startswith("not trusted: ")
    assert verdict.num_inliers < reg.config.min_inliers and verdict.fitness < result.fitness


def test_a_refusal_decided_before_is_kept_and_the_transform_still_measured(real_pair):
    reg, src, tgt, result, local = real_pair
    verdict = trust.judge(src, tgt, local, result.correspondences, reg.config, message="ambiguous: a rival")
    assert not verdict.success and verdict.message == "ambiguous: a rival"
    assert verdict.num_inliers == result.num_inliers and verdict.fitness >= reg.config.min_fitness


def test_a_global_result_at_zero_motion_in_the_grey_zone_is_not_trusted_without_a_prior(real_pair):
    reg, src, tgt, _, _ = real_pair
    cfg = reg.config
    grey = weakest(cfg.weak_constraint / 2)
    slide = object()  # the slide test was asked: the grey zone (its evidence is not read here)
    message = trust.rest_doubt(src, tgt, np.eye(4), slide, grey, cfg)
    assert message.startswith("not trusted: zero motion (0.00 m)") and "cannot tell rest from a slide" in message
    assert trust.rest_doubt(src, tgt, np.eye(4), None, grey, cfg) == ""  # clear of the grey zone
    away = geometry.make_transform(np.eye(3), np.array([2 * cfg.inlier_distance, 0.0, 0.0]))
    assert trust.rest_doubt(src, tgt, away, slide, grey, cfg) == ""  # it moved


def test_many_matches_carry_a_low_fitness_band_result_only_with_the_stricter_free_space_test():
    cfg = RegistrationConfig().replace(low_fitness_inliers=100)
    assert trust.matches_suffice(100, 0.35, 0.35, cfg)
    assert not trust.matches_suffice(99, 0.35, 0.35, cfg)  # too few matches
    assert not trust.matches_suffice(500, 0.25, 0.25, cfg)  # below the band's floor either way
    assert trust.matches_suffice(500, 0.25, 0.45, cfg)  # the better way opens the band
    assert not trust.matches_suffice(500, 0.55, 0.55, cfg)  # above the band: min_fitness decides
    assert not trust.matches_suffice(500, 0.35, 0.35, cfg.replace(low_fitness_inliers=0))  # off


def test_many_matches_stand_in_for_the_structure_in_the_grey_zone_only_away_from_zero_motion(real_pair):
    reg, src, tgt, _, _ = real_pair
    cfg = reg.config.replace(grey_zone_inliers=100)
    grey, slide = weakest(cfg.weak_constraint / 2), object()  # the slide test was asked (its evidence is not read)
    away = geometry.make_transform(np.eye(3), np.array([3.0, 0.0, 0.0]))
    poor = cfg.min_structure_fitness - 0.1  # the structure off the ground does not fit

    def doubt(transform: np.ndarray, n_inl: int, config: RegistrationConfig = cfg, fit: float = poor) -> trust.Support:
        return trust.structure_doubt(src, tgt, transform, transform, 0.45, config, slide, grey, fit, n_inl)

    assert doubt(away, 100) == trust.Support("", poor, BY_MATCHES)  # the free-space test decides, stricter
    refused = doubt(away, 99)
    assert refused.message.startswith("not trusted: the geometry hardly constrains") and refused.carried_by == BY_FIT
    assert doubt(np.eye(4), 500).message.startswith("not trusted: zero motion")  # rest: the sensor's pattern
    assert doubt(away, 500, cfg.replace(grey_zone_inliers=0)).message  # off
    assert doubt(away, 0, fit=cfg.min_structure_fitness) == trust.Support("", cfg.min_structure_fitness)  # it fits
    assert not trust.grey_matches_suffice(10_000, RegistrationConfig(grey_zone_inliers=0))


def test_a_free_space_test_is_stricter_and_must_see_enough_where_it_carries_the_result():
    cfg = RegistrationConfig()
    few = FreeSpace(through=0.0, seen=MIN_STRUCTURE_VOXELS - 1)
    assert free_space_refusal(few, cfg) == ""
    assert free_space_refusal(few, cfg, BY_MATCHES).startswith("not trusted: only ")
    assert free_space_refusal(few, cfg, BY_STRUCTURE_BACK) == ""  # the structure carries it: too few seen say nothing
    some = FreeSpace(through=0.02, seen=5000)  # between low_fitness_free_space (0.01) and max_free_space (0.08)
    assert free_space_refusal(some, cfg) == ""
    assert free_space_refusal(some, cfg, BY_MATCHES).startswith("not trusted: 0.02 of the 5000 voxels")
    assert free_space_refusal(some, cfg.replace(back_free_space=0.015), BY_STRUCTURE_BACK).endswith("the scene does not fit")
    assert free_space_refusal(some, cfg.replace(back_free_space=0.5), BY_STRUCTURE_BACK) == ""  # max_free_space still applies
    assert free_space_refusal(FreeSpace(through=0.1, seen=5000), cfg.replace(back_free_space=0.5), BY_STRUCTURE_BACK)
    assert free_space_refusal(FreeSpace(through=0.1, seen=5000), cfg).endswith("the scene does not fit")


def sector(xyz: np.ndarray, low_deg: float, high_deg: float) -> np.ndarray:
    """The points of ``xyz`` (N, 3) whose azimuth lies in [low_deg, high_deg)."""
    azimuth = np.degrees(np.arctan2(xyz[:, 1], xyz[:, 0]))
    return xyz[(azimuth >= low_deg) & (azimuth < high_deg)]


@pytest.fixture(scope="module")
def sectors(real_pair, raw_scans):
    """The real pair cut to two 100 deg views sharing 20 deg (source -90..10, target -10..90):
    views that overlap little, both ways, as depth cameras at 30-60 % overlap do. Their matches:
    every source voxel with a target voxel within the inlier distance at the registered pose."""
    from scipy.spatial import cKDTree

    reg, _, _, result, _ = real_pair
    source, target = raw_scans
    src, tgt = reg.prepare(sector(source, -90, 10)), reg.prepare(sector(target, -10, 90))
    local = geometry.shift_transform(result.transform, -src.origin, -tgt.origin)

    def matches(T: np.ndarray) -> np.ndarray:
        distance, j = cKDTree(tgt.xyz).query(geometry.apply_transform(T, src.xyz),
                                             distance_upper_bound=reg.config.inlier_distance)
        near = np.isfinite(distance)
        return np.stack([np.nonzero(near)[0], j[near]], 1)

    return reg.config, src, tgt, local, matches


def test_views_that_overlap_little_are_trusted_on_many_matches_where_the_target_saw_nothing_through(sectors):
    on, src, tgt, local, matches = sectors  # the defaults: the rule on
    at_truth = matches(local)
    verdict = trust.judge(src, tgt, local, at_truth, on, structure=True)
    assert on.low_fitness_floor <= verdict.fitness < on.min_fitness  # the band
    assert verdict.structure_fit < on.low_fitness_structure  # the structure alone does not carry it
    assert verdict.success, verdict.message
    assert verdict.num_inliers >= on.low_fitness_inliers
    assert verdict.free_space.through <= on.low_fitness_free_space
    off = trust.judge(src, tgt, local, at_truth, on.replace(low_fitness_inliers=0), structure=True)
    assert not off.success and off.message.startswith(f"not trusted: {off.num_inliers} inlier correspondences")
    strict = trust.judge(src, tgt, local, at_truth, on.replace(low_fitness_free_space=0.0), structure=True)
    assert not strict.success and "saw through them (need at most 0.00)" in strict.message
    # a tracking result (no free-space test behind it) is not carried by its matches
    assert not trust.judge(src, tgt, local, at_truth, on, structure=False).success


@pytest.mark.parametrize("move", ["3 m across", "turned 20 deg"])
def test_views_that_overlap_little_moved_off_the_truth_stay_refused_whatever_their_matches(sectors, move):
    cfg, src, tgt, local, matches = sectors
    off = (geometry.make_transform(np.eye(3), np.array([0.0, 3.0, 0.0])) if move == "3 m across"
           else geometry.yaw_transform(20.0))
    wrong = off @ local
    verdict = trust.judge(src, tgt, wrong, matches(wrong), cfg, structure=True)
    assert verdict.num_inliers >= cfg.low_fitness_inliers > 0  # its own matches would carry it
    assert not verdict.success and verdict.message
