"""SHM_DGR: register a source cloud to a target cloud.

voxelise -> features (FCGF, or FPFH where no weights fit) -> S2H matching (S-step on a feature
k-NN support, exact H-step) -> inlier weights (the weights' inlier network: the shipped context
network, or DGR's 6-D one) -> weighted Procrustes -> robust ICP refinement -> success test, with
DGR's safeguard: RANSAC on the same correspondences when the weight sum is too small, when the
weights carry no inlier network (or FPFH features are in use), and when no learned estimate of
any heading hypothesis was trusted (``RegistrationResult.fallback`` names which).

``Registrar`` holds the networks and a prepared-cloud cache, so a keyframe's features are
computed once and reused; ``register()`` is the one-call entry of the design contract.

This module is the order of the stages and the search over hypotheses (headings, the safeguard,
slides); how hypotheses are ordered and judged against each other (decisive, rivals, agreed
places) lives in :mod:`s2h_ros.hypotheses`, and each stage's work in its own module: the checked
and prepared clouds (:mod:`s2h_ros.cloud`: input checks, local frames), the matches and RANSAC
(:mod:`s2h_ros.correspondences`), ICP and the fine stage (:mod:`s2h_ros.refinement`), what a
result is judged by (:mod:`s2h_ros.verification`), whether it is trusted (:mod:`s2h_ros.trust`) and the result itself
(:mod:`s2h_ros.registration_result`).
"""
from __future__ import annotations

import dataclasses
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from scipy.spatial.transform import Rotation

from s2h_ros import geometry, hypotheses, trust
from s2h_ros.cloud import CheckedCloud, PreparedCloud, RegistrationError, check_cloud
from s2h_ros.config import RegistrationConfig
from s2h_ros.correspondences import fpfh_features, match_features, ransac_on_correspondences
from s2h_ros.degeneracy import MIN_SLIDE_STRUCTURES
from s2h_ros.gravity import ground_up, levelling_rotation
from s2h_ros.hypotheses import (AGREE_ROTATION_DEG, Hypothesis, agree, agreed_move, at_zero_motion, better, decisive,
                                heading_order, tilt_deg, without_rival)
from s2h_ros.refinement import fine_registration, icp_on_device, refine_icp
from s2h_ros.registration_result import Refinement, RegistrationResult
from s2h_ros.repetition import Repetition
from s2h_ros.sparse.kernel_map import keys_fit
from s2h_ros.verification import (levelled_transform, result_repetition, screen_inlier_estimate, slide_of,
                                  surface_fit)


# A heading heard only because every heading is heard (``hear_every_heading``) is left out when
# this many times its screened inlier estimate stays below what a rival needs
# (Registrar._screened_out).
SCREEN_SLACK = 2.0
# A slide is moved at most this many times (Registrar._slide_recovered): the peak of the slide
# profile is the middle of a plateau D / 2 wide, so the first move may land up to that far off, and
# the slide test there names the rest.
SLIDE_MOVES = 3
# Tilt restarts (``tilt_restart_deg``, Registrar.tilt_restarted): a cloud whose rings are fewer than
# this (its elevation histogram's effective peak count about the pattern axis, 1 / ring_sharpness,
# voxels at 0.3 m: simulated VLP-16 22-24, HDL-32 / VLP-32 23-39, 64-beam lidars 74-135, OS1-128
# 166-273, Livox 295-319) has its results restarted; a restart replaces the result when the fraction of
# the scan lying on the target's surfaces (``surface_fit``) gains RESTART_GAIN, and the surfaces
# count a voxel within verification.SURFACE_TOLERANCE voxel sizes of its neighbour's plane.
RESTART_MAX_RINGS = 48.0
RESTART_GAIN = 0.01
RESTART_POINTS = 2000  # source voxels the restarts refine and score (a fixed-seed subset)


class _Timer:
    def __init__(self, ms: dict[str, float] | None = None) -> None:
        self.ms: dict[str, float] = {} if ms is None else ms  # shared: a result's timings

    @contextmanager
    def stage(self, name: str, device: torch.device | None = None) -> Iterator[None]:
        t0 = time.perf_counter()
        yield
        if device is not None and device.type == "cuda":
            torch.cuda.synchronize(device)
        self.ms[name] = self.ms.get(name, 0.0) + 1e3 * (time.perf_counter() - t0)


class Registrar:
    """SHM_DGR with loaded networks; ``prepare`` a cloud once, ``register`` it many times."""

    def __init__(self, config: RegistrationConfig | None = None) -> None:
        self.config = config or RegistrationConfig()
        self.device = torch.device(self.config.device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise RegistrationError(f"device {self.config.device!r} requested but CUDA is not available")
        self._models = None  # (fcgf, inlier or None, voxel the weights were trained at), loaded lazily

    def with_config(self, config: RegistrationConfig) -> "Registrar":
        """A registrar for ``config`` that shares this one's networks, loaded now, when both read the
        same weight file onto the same device (a variant of one configuration, e.g. an ablation,
        without a second copy of the weights); otherwise its own, loaded when first asked."""
        other = Registrar(config)
        if other.device == self.device and other.weights_path() == self.weights_path() \
                and self.feature_kind() == "fcgf":
            other._models = self._load_models()
        return other

    def warm_up(self) -> None:
        """Load now what the first registration would otherwise load under its own clock: the
        weights (learned features) and, where the ICP runs in Open3D (``icp_on_device`` false), the
        Open3D module (about 1.1 s to import on the 2-core VM, most of it its visualisation's
        plotly / dash). A node that paid for them in its first registration after the
        initialising scan took its next scan 2-3 s later, where the prior counted as stale, and
        lost the track at start-up (held-out drives over DDS at 10 Hz, docs/performance.md).
        Without Open3D installed nothing is imported here; the ICP says so when it runs."""
        if self.feature_kind() == "fcgf":
            self._load_models()
        if not icp_on_device(self.config):
            try:
                import open3d  # noqa: F401 - imported for its import time, not used here
            except ImportError:
                pass

    # ------------------------------------------------------------------ features
    def weights_path(self) -> Path | None:
        """The weight file learned features come from: ``weights`` when given, else the shipped
        file trained at this voxel size (outdoor 0.3 m, indoor 0.05 m); with ``features: fcgf``
        and none shipped for it, the outdoor one. None where no file is read: ``fpfh``, or
        ``auto`` with no file for this voxel size."""
        from s2h_ros.models.checkpoint import DEFAULT_WEIGHTS, shipped_weights
        from s2h_ros.paths import WEIGHTS_DIR

        cfg = self.config
        if cfg.features == "fpfh":
            return None
        if cfg.weights:
            return Path(cfg.weights)
        shipped = shipped_weights(cfg.voxel_size)
        return WEIGHTS_DIR / DEFAULT_WEIGHTS if shipped is None and cfg.features == "fcgf" else shipped

    def _load_models(self):
        if self._models is None:
            from s2h_ros.models.checkpoint import CheckpointError, load_registration_models

            try:
                self._models = load_registration_models(self.weights_path(), device=self.device)
            except (CheckpointError, FileNotFoundError) as err:
                raise RegistrationError(f"cannot load weights: {err}") from err
        return self._models

    def feature_kind(self) -> str:
        """Features in use. ``auto``: fcgf when the weights (given, or shipped for this voxel size)
        were trained at this voxel size (within 10 %), else fpfh: learned features do not transfer
        across scales."""
        kind = self.config.features
        if kind == "auto":
            from s2h_ros.models.checkpoint import voxel_fits

            if self.weights_path() is None:
                return "fpfh"
            kind = "fcgf" if voxel_fits(self._load_models().voxel, self.config.voxel_size) else "fpfh"
        return kind

    def features_used(self) -> str:
        """``feature_kind`` with the weight file it reads, e.g. "fcgf (s2h_compact_indoor.pt)"."""
        kind = self.feature_kind()
        return f"{kind} ({self.weights_path().name})" if kind == "fcgf" else kind

    def prepare(self, xyz: np.ndarray | CheckedCloud, name: str = "cloud") -> PreparedCloud:
        """Voxelise ``(N, 3)`` points and compute per-voxel features (the expensive, cacheable half).

        ``name`` (e.g. "source") starts the messages of the :class:`RegistrationError` it raises;
        a :class:`CheckedCloud` (``check_cloud`` at this voxel size) is not checked again."""
        cfg = self.config
        timer = _Timer()
        checked = xyz if isinstance(xyz, CheckedCloud) else check_cloud(name, xyz, cfg.voxel_size)
        points = checked.xyz
        with timer.stage("voxelize", self.device):
            voxels = self._voxels(points)
        if len(voxels) < 3:
            raise RegistrationError(f"{name} has only {len(voxels)} occupied voxels at {cfg.voxel_size} m "
                                    f"(from {len(points)} points; registration needs 3 or more)")
        kind = self.feature_kind()
        level, tilt = None, 0.0
        if kind == "fcgf" and cfg.level_above_deg < 90.0:
            with timer.stage("level", self.device):
                up = ground_up(voxels.astype(np.float64) + checked.origin)
                tilt = up.tilt_deg
                if up.found and tilt > cfg.level_above_deg:
                    # voxelised again on the levelled grid: turning the input frame's voxels instead
                    # would merge about a tenth of them
                    level = levelling_rotation(up.direction)
                    voxels = self._voxels((points.astype(np.float64) @ level.T).astype(np.float32))
        with timer.stage("features", self.device):
            if kind == "fcgf":
                from s2h_ros.models.fcgf import extract_features

                fcgf = self._load_models().fcgf
                voxels, feats = extract_features(fcgf, voxels, cfg.voxel_size, device=self.device)
                voxels = np.asarray(voxels, dtype=np.float32)
                if level is not None:  # back to the input frame: the features stay with their voxels
                    voxels = (voxels.astype(np.float64) @ level).astype(np.float32)
            else:
                feats = torch.as_tensor(fpfh_features(voxels, cfg.voxel_size), device=self.device)
        return PreparedCloud(voxels, feats, len(points), kind, timer.ms, origin=checked.origin,
                             num_non_finite=checked.num_non_finite, num_out_of_range=checked.num_out_of_range,
                             level=level, tilt_deg=float(tilt))

    def _voxels(self, points: np.ndarray) -> np.ndarray:
        """``(M, 3)``: one point of each occupied voxel of ``points (N, 3)``, at most ``max_points``
        of them (``geometry.fixed_subset`` seeded by ``seed``: the same cloud keeps the same voxels in
        every call and on every thread; a generator carried across calls made one registrar answer a development
        depth-camera pair, world 6027, right with 185 inlier matches in one call and 62 deg wrong
        in another)."""
        cfg = self.config
        keep = geometry.voxel_downsample(points, cfg.voxel_size, self.device)
        rows = geometry.fixed_subset(len(keep), cfg.max_points, self.config.seed)
        return points[keep if rows is None else keep[rows]]

    # ------------------------------------------------------------------ registration
    def register(
        self,
        source: np.ndarray | PreparedCloud,
        target: np.ndarray | PreparedCloud,
        init: np.ndarray | None = None,
        search: str = "global",
    ) -> RegistrationResult:
        """Transform mapping ``source`` into ``target``'s frame (arrays or prepared clouds).

        ``init``: a prior transform (e.g. a constant-velocity prediction), the ICP start when
        there are too few correspondences for RANSAC. ``search``: where S2H looks for candidate
        partners: ``global`` (each voxel's k nearest in feature space, both ways: any motion; with
        learned features the source is also tried at ``heading_hypotheses`` headings about z until
        one is trusted decisively, ``DECISIVE_INLIER_RATIO``, and without ``init`` at the headings
        halfway between them when none is trusted, ``halfway_headings``), ``prior`` (tracking: the
        k best in feature space among the target voxels within ``prior_radius`` of where ``init``
        puts the source voxel; needs ``init``, S2H matcher only) or ``quick`` (the global search's first try
        alone, ``_quick_global``: at most ``global_max_points`` source voxels at the one heading
        nearest ``init``'s yaw, as given without ``init``, with the safeguard; a bounded cost, for a
        scan the caller can afford to lose: the odometry re-seeding a segment, relocalising, or
        falling behind its sensor). The stages run on the clouds' local coordinates
        (``PreparedCloud.origin``); ``init`` and the result are in the input frames.
        """
        cfg = self.config
        t_start = time.perf_counter()
        names = ("source", "target")
        inputs = [given if isinstance(given, PreparedCloud) else check_cloud(name, given, cfg.voxel_size)
                  for given, name in zip((source, target), names)]
        src, tgt = (given if isinstance(given, PreparedCloud) else self.prepare(given, name)
                    for given, name in zip(inputs, names))
        timer = _Timer()
        # Stage times of freshly prepared clouds count towards this call; cached ones cost nothing.
        for prepared, given in ((src, source), (tgt, target)):
            if not isinstance(given, PreparedCloud):
                for k, v in prepared.timings.items():
                    timer.ms[k] = timer.ms.get(k, 0.0) + v

        if search not in ("global", "prior", "quick"):
            raise ValueError(f"search must be 'global', 'prior' or 'quick', got {search!r}")
        tracking = search == "prior" and cfg.matcher == "s2h"  # the nn matchers search globally
        turned: dict[float, torch.Tensor] = {}  # source features per heading, computed once per call
        if tracking:
            if init is None:
                raise ValueError("search='prior' needs init (the motion prior)")
            picked = geometry.fixed_subset(len(src.xyz), cfg.prior_max_points, self.config.seed)
            with timer.stage("support"):
                support = self.prior_support(src if picked is None else src.subset(picked), tgt, init)
            result = self._search(src, tgt, init, timer, turned, support, picked)
        else:
            result = self._quick_global(src, tgt, init, timer, turned, alone=search == "quick")
            if result is None:
                result = self._search(src, tgt, init, timer, turned)
            result = self.unrepeated(src, tgt, result, timer)
            search = "global" if search == "prior" else search  # the nn matchers: prior means global
        if all(isinstance(given, CheckedCloud) for given in inputs):  # a pair given as points: polished last
            result = self._polished(result, *inputs)
        result.search = "prior" if tracking else search
        result.timings["total"] = 1e3 * (time.perf_counter() - t_start)
        return result

    def _quick_global(self, src: PreparedCloud, tgt: PreparedCloud, init: np.ndarray | None, timer: _Timer,
                      turned: dict[float, torch.Tensor], alone: bool = False) -> RegistrationResult | None:
        """The global search's first try when a prior exists (``init``: the odometry's prediction):
        ``global_max_points`` source voxels matched at the heading hypothesis nearest the prior's
        yaw (``_headings``; as given unless the prior turns by more than 45 deg, e.g. a keyframe
        before a turn), refined and verified on every voxel. Its result when decisive (``decisive``), else
        None and the full search runs (every voxel, every heading, the safeguard), so a hard pair
        loses nothing but this try (the turned features it computed are kept in ``turned``). None
        at once without a prior. Where the prior put a turned heading first, a decisive or refused
        result there is also tried at the heading as given, and the rival test sees both (``headings``).
        ``alone`` (``search="quick"``): this try is the whole search, with
        or without a prior (the heading as given then, and after a decisive result there every other
        heading hypothesis: ``hear_every_heading``, as the full search), the safeguard on its matches included; its
        result comes back, trusted only when decisive: what the full search would not take
        without trying the other headings is not taken here either (a soak at 10 Hz trusted two
        steps 5-6 m / 88-180 deg wrong from quick results that were verified but not decisive)."""
        picked = None
        if init is not None or alone:
            picked = geometry.fixed_subset(len(src.xyz), self.config.global_max_points, self.config.seed)
        if picked is None and not alone:
            return None
        headings = self.headings(src, None, init, tgt)
        order = headings[:1] if headings[0] == 0.0 else [headings[0], 0.0]
        every = headings[1:] if init is None and self.config.hear_every_heading else []
        tries = []
        for heading in order + every:
            if len(tries) >= len(order) and not decisive(tries[0]):  # the other headings follow a decisive result only
                break
            hyp = self._subset_hypothesis(src, tgt, self._features_at(src, heading, timer, turned), None, init, timer,
                                          picked, heading, defer=not alone)
            if hyp.deferred and not tries:  # the weights say "no inliers": no RANSAC on a subset, the full search decides
                return None
            if hyp.deferred:  # nor at the heading as given: no rival there
                break
            tries.append(self._finished(src, tgt, hyp, timer, structure=True))
            if tries[0].success and not decisive(tries[0]):
                # A decisive turned result would stop a search, so it faces the one as given; a
                # refused one (a straight street turned around, its structure where the target's
                # rays passed) leaves the heading as given to be heard; a trusted but undecided
                # one leaves it to the full search.
                break
        best = tries[0]
        for candidate in tries[1:]:
            best = candidate if better(candidate, best) else best
        result = without_rival(best, tries, self.config, src, tgt)
        if alone and result.success and not decisive(result):  # the full search would have looked further
            result.success = False
            result.message = (f"not decisive: {result.inlier_ratio:.1%} of the quick global try's matches are "
                              f"inliers (need {hypotheses.DECISIVE_INLIER_RATIO:.0%} to stand without the full search over "
                              f"every heading and voxel)")
        return result if alone or decisive(result) else None

    def _subset_hypothesis(self, src: PreparedCloud, tgt: PreparedCloud, features: torch.Tensor, support,
                           init: np.ndarray | None, timer: _Timer, picked: np.ndarray | None,
                           heading: float = 0.0, defer: bool = False) -> Hypothesis:
        """``_hypothesis`` of the source rows ``picked`` (None: all; ``features`` of the whole source,
        ``support`` over the subset's rows), its pairs indexing the whole source."""
        if picked is None:
            return self._hypothesis(src, tgt, features, support, init, timer, heading, defer)
        sub = src.subset(picked, features)
        hyp = self._hypothesis(sub, tgt, sub.features, support, init, timer, heading, defer)
        return dataclasses.replace(hyp, pairs=np.column_stack([picked[hyp.pairs[:, 0]], hyp.pairs[:, 1]]))

    def _search(self, src: PreparedCloud, tgt: PreparedCloud, init: np.ndarray | None, timer: _Timer,
                turned: dict[float, torch.Tensor], support=None, picked: np.ndarray | None = None) -> RegistrationResult:
        """Matches of the source rows ``picked`` (None: all) on ``support`` (None: global) -> the
        first hypothesis; globally with learned features the other headings until one is decisive;
        DGR's safeguard when none is trusted; without a prior, the same again at the halfway
        headings (``halfway_headings``) when still none is. The best result, refined and verified.
        ``turned``: source features per heading already computed in this call (filled as it goes)."""
        headings = self.headings(src, support, init, tgt)
        first = self._subset_hypothesis(src, tgt, self._features_at(src, headings[0], timer, turned), support, init,
                                        timer, picked, headings[0])
        unsettled = [first] if first.learned else []  # learned estimates RANSAC may re-estimate, in order tried
        structure = support is None  # a global search's results must pass trust.rest_doubt and trust.structure_doubt too
        result = self._finished(src, tgt, first, timer, structure=structure)
        verified = [result]  # every hypothesis refined and verified, for the rival test
        result = self._heading_round(src, tgt, headings[1:], init, timer, turned, picked, result, verified, unsettled,
                                     structure)
        halfway = self.halfway_headings(src, support, init)
        if halfway and not result.success:
            result = self._heading_round(src, tgt, halfway, init, timer, turned, picked, result, verified, [],
                                         structure)
        if not structure:
            return result
        result = without_rival(result, verified, self.config, src, tgt)
        return result if result.success or init is not None else agreed_move(result, verified, self.config, src, tgt)

    def _heading_round(self, src: PreparedCloud, tgt: PreparedCloud, headings: list[float], init: np.ndarray | None,
                       timer: _Timer, turned: dict[float, torch.Tensor], picked: np.ndarray | None,
                       result: RegistrationResult, verified: list[RegistrationResult], unsettled: list[Hypothesis],
                       structure: bool) -> RegistrationResult:
        """The global search's hypotheses at ``headings`` after ``result`` (the best so far) until one
        is decisive, each appended to ``verified``; then DGR's safeguard when none is trusted. The
        best result comes back. ``unsettled``: learned estimates of earlier headings the safeguard
        may re-estimate too. Without a prior every heading is tried after a decisive result too
        (``hear_every_heading``): a scene nearly symmetric under a half or a quarter turn (an office,
        a square room, a corridor, a warehouse aisle) can give a turned copy of the truth a decisive
        match, and only a search that hears the truth beside it lets the most inlier matches win
        and the rival test (``without_rival``) decide."""
        every = init is None and self.config.hear_every_heading
        for heading in headings:
            if decisive(result) and heading != 0.0:  # the heading as given (after a turned first) is heard
                if not every:  # and, without a prior, every heading whatever came before (``hear_every_heading``)
                    break
                if picked is None and self._screened_out(src, tgt, heading, timer, turned, result):
                    continue
            hyp = self._subset_hypothesis(src, tgt, self._features_at(src, heading, timer, turned), None, init, timer,
                                          picked, heading, defer=True)
            if hyp.deferred or hyp.learned:
                unsettled.append(hyp)
            if hyp.deferred:  # a turned source whose weights say "no inliers": RANSAC only if nothing else is trusted
                continue
            candidate = self._finished(src, tgt, hyp, timer, structure=structure)
            verified.append(candidate)
            if better(candidate, result):
                result = candidate
        # DGR's safeguard, second trigger: learned weights that no hypothesis turned into a trusted
        # result are not the last word; RANSAC re-estimates from the same matches, in the order tried.
        for hyp in unsettled if not result.success else []:
            reason = hyp.fallback if hyp.deferred else "learned estimate not trusted"
            candidate = self._finished(src, tgt, self._robust(src, tgt, hyp, init, timer, reason), timer,
                                       structure=structure)
            verified.append(candidate)
            if better(candidate, result):
                result = candidate
            if decisive(result):
                break
        return result

    def _screened_out(self, src: PreparedCloud, tgt: PreparedCloud, heading: float, timer: _Timer,
                      turned: dict[float, torch.Tensor], result: RegistrationResult) -> bool:
        """Whether the source at ``heading``, heard after the decisive ``result`` only because every
        heading is heard (``hear_every_heading``), can be left out without its full hypothesis: a
        fixed-seed random subset of ``heading_screen_points`` source voxels is matched there
        (``_subset_hypothesis``) and the inlier matches of its Procrustes estimate, scaled to every
        voxel (``screen_inlier_estimate``), stay below 1 / ``SCREEN_SLACK`` of what a rival needs
        (``min_inliers``, and ``result``'s inlier matches / ``RIVAL_INLIER_RATIO``: ``without_rival``),
        or the estimate agrees with ``result`` (the same answer). A turned copy of the truth that won
        the first heading leaves the truth with more inlier matches than itself, far above that floor,
        so the heading is heard in full. Nothing is left out with ``heading_screen_points`` 0 or a
        source no larger (the screen would cost what the full hypothesis does)."""
        cfg = self.config
        rows = geometry.fixed_subset(len(src.xyz), cfg.heading_screen_points, self.config.seed)
        if rows is None:  # screen off (0), or a source no larger than the screen
            return False
        hyp = self._subset_hypothesis(src, tgt, self._features_at(src, heading, timer, turned), None, None, timer,
                                      rows, heading, defer=True)
        if hyp.deferred:
            # The safeguard's threshold is absolute: the subset's weight sum, scaled to every voxel, says
            # whether the full hypothesis would defer too (and then, behind a trusted result, never be taken).
            if len(hyp.pairs) < 3 or float(hyp.weights.sum()) * len(src.xyz) / len(rows) \
                    < self._safeguard_threshold(len(src.xyz)):
                return True
            hyp = dataclasses.replace(hyp, T=self._procrustes(src, tgt, hyp.pairs, hyp.weights, timer))
        if agree(geometry.shift_transform(hyp.T, src.origin, tgt.origin), result.transform, cfg.inlier_distance):
            return True
        estimate = screen_inlier_estimate(src.xyz, tgt.xyz, hyp.pairs, hyp.T, cfg.inlier_distance, len(rows))
        return SCREEN_SLACK * estimate < max(cfg.min_inliers, result.num_inliers / hypotheses.RIVAL_INLIER_RATIO)

    def prior_support(self, src: PreparedCloud, tgt: PreparedCloud, init: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Tracking's S2H candidate edges (:func:`s2h_ros.matching.prior_support`): the target
        voxels within ``prior_radius`` of where ``init`` (input frames) puts each source voxel."""
        from s2h_ros.matching import prior_support

        cfg = self.config
        predicted = geometry.apply_transform(geometry.shift_transform(init, -src.origin, -tgt.origin),
                                             src.xyz.astype(np.float64))
        return prior_support(predicted, tgt.spatial_index(), src.features, tgt.features, cfg.prior_radius, cfg.k)

    def _finished(self, src: PreparedCloud, tgt: PreparedCloud, hyp: Hypothesis, timer: _Timer,
                  structure: bool = False) -> RegistrationResult:
        """A hypothesis refined (ICP) and verified: the result ``register`` would return for it
        (``structure``: a global search's, which must also pass ``trust.rest_doubt`` and ``trust.structure_doubt``)."""
        T = hyp.T
        if self.config.refine == "icp" and not hyp.message:
            with timer.stage("refine"):
                surface = tgt.icp_target(self.config)
                T = refine_icp(src.xyz, surface.xyz, T, self.config, surface.normals)
        result = self._verified_result(src, tgt, T, hyp.pairs, hyp.weights, timer, message=hyp.message,
                                       structure=structure)
        if not hyp.message:  # tracking's too: a sparse lidar's tracking collapses onto the rings' alias
            result = self._slide_recovered(src, tgt, result, timer)
        moved = result.refused_move  # a refused move carries its hypothesis's statistics too
        for r in (result,) if moved is None else (result, moved):
            r.num_candidates, r.weight_sum = hyp.num_candidates, float(hyp.weights.sum())
            r.used_fallback, r.heading_deg = bool(hyp.fallback), hyp.heading
            r.fallback = hyp.fallback
        return result

    def _slide_recovered(self, src: PreparedCloud, tgt: PreparedCloud, result: RegistrationResult,
                         timer: _Timer) -> RegistrationResult:
        """A ``result`` (a global search's or tracking's) refused where the geometry leaves one
        direction nearly free (weakest constraint below ``weak_constraint``), moved along that
        direction to where the structure that would show a slide fits the target's
        (``slide_evidence``: poles, signs, ends of walls), refined by ICP and verified by every test
        of a global search's result again (``slide_recovery``). The move is
        made only to a clear peak: ``slide_margin`` better than the result and than every position
        two inlier distances or more from it, so evenly spaced poles, which fit as well one spacing
        on, never choose, and never to zero motion (``at_zero_motion``: there the sensor's own
        pattern on the structure fits its twin whatever the truth; a development OS1-64 highway pair
        16 m apart had its right result moved 16.2 m there). The moved result when it is trusted
        (``slid_m`` says how far); else ``result``, its message saying why the move did not stand.

        On a highway the features match guardrails, verges and the road as readily as the few
        poles, and the estimate lands wherever those put it along the road: on the matrix of base
        seed 1128 (worlds 204 and 413, studied here, so development since) the VLP-16 and HDL-32
        highway pairs were refused 19 of 20 times, each off by about the pair's 10-20 m along the
        road, while 19-99 of their matches were right (fresh held-out numbers: docs/reliability.md).
        Tracking collapses the same way: on a held-out VLP-16 highway drive (world 802) its result
        landed within 0.2 m of zero motion at every scan of frames 2-29 while the prediction was
        1.3-1.6 m ahead, and only a full global search placed each scan; moved, tracking's result
        agrees with the prediction, which vouches for it (docs/reliability.md)."""
        cfg = self.config
        degeneracy = result.degeneracy
        if not cfg.slide_recovery or result.success or degeneracy is None \
                or degeneracy.eigenvalue >= cfg.weak_constraint:
            return result
        T = geometry.shift_transform(result.transform, -src.origin, -tgt.origin)
        slide = result.slide
        if slide is None:  # refused before the slide test (below min_constraint, or by support)
            with timer.stage("verify"):
                slide = slide_of(src, tgt, T, degeneracy, cfg)
        moved, total = result, 0.0
        for _ in range(SLIDE_MOVES):
            if slide is None or slide.structures < MIN_SLIDE_STRUCTURES \
                    or min(slide.gain, slide.peak_margin) < cfg.slide_margin:
                break
            d = degeneracy.direction[:3]
            start = T.copy()
            start[:3, 3] += slide.shift * d
            if at_zero_motion(geometry.shift_transform(start, src.origin, tgt.origin), cfg, src, tgt):
                break  # there the sensor's own pattern on the structure fits its twin, whatever the truth
            with timer.stage("refine"):
                surface = tgt.icp_target(cfg)
                T = refine_icp(src.xyz, surface.xyz, start, cfg, surface.normals).copy()
            # ICP refines the other five directions; along d the structure decides, and the sensor's
            # rings on the road and the rails pull ICP back towards the alias
            T[:3, 3] -= ((T[:3, 3] - start[:3, 3]) @ d) * d
            total += slide.shift
            moved = self._verified_result(src, tgt, T, result.correspondences, result.weights, timer,
                                          structure=True, slid=True)
            if moved.success:
                moved.slid_m = float(total)
                return moved
            degeneracy, slide = moved.degeneracy, moved.slide  # the plateau's middle may be off by D / 2: again
        if moved is not result:
            result.message += (f"; moved {total:+.1f} m along it to where the structure fits, not trusted "
                               f"either: {moved.message}")
            moved.slid_m, result.refused_move = float(total), moved
        return result

    def headings(self, src: PreparedCloud, support, init: np.ndarray | None = None,
                 tgt: PreparedCloud | None = None) -> list[float]:
        """Source headings (deg) the search tries, in order: the global learned-feature search turns
        the source to each of ``heading_hypotheses`` headings about z (FPFH is rotation invariant;
        tracking has the motion prior's heading: ``[0]``). Without a prior the heading as given, then
        the turn-around (180) and the rest by distance from it; with one (``init``) the heading
        nearest the prior's yaw first (a keyframe before a turn: the scan is 90 deg around), the
        heading as given second, the rest by distance from the prior's yaw.

        A turned heading first is the prior's guess, and a guess extrapolated over a stale interval
        can be far off: the searches do not stop at a decisive result there before the heading as
        given has been tried, so that the rival test (``without_rival``) sees both. In a 10 Hz
        to-and-fro drive replayed offline (the soak's, world 12) a prediction 3 s stale carried a
        corner's turn rate on and put the scan at 154 deg where the sensor had turned 15, and the
        quick try at 180 deg was trusted decisively 20 m / 180 deg wrong: the street fits the scan
        turned around (test_heading_hypotheses.py). The prior's yaw is read between the clouds as
        their features saw them (``levelled_transform`` with ``tgt``): a levelled source turns about its
        ground's up."""
        if support is not None or src.feature_kind != "fcgf":
            return [0.0]
        if init is None:
            return heading_order(self.config.heading_hypotheses)
        seen = levelled_transform(src, tgt, init) if tgt is not None else init
        return heading_order(self.config.heading_hypotheses, geometry.yaw_deg(seen))

    def halfway_headings(self, src: PreparedCloud, support, init: np.ndarray | None) -> list[float]:
        """The global search's second round (``halfway_headings``): the headings halfway between the
        ``heading_hypotheses`` ones, the turn-around's neighbours first, tried only when none of
        those gave a trusted result. Only without a prior (``init``; with one, the heading nearest
        it is tried first) and with learned features: they match less as the source's heading
        departs from the one they were trained at, and a heading 45 deg from each hypothesis is the
        worst case (development Livox pair turned 57 deg: 17 true inlier matches at the nearest
        hypothesis, 43-46 within 15 deg of the truth)."""
        n = self.config.heading_hypotheses
        if not self.config.halfway_headings or init is not None or n <= 1 or not self.headings(src, support)[1:]:
            return []
        return sorted((360.0 * (h + 0.5) / n for h in range(n)), key=lambda a: abs(a - 180.0))

    def _features_at(self, src: PreparedCloud, heading: float, timer: _Timer,
                     turned: dict[float, torch.Tensor]) -> torch.Tensor:
        """``src.features`` at heading 0, else ``turned_features`` (timed as features), computed once
        per heading and kept in ``turned``."""
        if heading == 0.0:
            return src.features
        if heading not in turned:
            with timer.stage("features", self.device):
                turned[heading] = self.turned_features(src, heading)
        return turned[heading]

    def turned_features(self, src: PreparedCloud, heading_deg: float) -> torch.Tensor:
        """``(M, C)`` FCGF descriptors of the source voxels turned by ``heading_deg`` about z (about its
        ground's up when it was levelled: the levelled voxels turned), row i belonging to
        ``src.xyz[i]``: learned features are not rotation invariant, so a pair beyond the headings
        they were trained on matches only after such a turn. Multiples of 90 deg map the voxel grid
        onto itself, so no voxel is merged or lost."""
        from s2h_ros.models.fcgf import point_features

        turned = geometry.apply_transform(geometry.yaw_transform(heading_deg), src.feature_frame_xyz())
        return point_features(self._load_models().fcgf, turned.astype(np.float32), self.config.voxel_size,
                              device=self.device)

    def _hypothesis(self, src: PreparedCloud, tgt: PreparedCloud, src_features: torch.Tensor, support,
                    init: np.ndarray | None, timer: _Timer, heading: float = 0.0,
                    defer_safeguard: bool = False) -> Hypothesis:
        """Matches -> weights -> weighted Procrustes (or DGR's RANSAC safeguard): one transform
        between the local frames from one set of source features. ``defer_safeguard``: a weight
        sum below the threshold returns the hypothesis ``deferred`` (no transform yet) instead of
        running RANSAC at once: ``register`` runs it only if no other hypothesis is trusted."""
        cfg = self.config
        with timer.stage("match", self.device):
            pairs, probs, n_cand = match_features(src_features, tgt.features, cfg, src.feature_kind, support)
        with timer.stage("inlier", self.device):
            weights, learned = self._inlier_weights(src.xyz, tgt.xyz, pairs, probs)
        hyp = Hypothesis(np.eye(4), pairs, weights, int(n_cand), "", "", heading)
        if not learned:  # without a learned inlier network the weights say little about outliers: go robust
            return self._robust(src, tgt, hyp, init, timer, "no inlier network")
        threshold = self._safeguard_threshold(len(src.xyz))
        if len(pairs) < 3 or float(weights.sum()) < threshold:
            reason = f"inlier weight sum below {threshold:.0f}"
            if defer_safeguard:
                return dataclasses.replace(hyp, fallback=reason, deferred=True)
            return self._robust(src, tgt, hyp, init, timer, reason)
        return dataclasses.replace(hyp, T=self._procrustes(src, tgt, pairs, weights, timer))

    def _safeguard_threshold(self, voxels: int) -> float:
        """Inlier weight sum below which DGR's safeguard (RANSAC) estimates instead of the learned weights."""
        return max(self.config.safeguard_min_weight, self.config.safeguard_ratio * voxels)

    def _procrustes(self, src: PreparedCloud, tgt: PreparedCloud, pairs: np.ndarray, weights: np.ndarray,
                    timer: _Timer) -> np.ndarray:
        """(4, 4) weighted Procrustes of the (P, 2) matches ``pairs`` with (P,) ``weights``, local
        frames, refined by ``robust_procrustes_iters`` reweighted fits (DGR's robust step). Matches of
        weight 0 (below ``weight_floor``) add nothing to any fit and are left out first."""
        with timer.stage("procrustes"):
            weighed = weights > 0
            pairs, weights = pairs[weighed], weights[weighed]
            R, t = geometry.robust_weighted_procrustes(
                torch.from_numpy(src.xyz[pairs[:, 0]]).double(),
                torch.from_numpy(tgt.xyz[pairs[:, 1]]).double(),
                torch.from_numpy(weights).double(),
                scale=self.config.inlier_distance / 2.0,
                iterations=self.config.robust_procrustes_iters,
            )
        return geometry.make_transform(R.numpy(), t.numpy())

    def _robust(self, src: PreparedCloud, tgt: PreparedCloud, hyp: Hypothesis, init: np.ndarray | None,
                timer: _Timer, reason: str) -> Hypothesis:
        """DGR's safeguard: the transform of ``hyp``'s matches by RANSAC (s2h_ros.ransac), or the motion
        prior when fewer than 3 matches exist; ``reason`` is recorded as the result's ``fallback``."""
        hyp = dataclasses.replace(hyp, fallback=reason, deferred=False)
        with timer.stage("ransac"):
            if len(hyp.pairs) >= 3:
                return dataclasses.replace(hyp, T=ransac_on_correspondences(src.xyz, tgt.xyz, hyp.pairs, self.config))
            if init is not None:
                return dataclasses.replace(hyp, T=geometry.shift_transform(init, -src.origin, -tgt.origin))
        return dataclasses.replace(hyp, T=np.eye(4), message="fewer than 3 correspondences")

    def tilt_restarted(self, source: PreparedCloud, target: PreparedCloud,
                       result: RegistrationResult) -> RegistrationResult:
        """A trusted ``result`` of a sensor whose rings lie far apart (``RESTART_MAX_RINGS``), or the
        restart that replaces it (``tilt_restart_deg``; ``restarted_deg`` says by how much).

        Only a result that tilts the scan against the target by ``tilt_restart_deg`` or more is
        restarted: where the sensor swayed (a handheld or legged carrier) the motion prior and the
        matches give ICP a start degrees off in tilt; a vehicle's scans stay level to each other
        within a degree or two, and on its drives the restarts won rarely and gained little either
        way (held-out VLP-16, HDL-32 and VLP-32 drives), while each cost about 80 ms on one CPU core.

        ICP is refined again from the result turned by +-``tilt_restart_deg`` about the source's x and
        y axes, on a fixed subset of ``RESTART_POINTS`` source voxels; each landing is scored by the
        fraction of that subset lying on the target's surfaces (``surface_fit``: within
        ``SURFACE_TOLERANCE`` voxels of the plane of their nearest target voxel). The best, when it
        gains ``RESTART_GAIN`` over the result, is refined with every voxel and replaces the result
        if it passes the verification. Why: a 16-beam lidar's rings meet the ground metres apart, so
        the ground fixes its tilt only through the few rings near it; point-to-plane ICP turns it
        there by about 1 deg in 30 iterations, and between the rings' aliases a few degrees apart it
        can stop on the wrong one. Fitness counts points near points and favours the aliases (rings
        on rings); the surfaces do not. A handheld VLP-16 walk (world 839, every 5th scan): 5 of 18
        trusted steps 2.1-4.0 deg off before, 1 of 20 after; fresh handheld VLP-16, HDL-32 and
        VLP-32 walks (worlds 871-879): 173 -> 176 of 180 trusted, steps over 1 deg off 9 -> 5, one
        wrong step either way (docs/reliability.md)."""
        cfg = self.config
        if not result.success or cfg.tilt_restart_deg <= 0 or cfg.refine != "icp" \
                or tilt_deg(result.transform) < cfg.tilt_restart_deg or not _rings_apart(target):
            return result
        t_start = time.perf_counter()
        timer = _Timer()
        surface = target.icp_target(cfg)
        picked = geometry.fixed_subset(len(source.xyz), RESTART_POINTS, self.config.seed)
        xyz = source.xyz if picked is None else source.xyz[picked]
        local = geometry.shift_transform(result.transform, -source.origin, -target.origin)
        best, best_fit = local, surface_fit(xyz, target, local, cfg)
        with timer.stage("restart"):
            for axis in np.eye(3)[:2]:
                for sign in (-1.0, 1.0):
                    turn = geometry.make_transform(Rotation.from_rotvec(np.radians(sign * cfg.tilt_restart_deg) * axis)
                                                   .as_matrix(), np.zeros(3))
                    T = refine_icp(xyz, surface.xyz, local @ turn, cfg, surface.normals)
                    fit = surface_fit(xyz, target, T, cfg)
                    if fit >= best_fit + RESTART_GAIN:
                        best, best_fit = T, fit
        if best is local:
            result.timings["restart"] = timer.ms["restart"]
            return result
        restarted = self.refine(source, target, geometry.shift_transform(best, source.origin, target.origin),
                                result.correspondences)  # every voxel, verified
        timings = dict(result.timings)
        for stage, ms in {**restarted.timings, **timer.ms}.items():
            timings[stage] = timings.get(stage, 0.0) + ms
        restarted.timings = {**timings, "total": result.timings.get("total", 0.0) + 1e3 * (time.perf_counter() - t_start)}
        if not restarted.success:
            result.timings = restarted.timings
            return result
        restarted.search, restarted.heading_deg = result.search, result.heading_deg
        restarted.restarted_deg = float(geometry.transform_errors(restarted.transform, result.transform)[0])
        restarted.message = (f"{result.message + '; ' if result.message else ''}restarted {restarted.restarted_deg:.1f} deg "
                             f"tilted: {best_fit:.2f} of the scan on the target's surfaces")
        return restarted

    def refine(self, source: PreparedCloud, target: PreparedCloud, init: np.ndarray,
               correspondences: np.ndarray | None = None, coarse: float = 0.0) -> RegistrationResult:
        """Local refinement only: ICP from ``init`` (input frames, e.g. a motion prior), then the
        same verification as ``register``; ``correspondences`` (K, 2), e.g. of a failed global
        registration, are counted as inliers or not but not required (``min_inliers``).
        ``coarse``: metres, a first ICP stage that far (``refine_icp``)."""
        cfg = self.config
        t_start = time.perf_counter()
        timer = _Timer()
        pairs = np.zeros((0, 2), np.int64) if correspondences is None else correspondences
        with timer.stage("refine"):
            surface = target.icp_target(cfg)
            T = refine_icp(source.xyz, surface.xyz, geometry.shift_transform(init, -source.origin, -target.origin),
                           cfg, surface.normals, coarse=coarse)
        result = self._verified_result(source, target, T, pairs, np.ones(len(pairs), np.float32), timer,
                                       require_inliers=False)
        result.search = "icp"
        result.timings["total"] = 1e3 * (time.perf_counter() - t_start)
        return result

    def _polished(self, result: RegistrationResult, source: CheckedCloud, target: CheckedCloud) -> RegistrationResult:
        """``result`` with the fine stage (``fine_voxel``, :func:`fine_registration`) on the checked
        input clouds, kept when it moves the refined transform by less than half a voxel
        (``voxel_size / 2``) and ``FINE_MAX_TURN_DEG``: a bigger move is another answer, not a polish,
        and trust was decided for this one. Half the inlier distance (0.3 m outdoors), the bound
        before 2026-12-06, let the stage slide highway results along the road by 10-30 cm
        (docs/evaluation.md, "The fine stage again"). ``result.fine`` says how it went."""
        cfg = self.config
        if cfg.refine != "icp" or not 0 < cfg.fine_voxel < cfg.voxel_size:
            return result
        t0 = time.perf_counter()
        start = geometry.shift_transform(result.transform, -source.origin, -target.origin)  # local frames
        with _Timer(result.timings).stage("fine"):
            polished = fine_registration(source.xyz, target.xyz, start, cfg)
        fine = Refinement.bounded(start, polished, cfg.voxel_size / 2, FINE_MAX_TURN_DEG,
                                  "the fine stage moved the result", 1e3 * (time.perf_counter() - t0))
        result.transform = geometry.shift_transform(fine.pose, source.origin, target.origin)
        result.fine = dataclasses.replace(fine, pose=result.transform)
        return result

    def _verified_result(self, src: PreparedCloud, tgt: PreparedCloud, T: np.ndarray, pairs: np.ndarray,
                         weights: np.ndarray, timer: _Timer, message: str = "",
                         require_inliers: bool = True, structure: bool = False,
                         slid: bool = False) -> RegistrationResult:
        """The result for a transform ``T`` between the clouds' local frames, in the input frames,
        judged by :func:`s2h_ros.trust.judge` (its ``verify`` stage; the arguments are its). A global
        search's final result is asked the repetition test after (``unrepeated``)."""
        with timer.stage("verify"):
            verdict = trust.judge(src, tgt, T, pairs, self.config, message=message, require_inliers=require_inliers,
                                  structure=structure, slid=slid)
        return RegistrationResult(
            transform=verdict.transform,
            success=verdict.success,
            message=verdict.message,
            correspondences=pairs,
            weights=weights.astype(np.float32),
            source_xyz=src.input_frame_xyz(),
            target_xyz=tgt.input_frame_xyz(),
            num_inliers=verdict.num_inliers,
            inlier_ratio=float(verdict.num_inliers / max(len(pairs), 1)),
            fitness=verdict.fitness,
            fitness_fine=verdict.fitness_fine,
            feature_kind=src.feature_kind,
            features_used=self.features_used() if src.feature_kind == "fcgf" else src.feature_kind,
            levelled_deg=(src.levelled_deg, tgt.levelled_deg),
            inlier_mask=verdict.inlier_mask,
            timings=timer.ms,
            dropped_points={
                "source_non_finite": src.num_non_finite, "source_out_of_range": src.num_out_of_range,
                "target_non_finite": tgt.num_non_finite, "target_out_of_range": tgt.num_out_of_range,
            },
            covariance=verdict.covariance,
            degeneracy=verdict.degeneracy,
            slide=verdict.slide,
            structure_fit=verdict.structure_fit,
            rest_unconfirmed=verdict.rest_unconfirmed,
            free_space=verdict.free_space,
        )

    def repetition_of(self, src: PreparedCloud, tgt: PreparedCloud, result: RegistrationResult,
                      timer: _Timer | None = None) -> Repetition | None:
        """The strongest sideways-shifted copy of ``result`` (``result_repetition``), also kept in
        ``result.repetition``; None when the test is off or ``result`` is not trusted. Copies as far
        as a highway's lamp spacing are looked for where the result's weakest constraint is below
        ``weak_constraint`` (``result_repetition``'s ``far``). Its time is ``repetition`` in
        ``result.timings`` (0.1-0.5 s)."""
        cfg = self.config
        if not result.success or cfg.max_repetition <= 0:
            return None
        T = geometry.shift_transform(result.transform, -src.origin, -tgt.origin)
        weak = result.degeneracy is not None and result.degeneracy.eigenvalue < cfg.weak_constraint
        with (timer or _Timer(result.timings)).stage("repetition"):
            result.repetition = result_repetition(src, tgt, T, cfg, far=weak)
        return result.repetition

    def unrepeated(self, src: PreparedCloud, tgt: PreparedCloud, result: RegistrationResult,
                   timer: _Timer | None = None) -> RegistrationResult:
        """``result``, trusted so far, with no sideways-shifted copy that fits the scene as well
        (``repetition_of``); else not trusted, naming the copy. ``register`` asks it of a global
        search's final result, once, not of every hypothesis tried: the test costs 0.1-0.5 s, and a
        refused hypothesis must not hand the win to another one. (The odometry weighs tracking's
        result after a stale prediction against its copy itself: ``KeyframeOdometry``.)"""
        repeated = self.repetition_of(src, tgt, result, timer)
        if repeated is not None and repeated.ratio >= self.config.max_repetition:
            result.success = False
            result.message = repeated.refusal(self.config.max_repetition)
        return result

    def _inlier_weights(self, src_xyz, tgt_xyz, pairs: np.ndarray, probs: np.ndarray) -> tuple[np.ndarray, bool]:
        """The inlier network's weights (the context network's or DGR's), floored at ``weight_floor``, when
        the weights carry one and the features are FCGF (True); else the S-step probabilities (False)."""
        cfg = self.config
        if len(pairs) == 0:
            return np.zeros(0, np.float32), False
        use_net = cfg.use_inlier_model and self.feature_kind() == "fcgf"
        inlier_net = self._load_models().inlier if use_net else None
        if inlier_net is None:
            return probs.astype(np.float32), False
        from s2h_ros.models.context_inlier import ContextInlierNetwork

        six = np.hstack([src_xyz[pairs[:, 0]], tgt_xyz[pairs[:, 1]]])
        if isinstance(inlier_net, ContextInlierNetwork):  # loaded on the device, in eval mode
            with torch.no_grad():
                w = inlier_net.weights(six[:, :3], six[:, 3:], cfg.voxel_size, probs, cfg.weight_floor)
            return w.float().cpu().numpy(), True
        from s2h_ros.models.inlier import correspondence_weights

        extent = (np.ptp(np.floor(six / cfg.voxel_size), axis=0) + 1).astype(np.int64).tolist()
        if not keys_fit(extent):  # the 6-D kernel-map keys would not fit int64
            raise RegistrationError(
                f"the correspondences span {extent} voxels of {cfg.voxel_size:g} m (source x y z, target "
                f"x y z): too wide for the inlier network's 6-D kernel-map keys; crop the clouds or set "
                f"use_inlier_model false"
            )
        w = correspondence_weights(inlier_net, six[:, :3], six[:, 3:], cfg.voxel_size, self.device)
        w = np.asarray(w, dtype=np.float32)
        w[w < cfg.weight_floor] = 0.0
        return w, True


# ---------------------------------------------------------------------------- stages


def _rings_apart(cloud: "PreparedCloud") -> bool:
    """Whether ``cloud``'s scan pattern has fewer than ``RESTART_MAX_RINGS`` effective rings about its
    pattern axis (``s2h_ros.scan_pattern.ring_sharpness``): a 16-32-beam lidar's."""
    from s2h_ros.scan_pattern import ring_sharpness

    sharpness = ring_sharpness(cloud.input_frame_xyz(), cloud.pattern_axis())
    return sharpness > 0 and 1.0 / sharpness < RESTART_MAX_RINGS


# The fine stage (refinement.fine_registration) may turn the refined result by less than this (the
# agreement angle), or it is not kept (``Registrar._polished``).
FINE_MAX_TURN_DEG = AGREE_ROTATION_DEG


# ---------------------------------------------------------------------------- entry point

_REGISTRARS: dict[tuple, Registrar] = {}


def register(
    source_xyz: np.ndarray, target_xyz: np.ndarray, config: RegistrationConfig | None = None
) -> RegistrationResult:
    """Register ``(N, 3)`` source points to ``(M, 3)`` target points with SHM_DGR.

    Returns the 4x4 ``transform`` mapping source into target's frame, the correspondences and
    their weights, ``success`` and per-stage timings (ms). Networks are loaded once per config.
    """
    key = dataclasses.astuple(config) if config is not None else ()
    if key not in _REGISTRARS:
        _REGISTRARS[key] = Registrar(config)
    return _REGISTRARS[key].register(source_xyz, target_xyz)

