"""Repetition: does a shifted copy of a registration's result explain the scene as well?

Warehouses repeat: pallet-rack bays every 2.4-2.9 m, rows of racks, columns on a grid; so do
colonnades, cubicles and rows of parked cars. A camera that sees a few bays of a rack row sees
the same picture one bay further on, so the features match one bay off as readily as at the truth,
RANSAC and ICP settle on either, and the fitness, the inlier count and the degeneracy test cannot
tell them apart (held-out depth-camera warehouse: two results one bay off, 2.55 m, trusted at
fitness 0.59). What does tell is the scene itself: if the aligned source, moved sideways by some
``d``, lands on the target's structure about as well as where the result put it, the data
support both poses and neither can be trusted.

The test has two steps. First the horizontal cross-correlation of the aligned source with the
target: over voxel cells of size ``cell`` (the inlier distance), ``C(d)`` counts the source points
off the ground (the ground fits under any horizontal shift) that land in an occupied cell of the
target (dilated by one cell) when shifted by ``d`` in x and y; ``C(0) / N`` is about the
off-ground fitness of the result. Its highest local maxima at least ``min_shift`` from 0 and
inside the searched square (a maximum on the square's border is a slope that goes on outside it,
not a peak) are the candidate copies. Second, each candidate is settled (a few point-to-point
steps in x and y, as ICP settles the result) and weighed by direction: a wall along the shift
lands on itself whatever the shift, so each point counts by ``(n . d)^2``, its normal against the
shift's direction, the share of the point-to-plane constraint along ``d`` it carries. The
**repetition** of the result is the highest ratio of that weighted fit after the shift to the
weighted fit at the result: measured on development worlds (never used for evaluation) 0.3-0.8
for right results in rooms, offices, warehouses and streets, about 1 or more where the result
sits one period from the truth (a copy that fits at least as well). Slides along a corridor make
a ridge, not a peak; the degeneracy test (``s2h_ros.degeneracy``) judges those.

A copy counts only where the data allow it (``admissible``; the pipeline asks the target
sensor's free space, ``s2h_ros.free_space``): a copy that lays the scan's structure where the
target's rays passed is not a second pose the data support, however well its surfaces land. A
narrow view (a Livox rosette, 70 deg) that shares a fifth of its scene with the target leaves
most of its structure where the target saw nothing, so a copy 15-25 m along a street can land
as much of it on the target's facades as the result does (right results refused at 0.9-1.6); on
development worlds the strongest copies of right results laid 0-64 % of it in the target's
seen-through space (those that refused them 6, 14 and 16 %), the results themselves 0-4 %. The
copy one rack bay on in a warehouse, or the truth beside a wrong result, lays next to none there.

Why by hand: the correlation is SciPy's FFT (``scipy.fft.rfft2`` over the two horizontal axes,
summed over the z layers) and the distances SciPy's k-d tree; what is written here is the
gridding, the peak rule and the weighting, which no library offers for this question.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from s2h_ros.config import cpu_workers
from s2h_ros.geometry import fixed_subset


@dataclass
class Repetition:
    """The strongest shifted copy of a result (see the module text)."""

    ratio: float  # weighted fit of the copy / at the result: 0 when no copy counts, about 1 or more when it fits
    # as well, infinite when the copy lands structure along its shift and the result none
    shift: np.ndarray  # (3,) float64 metres, d* in the target frame (zeros when no peak); horizontal in the
    # frame the test ran in (the target's own, or its levelled one: s2h_ros.verification.result_repetition)
    fit: float  # C(0) / N: off-ground points within about one cell at the result
    set_aside: int = 0  # stronger copies passed over because the data contradict them (``admissible``)

    def describe(self) -> str:
        return f"({self.shift[0]:+.2f}, {self.shift[1]:+.2f}, {self.shift[2]:+.2f}) m"

    def refusal(self, max_repetition: float) -> str:
        """Why a result whose copy fits as well (``ratio >= max_repetition``) is not trusted."""
        how = (f"{self.ratio:.2f} times as well as where it is" if math.isfinite(self.ratio) else
               "better than where it is, where nothing off the ground holds it along the shift")
        return (f"ambiguous: shifted by {self.describe()} the result fits the structure off the ground "
                f"{how} (max {max_repetition:.2f}): the scene repeats (rack bays, colonnades, lamp posts) or the result "
                f"slid along it")

    def to_dict(self) -> dict:
        return {"ratio": self.ratio, "shift_m": self.shift.tolist(), "fit": self.fit, "set_aside": self.set_aside}


# The 27 offsets of a cell's neighbourhood (itself included).
_NEIGHBOURS = np.stack(np.meshgrid(*[np.arange(-1, 2)] * 3, indexing="ij"), -1).reshape(-1, 3)


def shift_correlation(aligned: np.ndarray, target: np.ndarray, cell: float, max_shift: float) -> np.ndarray:
    """``(2m+1, 2m+1)`` float64 ``C(d) / N``: the fraction of the ``(N, 3)`` aligned source points
    that land within about one ``cell`` of a ``(M, 3)`` target point when shifted by
    ``d = (i - m, j - m) * cell`` in x, y; ``m = ceil(max_shift / cell)``."""
    from scipy import fft

    m = int(np.ceil(max_shift / cell))
    src_keys = np.floor(aligned / cell).astype(np.int64)
    lo = src_keys.min(0) - np.array([m, m, 1])
    hi = src_keys.max(0) + np.array([m, m, 1])
    tgt_keys = np.floor(target / cell).astype(np.int64)
    tgt_keys = tgt_keys[np.all((tgt_keys >= lo) & (tgt_keys <= hi), axis=1)] - lo
    src_keys -= lo
    # x and y padded up to lengths the FFT is fast for (a large prime factor makes it several times slower)
    extent = hi - lo + 1
    shape = (fft.next_fast_len(int(extent[0]), real=True), fft.next_fast_len(int(extent[1]), real=True), int(extent[2]))
    # Each target cell dilated by one cell: its 27 neighbours set directly (the target's cells are
    # few, so this is much cheaper than a maximum filter over the whole box).
    occupied = np.zeros(shape, np.float32)
    near = (tgt_keys[:, None, :] + _NEIGHBOURS[None, :, :]).reshape(-1, 3)
    near = near[np.all((near >= 0) & (near < extent), axis=1)]
    occupied[near[:, 0], near[:, 1], near[:, 2]] = 1.0
    counts = np.zeros(shape, np.float32)
    np.add.at(counts, (src_keys[:, 0], src_keys[:, 1], src_keys[:, 2]), 1.0)
    # C(d) = sum_x counts(x) occupied(x + d), summed over the z layers in the frequency domain. The
    # box has m cells of margin around every source point, so a circular shift of at most m cells
    # never wraps a source point around: the circular correlation is the plain one.
    workers = cpu_workers()
    spectrum = (np.conj(fft.rfft2(counts, axes=(0, 1), workers=workers))
                * fft.rfft2(occupied, axes=(0, 1), workers=workers)).sum(axis=2)
    full = fft.irfft2(spectrum, s=shape[:2], workers=workers)
    index = np.arange(-m, m + 1)
    return full[np.ix_(index % shape[0], index % shape[1])] / len(aligned)


def peak_shifts(scores: np.ndarray, cell: float, min_shift: float, count: int, beyond: float = 0.0) -> np.ndarray:
    """``(K, 2)`` float64 shifts (metres) of the ``count`` highest local maxima of ``scores``
    (``shift_correlation``'s map) at least ``min_shift`` from the centre, off the map's border and,
    with ``beyond``, not inside the square of that half-width (metres; its border is outside), highest
    first."""
    from scipy import ndimage

    m = scores.shape[0] // 2
    window = 2 * int(np.ceil(min_shift / cell / 2)) + 1
    ii, jj = np.nonzero(scores == ndimage.maximum_filter(scores, size=window, mode="nearest"))
    far = np.hypot(ii - m, jj - m) * cell >= min_shift
    inside = (ii > 0) & (jj > 0) & (ii < 2 * m) & (jj < 2 * m)
    outside = np.maximum(np.abs(ii - m), np.abs(jj - m)) * cell >= beyond
    ii, jj = ii[far & inside & outside], jj[far & inside & outside]
    order = np.argsort(-scores[ii, jj], kind="stable")[:count]
    return np.column_stack([ii[order] - m, jj[order] - m]).astype(np.float64) * cell


def settled_shift(aligned: np.ndarray, target: np.ndarray, tree, shift: np.ndarray, distance: float,
                  iterations: int = 2) -> np.ndarray:
    """``shift`` (a peak of the map, on its grid) moved to where the copy fits best: a few steps of
    point-to-point alignment in x and y only (each step the mean horizontal offset of the shifted
    points from their nearest target points within ``2 distance``), as ICP settles the result
    itself; a peak can lie half a cell from its grid point."""
    shift = np.asarray(shift, np.float64).copy()
    for _ in range(iterations):
        moved = aligned + np.append(shift, 0.0)
        dist, index = tree.query(moved, distance_upper_bound=2.0 * distance)
        near = dist < 2.0 * distance
        if int(near.sum()) < 3:
            break
        shift += (target[index[near], :2] - moved[near, :2]).mean(axis=0)
    return shift


def directional_ratio(aligned: np.ndarray, normals: np.ndarray, fits: np.ndarray, tree, shift: np.ndarray,
                      distance: float) -> float:
    """How much of the result's constraint along ``shift`` survives the shift: over the aligned
    points, each weighted by ``(n . d)^2`` (its normal ``n`` against the shift's direction ``d``:
    a wall along the shift fits whatever the shift and counts 0), the weight within ``distance`` of
    the target (its cKDTree ``tree``) after the shift, over the weight of the points that fit at the
    result (``fits``, ``(N,)`` bool). Infinite where the copy lands constraining structure and the
    result none (nothing at the result holds it along ``d``, so the copy is the better supported);
    0 where neither does (no copy to speak of: the degeneracy test judges a direction nothing holds)."""
    direction = np.append(shift / np.linalg.norm(shift), 0.0)
    weight = (normals @ direction) ** 2
    there = tree.query(aligned + np.append(shift, 0.0), distance_upper_bound=distance)[0] < distance
    base, shifted = float(weight[fits].sum()), float(weight[there].sum())
    if base > 0:
        return shifted / base
    return math.inf if shifted > 0 else 0.0


# The correlation map's highest peaks that are settled and weighed by direction, on at most
# WEIGHED_POINTS of the aligned points (a fixed-seed subset: the ratio is a proportion, and three
# k-d tree queries per peak of every voxel of a 128-beam scan cost more than the map itself).
CANDIDATE_PEAKS = 8
WEIGHED_POINTS = 5000


def _peaks_within(scores: np.ndarray, cell: float, min_shift: float, radii: tuple[float, ...]) -> np.ndarray:
    """``(K, 2)`` shifts: the ``CANDIDATE_PEAKS`` highest peaks (``peak_shifts``) within the square
    of the first radius, then as many between each square and the next (the map spans the largest).
    A far copy overlaps the target less, so its correlation is lower than many near peaks' even
    where its directional ratio is the highest (a highway's lamp period, 48 m: docs/reliability.md)."""
    m = scores.shape[0] // 2
    found, inner = [], 0.0
    for radius in sorted(radii):
        r = min(m, int(np.ceil(radius / cell)))
        square = scores[m - r:m + r + 1, m - r:m + r + 1]
        found.append(peak_shifts(square, cell, min_shift, CANDIDATE_PEAKS, beyond=inner))
        inner = r * cell
    return np.concatenate(found)


def repetition(aligned: np.ndarray, normals: np.ndarray, target: np.ndarray, cell: float, min_shift: float,
               max_shift: float | tuple[float, ...], tree=None,
               admissible: Callable[[np.ndarray], bool] | None = None) -> Repetition:
    """The repetition of a result: ``aligned`` ``(N, 3)`` source points off the ground, already
    moved by the result into the target's frame, with their ``(N, 3)`` unit normals (rotated
    likewise); ``target`` ``(M, 3)`` (``tree``: its cKDTree when one exists). Shifts of
    ``min_shift`` to ``max_shift`` metres in x and y on a grid of ``cell``: the correlation map's
    ``CANDIDATE_PEAKS`` highest peaks, each weighed by :func:`directional_ratio`; the highest
    ratio among the copies ``admissible`` allows (a ``(3,)`` shift -> bool; None: all) wins, and
    ``set_aside`` counts the stronger ones it did not (see the module text). ``max_shift`` may be
    increasing radii, each square searched for its own highest peaks: the many peaks of a wide
    square (a highway's guard-rail posts, cars) must not crowd out the nearer copies."""
    from scipy.spatial import cKDTree

    if len(aligned) == 0 or len(target) == 0:
        return Repetition(0.0, np.zeros(3), 0.0)
    radii = (max_shift,) if np.isscalar(max_shift) else tuple(max_shift)
    scores = shift_correlation(aligned, target, cell, max(radii))
    m = scores.shape[0] // 2
    fit = float(scores[m - 1:m + 2, m - 1:m + 2].max())
    tree = cKDTree(target) if tree is None else tree
    if len(aligned) > WEIGHED_POINTS:
        keep = fixed_subset(len(aligned), WEIGHED_POINTS)
        aligned, normals = aligned[keep], normals[keep]
    fits = tree.query(aligned, distance_upper_bound=cell)[0] < cell
    copies = []  # (ratio, shift) of each peak that does not slide back onto the result itself
    for peak in _peaks_within(scores, cell, min_shift, radii):
        shift = settled_shift(aligned, target, tree, peak, cell)
        if np.linalg.norm(shift) >= min_shift:
            copies.append((directional_ratio(aligned, normals, fits, tree, shift, cell), np.append(shift, 0.0)))
    set_aside = 0
    for ratio, shift in sorted(copies, key=lambda copy: -copy[0]):
        if ratio <= 0.0:
            break
        if admissible is None or admissible(shift):
            return Repetition(ratio, shift, fit, set_aside)
        set_aside += 1
    return Repetition(0.0, np.zeros(3), fit, set_aside)
