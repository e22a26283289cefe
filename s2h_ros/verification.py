"""What a registration result is judged by (no ROS): its inlier matches and fitness, the
structure off the ground it aligns, the free space of the target's view, its sideways-shifted
copies, the point-to-plane terms at it (weakest direction, covariance) and the slide evidence
along that direction. :mod:`s2h_ros.trust` decides ``success`` from these.

Every function works on the clouds' local frames (``PreparedCloud.xyz``, relative to ``origin``).
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from s2h_ros import geometry
from s2h_ros.cloud import PreparedCloud
from s2h_ros.config import RegistrationConfig, cpu_workers
from s2h_ros.degeneracy import MIN_SLIDE_FIT, MIN_SLIDE_STRUCTURES, Degeneracy, SlideEvidence, slide_evidence, weakest_direction
from s2h_ros.free_space import FreeSpace, free_space
from s2h_ros.repetition import Repetition, repetition

# The surfaces (``surface_fit``) count a source voxel within this many voxel sizes of the plane of
# its nearest target voxel (the tilt restarts' score, ``pipeline.RESTART_GAIN``).
SURFACE_TOLERANCE = 1.0 / 6.0


class NearestVoxels(NamedTuple):
    """Each source voxel moved by a transform and its nearest target voxel within a bound
    (:func:`nearest_voxels`): one search that :func:`verify` and :func:`point_to_plane_rows` share."""

    moved: np.ndarray  # (M, 3) float64 source voxels in the target's local frame
    distance: np.ndarray  # (M,) to the nearest target voxel, inf beyond the bound
    index: np.ndarray  # (M,) int64 index of that voxel (the target's voxel count beyond the bound)


def nearest_voxels(src: np.ndarray, T: np.ndarray, index, bound: float) -> NearestVoxels:
    """``src`` (M, 3) moved by ``T`` (4, 4) and each one's nearest voxel within ``bound`` in the
    target's spatial ``index`` (``PreparedCloud.spatial_index``, or a cKDTree of its voxels)."""
    moved = geometry.apply_transform(T, src.astype(np.float64))
    distance, idx = index.query(moved, distance_upper_bound=bound, workers=cpu_workers())
    return NearestVoxels(moved, distance, idx)


def verify(
    src: np.ndarray, tgt: np.ndarray, pairs: np.ndarray, T: np.ndarray, dist: float, tgt_tree=None,
    nearest: NearestVoxels | None = None,
) -> tuple[int, np.ndarray, float, float]:
    """Inlier correspondences, their mask, the cloud fitness of ``T`` (fraction of source voxels
    with a target voxel within ``dist``) and the same within ``dist / 2`` (``tgt_tree``: the
    target's spatial index when one exists, ``PreparedCloud.spatial_index``; ``nearest``: the
    source's nearest target voxels within ``dist`` when already searched)."""
    from scipy.spatial import cKDTree

    if nearest is None:
        nearest = nearest_voxels(src, T, tgt_tree if tgt_tree is not None else cKDTree(tgt), dist)
    if len(pairs):
        mask = np.linalg.norm(nearest.moved[pairs[:, 0]] - tgt[pairs[:, 1]], axis=1) < dist
    else:
        mask = np.zeros(0, bool)
    nn_dist = nearest.distance
    return int(mask.sum()), mask, float(np.mean(nn_dist < dist)), float(np.mean(nn_dist < dist / 2))


def screen_inlier_estimate(src: np.ndarray, tgt: np.ndarray, pairs: np.ndarray, T: np.ndarray, dist: float,
                           matched: int) -> float:
    """Inlier matches a hypothesis of all ``src`` (M, 3) voxels would have, estimated from ``pairs``
    (P, 2) of ``matched`` of them (a random subset) under its unrefined (4, 4) ``T``: the subset's
    inlier matches (within ``dist``) times M / ``matched`` (``Registrar._screened_out``)."""
    if not len(pairs):
        return 0.0
    inliers = int(geometry.correspondence_inlier_mask(src, tgt, pairs[:, 0], pairs[:, 1], T, dist).sum())
    return inliers * len(src) / max(matched, 1)


def fraction_text(fraction: float | None) -> str:
    """A fraction for a message, "-" where it was not measured (too few voxels)."""
    return "-" if fraction is None else f"{fraction:.2f}"


def mutual_fitness(src: PreparedCloud, tgt: PreparedCloud, T: np.ndarray, cfg: RegistrationConfig,
                   fitness: float) -> float:
    """The larger of ``fitness`` (the source's voxels within ``inlier_distance`` of the target's
    after ``T``, local frames) and the same of the target's voxels against the source moved by
    ``T``: the overlap seen from the cloud that the other covers better (``trust.support_doubt``)."""
    back = nearest_voxels(tgt.xyz, np.linalg.inv(T), src.spatial_index(), cfg.inlier_distance)
    return max(fitness, float(np.mean(back.distance < cfg.inlier_distance)))


# Fewer off-ground voxels than this: structure_fitness says nothing (an open field; the degeneracy
# test judges such scenes).
MIN_STRUCTURE_VOXELS = 100


def structure_fitness(src: PreparedCloud, tgt: PreparedCloud, T: np.ndarray, cfg: RegistrationConfig) -> float | None:
    """The fitness of ``T`` counted over the source voxels off the ground: those whose normal is
    not within about 25 deg of z (z up, REP-103). None when fewer than ``MIN_STRUCTURE_VOXELS``.

    A scan's ground is a pattern the sensor draws around itself (rings of a spinning lidar, the
    rosette of a Livox), the same in every scan, so a wrong result at zero motion aligns it and can
    reach ``min_fitness`` on the ground alone (held-out Livox pair 15.6 m apart: fitness 0.51,
    off the ground 0.38). So it is asked where the fitness cannot tell: at zero motion, below
    ``weak_constraint`` (``trust.structure_doubt``) and below ``min_fitness``
    (``low_fitness_floor``); off the ground, right results of moving sensors ranged 0.43-0.75 (one
    HDL-64 pair 0.43 at fitness 0.51: a threshold on every result would have refused it), a scan
    against itself 1.0."""
    structure, moved = moved_off_ground(src, T, cfg)
    if int(structure.sum()) < MIN_STRUCTURE_VOXELS:
        return None
    dist, _ = tgt.spatial_index().query(moved, distance_upper_bound=cfg.inlier_distance, workers=cpu_workers())
    return float(np.mean(dist < cfg.inlier_distance))


def seen_through_of(src: PreparedCloud, tgt: PreparedCloud, T: np.ndarray, cfg: RegistrationConfig) -> FreeSpace:
    """Where ``T`` (local frames) lays the source's voxels off the ground (``off_ground``: the
    ground's rings lie on the target's ground at grazing angles, where a few centimetres of height
    are metres along the ray) against the target sensor's view (``s2h_ros.free_space``)."""
    _, moved = moved_off_ground(src, T, cfg)
    return free_space(moved + tgt.origin, tgt.range_image(), cfg.inlier_distance)  # the target's input frame


# What carried a global search's result before the free-space test (``trust.Support.carried_by``);
# it sets how strict the test is (:func:`free_space_refusal`).
BY_FIT, BY_STRUCTURE_BACK, BY_MATCHES = "fit", "structure back", "matches"


def free_space_refusal(seen: FreeSpace, cfg: RegistrationConfig, carried_by: str = BY_FIT) -> str:
    """The refusal message of a result that lays more of its seen structure where the target's
    sensor saw through than what carried it allows ("" when it does not). Fewer than
    ``MIN_STRUCTURE_VOXELS`` seen say nothing: passed, unless the matches carried it.

    ``carried_by``: ``BY_FIT`` (its fitness, or its own structure off the ground in the low-fitness
    band): ``max_free_space``. ``BY_STRUCTURE_BACK`` (in the band, only the target's structure fits
    the source, ``trust.support_doubt``): at most ``back_free_space``. ``BY_MATCHES`` (its structure
    does not fit either way and many matches stand in, ``trust.matches_suffice``,
    ``trust.grey_matches_suffice``): this test is what supports it, at most
    ``low_fitness_free_space``, and too little seen refuses it."""
    limit = cfg.max_free_space
    if carried_by == BY_MATCHES:
        limit = min(limit, cfg.low_fitness_free_space)
    elif carried_by == BY_STRUCTURE_BACK:
        limit = min(limit, cfg.back_free_space)
    if seen.seen < MIN_STRUCTURE_VOXELS and carried_by == BY_MATCHES:
        return (f"not trusted: only {seen.seen} voxels off the ground lie in the target sensor's view (need "
                f"{MIN_STRUCTURE_VOXELS} for the free-space test to carry a result on its matches)")
    if seen.seen < MIN_STRUCTURE_VOXELS or seen.through <= limit:
        return ""
    return (f"not trusted: {seen.through:.2f} of the {seen.seen} voxels off the ground that it lays in the target "
            f"sensor's view lie where that sensor saw through them (need at most {limit:.2f}): "
            "the scene does not fit")


def off_ground(cloud: PreparedCloud, cfg: RegistrationConfig) -> np.ndarray:
    """``(N,)`` bool: the voxels of ``cloud`` whose normal is not within about 25 deg of up (z,
    REP-103, or a levelled cloud's ground up, ``PreparedCloud.up``): the scene's structure, not the
    ground the sensor draws its pattern on."""
    return np.abs(cloud.normals(cfg.voxel_size) @ cloud.up()) < 0.9


def moved_off_ground(src: PreparedCloud, T: np.ndarray, cfg: RegistrationConfig) -> tuple[np.ndarray, np.ndarray]:
    """``off_ground(src)`` ``(N,)`` bool and those voxels moved by ``T`` (local frames) into the
    target's local frame, ``(K, 3)`` float64: what the tests of a result's structure ask."""
    structure = off_ground(src, cfg)
    return structure, geometry.apply_transform(T, src.xyz[structure].astype(np.float64))


# A repeated structure's copies are looked for this many inlier distances sideways: from just
# beyond the result's own peak (0.5 m at the indoor 0.1 m) to a few periods of a pallet-rack bay
# (2.4-2.9 m) or a row of racks with its aisle (about 4-4.7 m) indoors (5 m), 30 m outdoors; and,
# for a result the geometry leaves nearly free along one direction (``result_repetition``'s
# ``far``), to 72 m outdoors, beyond a highway's lamp spacing (30-70 m): a held-out OS1-32 highway
# scan (world 634) was trusted one lamp period (47.8 m) from the truth, its copy at the truth
# outside the 30 m (docs/reliability.md, "A copy one lamp period along a highway"). Each square
# beyond the first ranks its own peaks: the wider square's many must not crowd out nearer copies.
REPETITION_SHIFT_DISTANCES = (5.0, 50.0, 120.0)  # from, then the radii searched


def result_repetition(src: PreparedCloud, tgt: PreparedCloud, T: np.ndarray, cfg: RegistrationConfig,
                      far: bool = False) -> Repetition:
    """The strongest sideways-shifted copy of the result ``T`` (local frames): the source's voxels
    off the ground, with their normals, against the whole target, on a grid of ``inlier_distance``
    (:func:`s2h_ros.repetition.repetition`), shifted along the target's ground: in its levelled frame
    when its features were levelled (a tilted sensor's x, y would lift a slide out of the plane).
    Within the first of ``REPETITION_SHIFT_DISTANCES``' radii, and with ``far`` within the others
    too: the caller asks that where the geometry leaves a direction nearly free (a result whose
    weakest constraint is below ``weak_constraint``, as along a highway), since a copy tens of metres
    away is a slide along a road; elsewhere a narrow view sharing little of the scene fits a far
    copy better only because it shares so little (a Livox target's right result in a town, weakest
    constraint 0.076, had a copy 51 m along the street at 1.67 times its fit).
    With the free-space test on (``max_free_space``) a copy counts only where it would pass that
    test itself: one that lays more of the scan's structure where the target's rays passed is not
    a pose the data support (``Repetition.set_aside`` counts the copies passed over)."""
    lo, *radii = REPETITION_SHIFT_DISTANCES
    d = cfg.inlier_distance
    within = tuple(r * d for r in (radii if far else radii[:1]))
    structure, moved = moved_off_ground(src, T, cfg)
    aligned = tgt.feature_frame(moved)
    normals = tgt.feature_frame(src.normals(cfg.voxel_size)[structure] @ T[:3, :3].T)
    to_local = np.eye(3) if tgt.level is None else tgt.level  # a shift in the frame the test runs in -> local

    def admissible(shift: np.ndarray) -> bool:
        copy = np.array(T, np.float64, copy=True)
        copy[:3, 3] += shift @ to_local
        return not free_space_refusal(seen_through_of(src, tgt, copy, cfg), cfg)

    check = admissible if cfg.max_free_space > 0 else None
    if tgt.level is None:
        return repetition(aligned, normals, tgt.xyz.astype(np.float64), d, lo * d, within,
                          tree=tgt.spatial_index(), admissible=check)
    # A levelled keyframe: shifts along its ground, not its tilted x, y; the copy's shift back in its frame.
    found = repetition(aligned, normals, tgt.feature_frame_xyz(), d, lo * d, within, admissible=check)
    return dataclasses.replace(found, shift=found.shift @ tgt.level)


def levelled_transform(src: PreparedCloud, tgt: PreparedCloud, T: np.ndarray) -> np.ndarray:
    """``(4, 4)`` the result ``T`` (source -> target, local frames) between the two clouds as their
    features saw them (``PreparedCloud.feature_frame_xyz``: each levelled onto its own up, or as given)."""
    out = np.array(T, np.float64, copy=True)
    if src.level is not None:
        out[:3, :3] = out[:3, :3] @ src.level.T
    if tgt.level is not None:
        out[:3, :] = tgt.level @ out[:3, :]
    return out


class PlaneRows(NamedTuple):
    """The point-to-plane terms at a transform (:func:`point_to_plane_rows`), one row per matched
    source voxel."""

    points: np.ndarray  # (m, 3) moved source voxels p, target local frame
    normals: np.ndarray  # (m, 3) unit normal n of the nearest target voxel q
    residuals: np.ndarray  # (m,) r = n . (p - q)
    target_index: np.ndarray  # (m,) int64 index of q in the target's voxels


def slide_of(src: PreparedCloud, tgt: PreparedCloud, T: np.ndarray, degeneracy: Degeneracy,
              cfg: RegistrationConfig) -> SlideEvidence:
    """The slide evidence (:func:`s2h_ros.degeneracy.slide_evidence`) of ``T`` (local frames) along
    the weakest direction of ``degeneracy``, judged in the clouds' feature frames: "above the
    ground" and "in plan" against each cloud's levelled up."""
    return slide_evidence(src.feature_frame_xyz(), tgt.feature_frame_xyz(), levelled_transform(src, tgt, T),
                          tgt.feature_frame(degeneracy.direction[:3]), cfg.inlier_distance)


def slide_refusal(slide: SlideEvidence, degeneracy: Degeneracy, cfg: RegistrationConfig) -> str:
    """Why a result in the grey zone of the constraint measure (below ``weak_constraint``) is not
    trusted: nothing would show a slide, or the structure that would fits clearly better elsewhere
    along the weakest direction, or hardly fits where the result is; "" when it fits there best."""
    weak = f"weakest constraint {degeneracy.eigenvalue:.4f} < {cfg.weak_constraint:g}"
    if slide.structures < MIN_SLIDE_STRUCTURES:
        return (f"degenerate: only {slide.structures} voxels of structure would show a {degeneracy.describe()} "
                f"(need {MIN_SLIDE_STRUCTURES}; {weak})")
    if slide.gain >= cfg.slide_margin:
        view = "in plan" if slide.in_plan else "in 3-D"
        return (f"degenerate: a slide along the weakest direction, {degeneracy.describe()}? the {slide.structures} "
                f"voxels of structure that would show one (poles, signs, ends of walls) fit the keyframe's "
                f"{slide.best:.0%} at {slide.shift:+.1f} m along it, {slide.at_result:.0%} at the result ({view}; {weak})")
    if slide.fits < MIN_SLIDE_FIT:
        return (f"degenerate: of the {slide.structures} voxels of structure that would show a slide along the weakest "
                f"direction, {degeneracy.describe()} (poles, signs, ends of walls), {slide.fits:.0%} fit the keyframe's "
                f"at the result (need {MIN_SLIDE_FIT:.0%}; {weak})")
    return ""


def point_to_plane_rows(src: np.ndarray, target: PreparedCloud, T: np.ndarray, cfg: RegistrationConfig,
                        nearest: NearestVoxels | None = None) -> PlaneRows:
    """The point-to-plane terms at ``T``: each source voxel with a target voxel within
    ``inlier_distance`` gives a row (:class:`PlaneRows`; ``nearest``: that search, when done)."""
    if nearest is None:
        nearest = nearest_voxels(src, T, target.spatial_index(), cfg.inlier_distance)
    ok = np.isfinite(nearest.distance)
    p, q = nearest.moved[ok], nearest.index[ok]
    n = target.normals(cfg.voxel_size)[q]
    return PlaneRows(p, n, np.einsum("ij,ij->i", n, p - target.xyz[q]), q)


def alignment_degeneracy(target: PreparedCloud, cfg: RegistrationConfig, rows: PlaneRows) -> Degeneracy:
    """The weakest direction (:func:`s2h_ros.degeneracy.weakest_direction`) of the point-to-plane
    ``rows`` against ``target``, each row weighted by the planarity of its target voxel's
    neighbourhood (only surfaces count: s2h_ros.degeneracy)."""
    if len(rows.points) == 0:
        return weakest_direction(rows.points, rows.normals)
    return weakest_direction(rows.points, rows.normals, target.planarity(cfg.voxel_size)[rows.target_index])


def alignment_covariance(src: np.ndarray, target: PreparedCloud, T: np.ndarray, cfg: RegistrationConfig,
                         rows: PlaneRows | None = None) -> np.ndarray:
    """``(6, 6)`` covariance of ``T`` from the point-to-plane normal equations at the result.

    Each source voxel with a target voxel within ``inlier_distance`` gives a residual
    ``r = n . (T p - q)`` and, for a left perturbation ``exp(xi) T`` with xi = [rho, phi],
    the Jacobian row ``[n, (T p) x n]``. With ``H = J^T J`` and the residual variance
    ``s2 = sum r^2 / (m - 6)`` the covariance is ``s2 H^-1`` (Gauss-Newton); directions the
    geometry does not constrain (``H`` eigenvalues below 1e-9 of the largest) get the variance
    of that floor, not infinity, so the matrix stays finite and symmetric. ``s2`` is small on
    clean data whatever the geometry: whether a direction is constrained at all is
    :func:`s2h_ros.degeneracy.weakest_direction`'s question. ``rows``: :func:`point_to_plane_rows`
    when already computed.
    """
    p, n, r, _ = rows if rows is not None else point_to_plane_rows(src, target, T, cfg)
    if len(r) < 7:
        return np.diag([1e6] * 6)
    J = np.hstack([n, np.cross(p, n)])
    lam, V = np.linalg.eigh(J.T @ J)
    lam = np.maximum(lam, 1e-9 * max(float(lam[-1]), 1e-12))
    s2 = float(r @ r) / (len(r) - 6)
    return (V * (s2 / lam)) @ V.T


def surface_fit(src_xyz: np.ndarray, target: PreparedCloud, T: np.ndarray, cfg: RegistrationConfig) -> float:
    """The fraction of the ``(N, 3)`` source voxels (local frame) that ``T`` (4, 4, local frames) lays
    on the target's surfaces: their point-to-plane residual (``point_to_plane_rows``) against their
    nearest target voxel within two voxels (ICP's correspondence distance) below
    ``SURFACE_TOLERANCE`` voxels."""
    nearest = nearest_voxels(src_xyz, T, target.spatial_index(), 2.0 * cfg.voxel_size)
    rows = point_to_plane_rows(src_xyz, target, T, cfg, nearest)
    return float((np.abs(rows.residuals) < SURFACE_TOLERANCE * cfg.voxel_size).sum() / max(len(src_xyz), 1))
