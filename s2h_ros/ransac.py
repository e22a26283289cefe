"""RANSAC over given correspondences: DGR's safeguard, reproducible, on any torch device.

The pipeline falls back to RANSAC over its own S2H matches when the inlier weights are unsure,
the odometry's global search draws its hypotheses from it, and a global result is trusted only
when RANSAC with another seed lands on it again. Open3D's
``registration_ransac_based_on_correspondence`` (used before) draws the samples of its OpenMP
threads from one shared generator in whatever order the threads ask, so with two or more threads
the same seed gives a different transform from run to run: a held-out OS1-64 highway drive (world
48) replayed five times in one process tracked scans 8-30 in three runs and lost them all in the
two others. A safeguard whose answer changes between two replays of the same bag can be neither
tested nor trusted, and Open3D's runs on the CPU only. Here the samples come in batches from one
seeded generator on the CPU, and fitting and scoring run on ``device``; the answer depends on the
inputs and the seed only (and, within floating point, on the device).

Each hypothesis (Fischler and Bolles, with Open3D's two pre-checks, which DGR's safeguard used):

1. three correspondences, distinct;
2. **edge lengths**: each side of the source triangle within ``similarity`` (0.9) of the
   target's, and the triangle not degenerate (its smallest height at least a tenth of the inlier
   distance: three collinear points do not fix a rotation);
3. the rigid transform of the three (:func:`s2h_ros.geometry.weighted_procrustes`, batched), kept
   only if each of the three lands within the inlier distance of its match;
4. its **score**: how many of all correspondences land within the inlier distance (ties: the
   smaller summed squared residual of the inliers).

Every sample counts as an iteration. Each time the best hypothesis improves, the iterations
needed for ``confidence`` at its inlier ratio ``w``, ``log(1 - confidence) / log(1 - w^3)``, cap
the search, checked after every chunk of scored hypotheses (in sample order, so the stop is the
same on every device): with 70 % right matches it stops after a few dozen samples.
The best hypothesis is then refitted on all its inliers, and on the inliers of that fit, as long
as the count grows (local optimisation; the minimal-sample transform is noisier than its
inliers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from s2h_ros import geometry

BATCH = 4096  # samples drawn at a time
SCORE_ELEMENTS = 1 << 20  # hypotheses x correspondences scored at once (memory: about 12 floats each)
MIN_HEIGHT_FRACTION = 0.1  # smallest triangle height, in inlier distances
LOCAL_OPTIMISATION_ROUNDS = 3


@dataclass
class RansacResult:
    transform: np.ndarray  # (4, 4) float64, maps source points onto the target
    inliers: int  # correspondences within the inlier distance at ``transform``
    iterations: int  # samples drawn
    hypotheses: int  # samples that passed the pre-checks and were scored


def ransac(src: np.ndarray, tgt: np.ndarray, pairs: np.ndarray, inlier_distance: float, max_iterations: int,
           seed: int, device: str | torch.device = "cpu", confidence: float = 0.999,
           similarity: float = 0.9) -> RansacResult:
    """The rigid transform best supported by ``pairs (K, 2)`` int rows ``(source index, target
    index)`` into ``src (N, 3)`` and ``tgt (M, 3)``; identity with 0 inliers when no sample passes.
    Raises ``ValueError`` on fewer than 3 pairs or indices out of range."""
    pairs = np.asarray(pairs)
    if pairs.ndim != 2 or pairs.shape[1] != 2 or len(pairs) < 3:
        raise ValueError(f"RANSAC needs (K >= 3, 2) correspondences, got shape {pairs.shape}")
    if pairs.min() < 0 or pairs[:, 0].max() >= len(src) or pairs[:, 1].max() >= len(tgt):
        raise ValueError("correspondence indices out of range")
    dev = torch.device(device)
    dtype = torch.float64 if dev.type == "cpu" else torch.float32
    x = torch.as_tensor(np.asarray(src, np.float64)[pairs[:, 0]], dtype=dtype, device=dev)
    y = torch.as_tensor(np.asarray(tgt, np.float64)[pairs[:, 1]], dtype=dtype, device=dev)
    generator = torch.Generator().manual_seed(int(seed))
    k = len(pairs)
    best = (-1, math.inf)  # (inliers, squared residual)
    best_T = torch.eye(4, dtype=dtype, device=dev)
    drawn = scored = 0
    needed = max_iterations
    chunk = max(1, SCORE_ELEMENTS // k)
    while drawn < min(needed, max_iterations):
        n = min(BATCH, max_iterations - drawn)
        samples, position = _draw(k, n, generator)
        samples = samples.to(dev)
        xs, ys = x[samples], y[samples]  # (B, 3, 3) sampled triangles
        keep = _plausible(xs, ys, inlier_distance, similarity)
        xs, ys, position = xs[keep], ys[keep], position[keep.cpu()]
        T = _fit(xs, ys) if len(xs) else torch.empty(0, 4, 4, dtype=dtype, device=dev)
        within = _within(T, xs, ys, inlier_distance)
        T, position = T[within], position[within.cpu()]
        used = n  # samples of this batch counted as iterations
        for start in range(0, len(T), chunk):
            Tc = T[start:start + chunk]
            count, sq = _score(Tc, x, y, inlier_distance)
            scored += len(Tc)
            i = int(torch.argmax(count.double() * 1e12 - sq.double()).item())
            if (int(count[i]), -float(sq[i])) > (best[0], -best[1]):
                best, best_T = (int(count[i]), float(sq[i])), Tc[i]
                needed = _iterations_needed(best[0] / k, confidence)
            last = int(position[min(start + chunk, len(T)) - 1]) + 1
            if drawn + last >= needed:  # certain before the end of the batch: its later samples are not used
                used = last
                break
        drawn += used
    if best[0] < 3:
        return RansacResult(np.eye(4), 0, drawn, scored)
    best_T, inliers = _locally_optimised(best_T, best[0], x, y, inlier_distance)
    return RansacResult(best_T.detach().cpu().double().numpy(), inliers, drawn, scored)


def _draw(k: int, n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` samples of 3 indices in [0, k): the ``(n', 3)`` int64 rows whose three are distinct,
    and their ``(n',)`` positions among the ``n``."""
    idx = torch.randint(0, k, (n, 3), generator=generator)
    distinct = (idx[:, 0] != idx[:, 1]) & (idx[:, 0] != idx[:, 2]) & (idx[:, 1] != idx[:, 2])
    return idx[distinct], torch.arange(n)[distinct]


def _plausible(xs: torch.Tensor, ys: torch.Tensor, inlier_distance: float, similarity: float) -> torch.Tensor:
    """``(B,)`` bool for ``(B, 3, 3)`` sampled source and target triangles: every side of one
    within ``similarity`` of the other's, and the source triangle not degenerate."""
    ex = torch.linalg.vector_norm(xs - xs.roll(1, dims=1), dim=-1)  # (B, 3) side lengths
    ey = torch.linalg.vector_norm(ys - ys.roll(1, dims=1), dim=-1)
    alike = ((ex >= similarity * ey) & (ey >= similarity * ex)).all(-1)
    twice_area = torch.linalg.vector_norm(torch.cross(xs[:, 1] - xs[:, 0], xs[:, 2] - xs[:, 0], dim=-1), dim=-1)
    height = twice_area / ex.max(-1).values.clamp_min(1e-12)
    return alike & (height >= MIN_HEIGHT_FRACTION * inlier_distance)


def _fit(xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
    """``(B, 4, 4)`` rigid transforms of ``(B, n, 3)`` point sets (batched Procrustes, equal weights)."""
    R, t = geometry.weighted_procrustes(xs, ys, torch.ones(xs.shape[:-1], dtype=xs.dtype, device=xs.device))
    T = torch.eye(4, dtype=xs.dtype, device=xs.device).repeat(len(xs), 1, 1)
    T[:, :3, :3], T[:, :3, 3] = R, t
    return T


def _residuals(T: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``(B, n)`` squared distances of ``T x`` from ``y``; ``x``, ``y`` ``(n, 3)`` or ``(B, n, 3)``."""
    moved = x @ T[:, :3, :3].transpose(-1, -2) + T[:, None, :3, 3]
    return ((moved - y) ** 2).sum(-1)


def _within(T: torch.Tensor, xs: torch.Tensor, ys: torch.Tensor, inlier_distance: float) -> torch.Tensor:
    """``(B,)`` bool: each sample's three points land within the inlier distance of their matches."""
    return (_residuals(T, xs, ys) < inlier_distance**2).all(-1)


def _score(T: torch.Tensor, x: torch.Tensor, y: torch.Tensor, inlier_distance: float
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per hypothesis of ``T (B, 4, 4)``: ``(B,)`` inlier counts and the ``(B,)`` summed squared
    residual of its inliers (the caller keeps B x len(x) under SCORE_ELEMENTS)."""
    r2 = _residuals(T, x, y)
    inlier = r2 < inlier_distance**2
    return inlier.sum(-1), (r2 * inlier).sum(-1)


def _iterations_needed(inlier_ratio: float, confidence: float) -> int:
    """Samples that draw at least one all-inlier triple with probability ``confidence``."""
    p_good = inlier_ratio**3
    if p_good >= 1.0:
        return 1
    if p_good <= 0.0:
        return 2**62
    return int(math.ceil(math.log(1.0 - confidence) / math.log1p(-p_good)))


def _locally_optimised(T: torch.Tensor, inliers: int, x: torch.Tensor, y: torch.Tensor,
                       inlier_distance: float) -> tuple[torch.Tensor, int]:
    """``T`` refitted on its inliers while that gains inliers (at most LOCAL_OPTIMISATION_ROUNDS)."""
    mask = _residuals(T[None], x, y)[0] < inlier_distance**2
    for _ in range(LOCAL_OPTIMISATION_ROUNDS):
        fitted_on = int(mask.sum())
        if fitted_on < 3:
            break
        refit = _fit(x[mask][None], y[mask][None])[0]
        refit_mask = _residuals(refit[None], x, y)[0] < inlier_distance**2
        count = int(refit_mask.sum())
        if count < inliers:
            break
        T, inliers, mask = refit, count, refit_mask
        if fitted_on == count:
            break
    return T, inliers
