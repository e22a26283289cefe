"""Scan-to-keyframe odometry on top of the SHM_DGR registrar (no ROS).

Each scan goes through these stages:

1. **Stamp**: a stamp not after the last one is refused; one more than ``max_gap`` earlier (a
   looping bag) resets the odometry (event ``time_reset``, a new segment).
2. **Tracking** while the prior is trusted (a successful scan less than a gap ago and
   ``tracking``): S2H candidates around each voxel's position predicted by the motion prior
   (``Registrar.register(search="prior")``; ``s2h_ros.motion_prior``: the last velocity, its speed
   changing as over the last ``speed_change_window`` seconds, or two scan intervals when scans come
   slower, and its turn rate kept, each for at most ``max_gap`` seconds, since a manoeuvre ends).
   A result that confirms the prediction (within
   ``agree_distance``, by default half the inlier distance, and 2 deg) is taken as it is; one that corrects it by what the prior's
   error explains (within ``prior_radius`` and 10 deg: scans dropped by a node that falls behind,
   braking, the start of a turn) is taken when ICP from the prediction lands on it too (two
   independent starts agree; that ICP's first stage takes correspondences up to ``prior_radius``
   apart, as far as tracking looked, so a turn a few degrees beyond the prediction converges).
   From a stale prediction (below) the two are not independent: both start metres off and stop
   where their reach ends, at the same wrong place along a street, so such a correction is
   followed to its fixed point instead.
   Where tracking pulls away from a fresh prediction but does not stand (a turn's first tenths of
   a second, 10-20 deg beyond it), tracking is **followed** from its own result until it lands where
   it started; that fixed point stands when trusted, within ``prior_radius`` and 25 deg of the
   prediction, and clear of its sideways-shifted copies (``_followed``), so a corner costs a few
   trackings instead of a global search. A stale prediction (below) is followed too, as far as
   ``FOLLOW_STEPS`` + 1 trackings reach, since it may be metres off: a caller taking a scan every
   1.2 s, or a node behind its sensor after a slow step, had each such step searched globally.
   When the prediction is stale (more than ``max_gap`` seconds old, or
   its twist a relocalisation's mean over a gap) it may be metres off and vouches for little: the
   result must then also beat its strongest sideways-shifted copy (the repetition test; when the
   copy fits as well, ICP from it must explain the scan clearly worse), else the global search
   decides and the prediction may veto, not win. Only then is the global search skipped. A **gap** is counted in scans as well as
   in seconds: more than ``max_gap`` seconds and more than ``gap_periods`` typical scan intervals
   (the median of the last stamp differences), so a node that falls behind a 10 Hz sensor and
   takes a scan every 1-3 s keeps tracking instead of losing its prior at every scan. A gap of
   the caller's own making is tracked through as well, with the prediction stale: a streaming
   caller says ``heard(stamp)`` for every scan it receives, dropped ones included, and while the
   sensor was never silent for longer than a gap, tracking is tried before the global search (a
   node one slow global search behind saw its next scans 1.2-1.3 s after the last trusted one and,
   counting that as a gap, searched globally again, scan after scan).
3. **Global search** otherwise, or when tracking fails or corrects the prediction a lot and
   following it does not settle: S2H on each voxel's feature k-NN in the current keyframe
   (**falling behind**: its first try alone, ``Registrar.register(search="quick")``, one heading,
   a subset of the voxels, trusted only when decisive, whenever the caller says a newer scan is
   already waiting, ``step(..., behind=)``, here and in stage 5; a full search costs 6-8 s on a
   2-core CPU, and a node that spends them sees its next scan 40-60 m on, where nothing overlaps
   any more; lock-step callers pass nothing and keep every full search), checked against the prior's hypothesis (tracking's result, or ICP from the prediction). If
   they agree the global result stands; if they disagree, the one explaining clearly more of the
   scan (fraction of voxels within half the inlier distance, by ``ambiguity_margin``) wins and a
   tie is not trusted. When the global result fails, the prior's hypothesis alone is accepted
   only while the prior is trusted, and from a stale prediction only where the failed search's
   own estimate lands too and it beats its copy (``_stands_in``).
4. **Reproduction**: a global result that nothing independent confirms (neither the prediction
   nor the prior's hypothesis agrees: after a gap, at relocalisation, when it beats the prior)
   stands only if RANSAC with another seed on the same S2H matches, refined by ICP, lands on it
   again (within the same tolerance). A weak RANSAC consensus that was found by chance (31 of
   3900 matches) is not found twice; a right one is found by any seed. A run whose own hypothesis
   its verification refuses (a highway's zero-motion ring slide) is no evidence either way: the
   next seed tries without the matches it explains, up to ``REPRODUCTION_SEEDS`` runs.
5. **Tracking loss**: after ``max_failures`` failures in a row, or a failure after a gap, the scan
   is registered globally against at most ``relocalisation_tries`` of the kept keyframes
   (``relocalisation_keyframes``), nearest the predicted position first, each with the prediction
   as its prior (event ``relocalised``), each result reproduced as above. A relocalised scan
   gives the prior a velocity again (the mean over the gap, without its turn). If none verifies, a new
   **segment** starts: the scan becomes a keyframe at the last trusted pose moved by at most a
   gap of the last motion (event ``new_segment``, not trusted), so the odometry frame stays
   continuous and says that the motion in between is unknown. A scan whose search landed at zero
   motion where the geometry leaves a direction nearly free (rest, or the sensor's pattern on its
   twin: ``RegistrationResult.rest_unconfirmed``) is not trusted and not counted as a failure: the
   keyframe stays, so the motion since it can show (``_held_at_rest``).
   **Re-seeding** (a caller falling behind, as in stage 3, when the segment starts): until a scan
   of the new segment is trusted, each scan is registered globally against the segment's first
   scan (its seed), and a scan that fails becomes the seed at once (event ``new_segment`` again)
   instead of counting ``max_failures`` against an ever more distant scan (lock-step callers keep
   counting: their next scan is near the seed); the first trusted scan gives the prior the mean velocity since the seed, as a
   relocalisation does, and its prediction counts as stale. With the quick search of a node that
   falls behind, a lost scan costs about one second on a 2-core CPU instead of 7-30 s, so the next
   scan is still near the seed: a node that spent 7 s on every failing scan saw each next scan
   50 m on and never found the track again (held-out HDL-64 drive over DDS at 10 Hz,
   docs/performance.md).
6. **Fine refinement**: a trusted pose is refined against a local map, the last ``map_keyframes``
   keyframe scans at ``map_voxel`` (``s2h_ros.local_map``: robust point-to-plane ICP), and the
   refined pose is used when it stays within the agreement tolerance of the trusted one
   (``OdometryStep.refinement`` says whether it was). The registration decides trust; the map
   only removes the error of a 0.3 m-voxel, one-keyframe ICP (held-out VLP-32 drive, first 174 m:
   KITTI drift 2.6 % -> 0.02 %). A refinement that moves the pose further says that the map and
   the keyframe disagree about the scan: it is not trusted (``_map_refined``).
7. **Keyframes**: a new one after enough travel or rotation, or when the inlier ratio drops. What
   the next scans need of it (k-d tree, normals, planarity) is computed from then on a helper
   thread, and a step waits only for what is not ready when it asks. On the CPU Open3D computes
   the surface and holds the interpreter lock while it does (s2h_ros.surface), so with the local
   map's helper process the keyframe's surface is computed there (``_warm_keyframe``). The local
   map with it is built in that low-priority process (``map_in_background``): scans are refined
   against the newest map built by then, and a scan that becomes a keyframe against the map of
   the current keyframes (``s2h_ros.local_map``).

A failed scan yields no pose: callers (the ROS node, replay evaluation) publish nothing they
cannot trust.
"""
from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from s2h_ros import geometry
from s2h_ros.cloud import PreparedCloud, RegistrationError, check_cloud
from s2h_ros.config import OdometryConfig, RegistrationConfig
from s2h_ros.correspondences import ransac_on_correspondences
from s2h_ros.deskew import DeskewError, deskew
from s2h_ros.handover import in_background, in_low_priority_process
from s2h_ros.hypotheses import AGREE_ROTATION_DEG, agree
from s2h_ros.local_map import LocalMap
from s2h_ros.motion_prior import body_twist, predicted_pose, relocalised_twist, speed_change, speed_window
from s2h_ros.pipeline import Registrar
from s2h_ros.registration_result import Refinement, RegistrationResult

# A trusted tracking result that corrects the prediction by more than AGREE_* but less than this
# rotation (and less than prior_radius) stands when ICP from the prediction lands on it as well.
TRACKING_CORRECTION_DEG = 10.0
# Tracking followed from its own result (``KeyframeOdometry._followed``): at most this many more
# trackings to reach a fixed point, which may turn the prediction by less than this.
FOLLOW_STEPS = 3
FOLLOW_TURN_DEG = 25.0
# Stamp differences the typical scan interval (a gap's unit) is the median of.
RECENT_INTERVALS = 10
# Speeds kept of the last trusted intervals (``speed_change_window`` picks the recent ones).
SPEED_SAMPLES = 50
# Stamps kept of the scans a streaming caller received (``heard``): 100 s of a 10 Hz sensor.
HEARD_STAMPS = 1000
# RANSAC runs (seeds after the configured one) that may try to reproduce a global result; a run
# whose hypothesis its own verification refuses is no evidence either way, and the next seed tries.
REPRODUCTION_SEEDS = 3
# How results name the prior's hypothesis, by RegistrationResult.search.
_HYPOTHESIS = {"prior": "tracking around the motion prior", "icp": "ICP from the motion prior"}


@dataclass
class OdometryStep:
    """Outcome of one scan."""

    index: int
    stamp: float
    success: bool
    message: str
    pose: np.ndarray | None  # (4, 4) sensor pose in the odometry frame; None when not trusted
    T_keyframe_scan: np.ndarray | None  # (4, 4) maps scan points into the keyframe frame
    keyframe_id: int
    keyframe_stamp: float
    new_keyframe: bool
    result: RegistrationResult | None  # None for the first scan of a keyframe chain or bad input
    keyframe_xyz: np.ndarray | None = None  # (M, 3) keyframe voxels (for markers)
    # (6, 6) covariance of ``pose`` as a left perturbation [translation, rotation] in the odometry
    # frame: the keyframe's, plus this registration's (RegistrationResult.covariance) carried over.
    covariance: np.ndarray | None = None
    # (6,) body twist of the sensor [vx, vy, vz, wx, wy, wz] per second (constant-velocity prior)
    # and its (6, 6) covariance (two registrations' uncertainty over the time step).
    twist: np.ndarray | None = None
    twist_covariance: np.ndarray | None = None
    # Continuity: ``segment`` counts how often tracking was lost and the odometry started again
    # (0 until the first loss); ``event`` names what happened at this scan: "" (tracking),
    # "initialised", "relocalised" (found again against a known keyframe after a loss),
    # "new_segment" (not found: poses continue from the last trusted one, motion in between
    # unknown), "time_reset" (the stamp went backwards: a looping bag; everything restarts).
    segment: int = 0
    event: str = ""
    # The fine refinement of ``pose`` against the local map (``map_keyframes``); None when it did not run.
    # A scan the map refused (it moved the pose beyond the agreement tolerance) carries it too.
    refinement: Refinement | None = None
    # Stage times of this step in ms (the device synchronised after each device stage): the scan's
    # preparation (voxelize, features, map_scan), the registration's stages (RegistrationResult.
    # timings, map_refine included; when tracking was lost, "lost_tracking": every registration of
    # the scan, against each keyframe tried) and "rest" (keyframe and map bookkeeping); they sum to
    # the step, and its preparation where that ran ahead (``KeyframeOdometry.prepare``, another thread).
    timings: dict[str, float] = field(default_factory=dict)
    # The scan was motion-compensated from its per-point times with the prior's twist before it was
    # registered (``KeyframeOdometry.prepare``); False: registered as given.
    deskewed: bool = False


@dataclass(eq=False)  # compared by identity (deque.remove): the arrays have no truth value
class Keyframe:
    cloud: PreparedCloud
    pose: np.ndarray  # (4, 4) sensor pose in the odometry frame
    stamp: float
    id: int
    covariance: np.ndarray  # (6, 6), as OdometryStep.covariance
    undeskewed: tuple[np.ndarray, np.ndarray] | None = None  # PreparedScan.undeskewed of its scan


@dataclass(eq=False)
class PreparedScan:
    """A scan made ready for ``KeyframeOdometry.step`` by ``KeyframeOdometry.prepare``: its voxels and
    features, and the local map's copy of it; or why it cannot be registered (``error``)."""

    cloud: PreparedCloud | None
    map_scan: np.ndarray | None  # (M, 3) float64 for the fine refinement; None without a local map
    timings: dict[str, float]  # ms: deskew, voxelize, features, map_scan
    error: str = ""  # "bad scan: ..." where the scan cannot be registered
    deskewed: bool = False  # motion-compensated from its per-point times (``KeyframeOdometry.prepare``)
    # ((N, 3+) points, (N,) times) of a scan with times that could not be deskewed yet (no trusted
    # motion): a segment's first keyframe is deskewed once the motion is known (``_deskew_seed``).
    undeskewed: tuple[np.ndarray, np.ndarray] | None = None


class KeyframeOdometry:
    """Online odometry: ``step(points, stamp)`` per scan, poses in the first keyframe's frame.

    ``prepare(points)`` (voxels, features, the local map's copy) reads no state of the odometry, so
    a caller may run it for the next scan in another thread while ``step`` registers this one (the
    node does: ``s2h_ros.ros.registration_node``), and hand ``step`` the ``PreparedScan``."""

    def __init__(
        self,
        registration: RegistrationConfig | None = None,
        odometry: OdometryConfig | None = None,
        registrar: Registrar | None = None,
    ) -> None:
        self.cfg = odometry or OdometryConfig()
        self.registrar = registrar or Registrar(registration)
        self.registrar.warm_up()  # not under the first registration's clock: a stream's next scan waits for it
        self.local_map = None
        if self.cfg.map_keyframes:
            self.local_map = LocalMap(self.cfg.map_voxel or self.registrar.config.voxel_size, self.cfg.map_keyframes,
                                      self.registrar.config, self.cfg.map_in_background)
        self.count = 0
        self.segment = 0
        self.keyframe_id = -1
        # Differences between the stamps of consecutive scans received (the sensor's period, or the
        # rate this odometry is fed at when its caller falls behind); kept across segments. A scan's
        # own difference joins them after its step (``_interval``): the typical interval a gap is
        # measured in is that of the scans before it. Counted at once, a 10 s gap after two scans
        # 0.1 s apart made the median 5 s and the gap none (tracked, not relocalised).
        self.intervals: deque[float] = deque(maxlen=RECENT_INTERVALS)
        self._interval: float | None = None
        self.received_stamp: float | None = None
        # Stamps of the scans a streaming caller received (``heard``), including those it dropped.
        self._heard: deque[float] = deque(maxlen=HEARD_STAMPS)
        self._heard_lock = threading.Lock()
        self._lost_since: float | None = None  # when this step found tracking lost (its timings)
        self._undeskewed: tuple[np.ndarray, np.ndarray] | None = None  # this step's PreparedScan.undeskewed
        self._behind: Callable[[], bool] | None = None  # this step's ``behind``
        # Speed (m/s) and turn rate (rad/s) of the last trusted motion, kept across segments: how far
        # the sensor may have gone while the odometry was lost (a new segment's covariance).
        self.last_motion = (0.0, 0.0)
        self._start(None)

    def _start(self, stamp: float | None) -> None:
        """Forget everything but the counters (construction and time reset)."""
        self.keyframes: deque[Keyframe] = deque(maxlen=self.cfg.relocalisation_keyframes)
        self.last_pose: np.ndarray | None = None
        self.last_stamp: float | None = stamp
        self.last_cov = np.zeros((6, 6))
        # Motion prior: body-frame twist per second [v, w], so the prediction stays
        # right when scans were dropped or arrive at an uneven rate; known after one registration.
        self.twist = np.zeros(6)
        self.twist_cov = np.zeros((6, 6))
        self.twist_known = False
        self.twist_relocalised = False  # the twist is a relocalisation's mean over a gap
        # (middle stamp, mean speed m/s) of the last trusted intervals: the speed's change (``_predict``).
        self.speeds: deque[tuple[float, float]] = deque(maxlen=SPEED_SAMPLES)
        self.failures = 0
        self.rest_holds = 0  # scans since the last trusted one whose search landed at unconfirmed rest
        self.reseeding = False  # a segment started by a loss, nothing trusted in it yet
        if self.local_map is not None:
            self.local_map.clear()

    @property
    def keyframe(self) -> PreparedCloud | None:
        return self.keyframes[-1].cloud if self.keyframes else None

    @property
    def keyframe_pose(self) -> np.ndarray:
        return self.keyframes[-1].pose if self.keyframes else np.eye(4)

    # ------------------------------------------------------------------ one scan
    def heard(self, stamp: float) -> None:
        """The sensor produced a scan at ``stamp`` (seconds): a streaming caller says so for every
        scan it receives, also those it drops because it is behind (any thread). The odometry then
        tells a gap of its own making (the sensor went on while this odometry was busy) from a sensor
        that fell silent: through the first, tracking is still tried (module text, stage 2)."""
        with self._heard_lock:
            self._heard.append(float(stamp))

    def _silence(self, stamp: float) -> float:
        """The longest stretch without a scan between the last trusted scan and ``stamp``, seconds,
        from the stamps ``heard`` (all of that time when none were heard in between); stamps up to
        the last trusted scan's are forgotten."""
        with self._heard_lock:
            heard = sorted(s for s in self._heard if self.last_stamp < s < stamp)
            while self._heard and self._heard[0] <= self.last_stamp:
                self._heard.popleft()
        return float(np.max(np.diff([self.last_stamp, *heard, stamp])))

    def prepare(self, points: np.ndarray, times: np.ndarray | None = None, stamp: float | None = None) -> PreparedScan:
        """``points (N, 3+)`` made ready for ``step``: motion-compensated when ``times`` (N,) gives
        each point's seconds relative to the scan's ``stamp`` (``s2h_ros.deskew``: with the prior's
        twist while it is current, ``_motion_current``; ``deskew`` on), checked once, voxelised with
        features (``Registrar.prepare``) and downsampled for the local map. Reads the twist, writes
        no state of the odometry (thread-safe against ``step``); a scan that cannot be registered
        gives ``error``."""
        use_times = times is not None and self.cfg.deskew
        twist = self.twist if use_times and self._motion_current(stamp) else None  # replaced, never changed in place
        return self._prepared(points, times if use_times else None, twist)

    def _prepared(self, points: np.ndarray, times: np.ndarray | None, twist: np.ndarray | None) -> PreparedScan:
        """``prepare`` with the ``twist`` (6,) to deskew with (None: the scan is kept as given, and
        with ``times`` it keeps them for a later deskew, ``PreparedScan.undeskewed``)."""
        timings: dict[str, float] = {}
        try:
            self._check(points)
            undeskewed = (points, times) if times is not None and twist is None else None
            if times is not None and twist is not None:
                t_deskew = time.perf_counter()
                try:
                    points = deskew(points, times, twist)
                except DeskewError as exc:
                    raise RegistrationError(str(exc)) from None
                timings["deskew"] = 1e3 * (time.perf_counter() - t_deskew)
            checked = check_cloud("cloud", points, self.registrar.config.voxel_size)  # once, for both uses
            cloud = self.registrar.prepare(checked)
            timings.update(cloud.timings)
            t_scan = time.perf_counter()
            map_scan = self.local_map.scan(checked) if self.local_map is not None else None
            timings["map_scan"] = 1e3 * (time.perf_counter() - t_scan)
        except RegistrationError as exc:
            return PreparedScan(None, None, timings, f"bad scan: {exc}")
        return PreparedScan(cloud, map_scan, timings, deskewed=times is not None and twist is not None,
                            undeskewed=undeskewed)

    def step(self, points: np.ndarray | PreparedScan, stamp: float,
             behind: Callable[[], bool] | None = None, times: np.ndarray | None = None) -> OdometryStep:
        """One scan: ``points (N, 3+)`` (with ``times``, see ``prepare``) or what ``prepare`` made
        of them, ``stamp`` in seconds.
        ``behind``: says, when asked, whether a newer scan is already waiting for this odometry (the
        node: one is offered or prepared, s2h_ros.handover); while it is, a global search is its
        quick first try alone (module text, stage 3). Without it (lock-step callers), every search
        is a full one. The step's timings include the preparation's (done here for points, earlier
        for a PreparedScan)."""
        t0 = time.perf_counter()
        self._behind = behind
        self._lost_since = None
        ahead = isinstance(points, PreparedScan)
        scan = points if ahead else self.prepare(points, times, stamp)
        prepare_ms = dict(scan.timings)
        out = self._step(scan, stamp)
        out.deskewed = scan.deskewed
        if self._lost_since is not None:  # every registration of a lost track, against each keyframe tried
            registration = {"lost_tracking": 1e3 * (time.perf_counter() - self._lost_since)}
        else:
            registration = dict(out.result.timings) if out.result is not None else {}
            registration.pop("total", None)
        out.timings = {**prepare_ms, **registration}
        spent = 1e3 * (time.perf_counter() - t0) + (sum(prepare_ms.values()) if ahead else 0.0)
        out.timings["rest"] = max(0.0, spent - sum(out.timings.values()))
        return out

    def _step(self, scan_in: PreparedScan, stamp: float) -> OdometryStep:
        index = self.count
        self.count += 1
        event = ""
        if self.last_stamp is not None and stamp <= self.last_stamp:
            if self.last_stamp - stamp <= self.cfg.max_gap:
                return self._failed(index, stamp, f"stamp {stamp:.9f} s is not after the last scan's "
                                    f"{self.last_stamp:.9f} s (duplicate or out of order)", None)
            self._start(None)  # a looping bag: start again, as a new segment
            self.segment += 1
            event = "time_reset"
        if self._interval is not None:
            self.intervals.append(self._interval)
        self._interval = None
        if not event and self.received_stamp is not None and stamp > self.received_stamp:
            self._interval = stamp - self.received_stamp
        self.received_stamp = stamp
        if scan_in.error:
            return self._failed(index, stamp, scan_in.error, None)
        prepared, scan = scan_in.cloud, scan_in.map_scan
        self._undeskewed = scan_in.undeskewed  # a keyframe taken of this scan keeps it (``_deskew_seed``)
        if not self.keyframes:
            return self._initialise(index, prepared, scan, stamp, event or "initialised")

        limit = self.max_gap()
        gap = self.last_stamp is not None and stamp - self.last_stamp > limit
        # A gap of this odometry's own making (the sensor went on, its scans were dropped) is
        # tracked through: with the prediction stale, tracking must beat its copy.
        dropped = gap and self._silence(stamp) <= limit
        track = self.twist_known and self.failures == 0 and (dropped or not gap)
        prior_trusted = track and not gap
        current = self.keyframes[-1]
        prior = geometry.invert_transform(current.pose) @ self._predict(stamp)
        started = time.perf_counter()
        result = self._register(prepared, current, prior, prior_trusted, self._prediction_stale(stamp), track)
        refinement = self._map_refined(prepared, scan, current, result)
        if result.success:
            # found again without a usable prior (tracking through dropped scans is not)
            relocalised = gap and not self.reseeding and result.search != "prior"
            if relocalised:
                why = ("its scans in between held at zero motion" if self.rest_holds
                       else "its scans in between dropped" if dropped else "without data")
                result.message = f"relocalised against keyframe {current.id} after {stamp - self.last_stamp:.1f} s {why}"
            return self._tracked(index, stamp, prepared, scan, current, result, refinement,
                                 event="relocalised" if relocalised else "")

        if result.rest_unconfirmed:
            return self._held_at_rest(index, stamp, result, current)
        self.failures += 1
        if self.reseeding:  # the seed is out of reach (or this scan is bad): this scan seeds the segment instead
            self._lost_since = started
            return self._new_segment(index, stamp, prepared, scan, result,
                                     f"segment {self.segment}: not found against its first scan ({result.message})")
        if self.failures < self.cfg.max_failures and not gap:
            return self._failed(index, stamp, result.message, result, refinement)
        self._lost_since = started
        return self._recover(index, stamp, prepared, scan, result)

    # ------------------------------------------------------------------ stages
    def _register(self, prepared: PreparedCloud, keyframe: Keyframe, prior: np.ndarray,
                  prior_trusted: bool, stale: bool, track: bool) -> RegistrationResult:
        """The scan against ``keyframe`` (see the module text): tracking while the prior is trusted,
        accepted as it is when it confirms the prediction (``stale``: and passes the repetition
        test); otherwise the global search (``_global_search``), checked against the prior's
        hypothesis (tracking's result, or ICP from the prediction)."""
        t0 = time.perf_counter()
        reg, use_prior = self.registrar, self.cfg.use_motion_prior
        competitor = icp = checked = None
        if track and self.cfg.tracking:
            competitor = reg.register(prepared, keyframe.cloud, init=prior, search="prior")
        if competitor is not None and competitor.success:
            if self._agree(competitor.transform, prior):
                checked = competitor  # tracking confirms the prediction
            elif not stale and self._within_prior(competitor.transform, prior):  # a correction the prior's error explains
                icp = self._checking_icp(prepared, keyframe, prior, competitor)
                if icp.success and self._agree(icp.transform, competitor.transform):
                    checked = _with_timings(competitor, icp)  # ICP from the prediction lands on it too
        followed = False
        if checked is None and competitor is not None:  # a turn beyond one tracking's reach (or past a stale prediction)
            checked = self._followed(prepared, keyframe, prior, competitor, stale)
            followed = checked is not None  # and beats its copy: _followed asked
        if checked is not None and stale and not followed:
            checked = self._beats_its_copy(checked, prepared, keyframe)
            if not checked.success:  # a copy metres away explains the scan as well: the prediction was off
                competitor, checked, prior_trusted = checked, None, False
        if checked is None:  # no tracking, or it failed or corrected the prediction a lot: the global search decides
            global_ = self._global_search(prepared, keyframe, prior)
            confirmed = global_.success and self._agree(global_.transform, prior)
            if use_prior and not confirmed:
                if competitor is None or not competitor.success:
                    competitor = reg.refine(prepared, keyframe.cloud, prior, global_.correspondences)
                else:  # tracking moved the prediction: checked against ICP from the prediction
                    competitor = self._correction_checked(competitor, prepared, keyframe, prior, icp)
                confirmed = global_.success and competitor.success and self._agree(global_.transform,
                                                                                    competitor.transform)
                if stale and prior_trusted and not global_.success:  # the prior's hypothesis alone would stand
                    competitor = self._stands_in(competitor, global_, prepared, keyframe)
                checked = self._arbitrate(global_, competitor, prior_trusted)
            else:
                checked = global_
            if checked is global_ and not confirmed:  # the global search alone says so: once more
                checked = self._reproduced(prepared, keyframe.cloud, global_)
        checked = self.registrar.tilt_restarted(prepared, keyframe.cloud, checked)  # a sparse lidar's tilt
        checked.timings["total"] = 1e3 * (time.perf_counter() - t0)  # every attempt, wall clock
        # Attempts whose result was not kept (e.g. tracking, before the global search replaced it).
        kept = sum(v for k, v in checked.timings.items() if k not in ("total", "discarded"))
        checked.timings["discarded"] = max(0.0, checked.timings["total"] - kept)
        return checked

    def _followed(self, prepared: PreparedCloud, keyframe: Keyframe, prior: np.ndarray,
                  first: RegistrationResult, stale: bool = False) -> RegistrationResult | None:
        """Tracking followed from where it landed, when it pulled away from a fresh prediction but
        did not stand (``first``: not trusted, or a correction that ICP from the prediction did not
        confirm): tracking again from its own result, at most ``FOLLOW_STEPS`` times, until it lands
        where it started (a fixed point). One tracking reaches as far as ``prior_radius`` around each
        voxel's predicted position, a few degrees of heading at the ranges that hold it; a turn's
        first 0.4 s at 56 deg/s leaves the prediction 12 deg behind (held-out HDL-64 world 950 at 10
        Hz on the CPU: tracking went 7.7 deg of the way at fitness 0.34, from there the rest, the
        full global search's pose to 0.00 deg, in 2 s instead of one tracking more). The fixed point
        stands when it is trusted, within ``prior_radius`` of the predicted position and
        ``FOLLOW_TURN_DEG`` of its heading (a turn's change, not a slide: tracking never moves a
        pose further than it looks), and beats its strongest sideways-shifted copy, as a stale
        prediction's tracking must (``_beats_its_copy``: the prediction no longer vouches for it);
        the local map must then agree as for every result (``_map_refined``). None otherwise: the
        global search decides.

        ``stale`` (``_prediction_stale``: more than ``max_gap`` old, or a relocalisation's twist):
        the prediction may be metres off, so the fixed point may lie as far as the trackings reach,
        ``FOLLOW_STEPS`` + 1 times ``prior_radius``; the copy test decides as above. A stale
        prediction's correction comes here even when tracking trusted it: ICP from the same
        prediction, which confirms a fresh one's, starts as far off and stops where tracking did
        (``_register``). Held-out
        simulated drives taken every 12th scan (1.2 s apart, lock-step, 2-core CPU): global
        searches 16 -> 7 (HDL-64 world 950), 12 -> 6 (VLP-32 world 940), 6 -> 1 (VLP-32 world
        993), the same or more steps trusted, none wrong (docs/performance.md)."""
        if self._agree(first.transform, prior):
            return None  # it did not move: nothing to follow
        reg, last = self.registrar, first
        for _ in range(FOLLOW_STEPS):
            again = reg.register(prepared, keyframe.cloud, init=last.transform, search="prior")
            if self._agree(again.transform, last.transform):
                break
            last = again
        else:
            return None
        turn, move = geometry.transform_errors(again.transform, prior)
        reach = reg.config.prior_radius * ((1 + FOLLOW_STEPS) if stale else 1)
        if not (again.success and move < reach and turn < FOLLOW_TURN_DEG):
            return None
        followed = self._beats_its_copy(again, prepared, keyframe)
        return followed if followed.success else None

    def _beats_its_copy(self, result: RegistrationResult, prepared: PreparedCloud,
                        keyframe: Keyframe) -> RegistrationResult:
        """A hypothesis of a stale prediction (``_prediction_stale``), trusted so far: the repetition
        test (``Registrar.repetition_of``) names its strongest sideways-shifted copy; when the copy fits
        the structure as well, ICP from it is a competing hypothesis, and ``result`` stands only if
        it explains the scan clearly better (``fitness_fine``, by ``ambiguity_margin``) or that ICP
        fails. A slide onto a prediction metres off loses to the truth the copy leads to (soak:
        0.62 vs 0.43); a right result whose copy only matched a sparse sensor's scan pattern keeps
        (held-out VLP-16 town taken every 1.2 s: 2 such copies, ratio 1.06 and 1.45, 7.3 m on)."""
        reg = self.registrar
        repeated = reg.repetition_of(prepared, keyframe.cloud, result)
        if repeated is None or repeated.ratio < reg.config.max_repetition:
            return result
        shift = np.eye(4)
        shift[:3, 3] = repeated.shift
        copy = reg.refine(prepared, keyframe.cloud, shift @ result.transform, result.correspondences)
        if copy.success and result.fitness_fine < copy.fitness_fine + self.cfg.ambiguity_margin:
            result.success = False
            result.message = (f"{repeated.refusal(reg.config.max_repetition)}; ICP from that copy explains the scan "
                              f"as well or better ({copy.fitness_fine:.2f} vs {result.fitness_fine:.2f})")
        return _with_timings(result, copy)

    def _stands_in(self, local: RegistrationResult, global_: RegistrationResult, prepared: PreparedCloud,
                   keyframe: Keyframe) -> RegistrationResult:
        """A stale prediction's hypothesis ``local`` where the global search is not trusted: it may
        stand in only where the global search's own estimate lands too (refused by a test the copy
        check answers: a repetition, too few matches) and it beats its copy. Where the two disagree
        nothing vouches for it: at a corner's end a stale prediction keeps turning, and tracking and
        ICP from it settle alike on a partial correction (the soak drive, a node behind its sensor
        taking scans 52 and 67: 1.5 m / 2.6 deg off, while the quick global search, right, was not
        decisive: trusted twice in one soak)."""
        if local.success and not self._agree(global_.transform, local.transform):
            local.success = False
            local.message = (f"{local.message + '; ' if local.message else ''}a stale prediction's hypothesis and the "
                             f"global search's estimate disagree, and neither is trusted")
            return local
        return self._beats_its_copy(local, prepared, keyframe)

    def _correction_checked(self, tracking: RegistrationResult, prepared: PreparedCloud, keyframe: Keyframe,
                            prior: np.ndarray, icp: RegistrationResult | None = None) -> RegistrationResult:
        """Tracking moved the prediction by more than ``_agree`` allows: ICP from the prediction is
        a second, independent start. If it lands on tracking's result, or fails, or explains the
        scan clearly worse (``ambiguity_margin`` of ``fitness_fine``), tracking stands; if it
        explains it clearly better, it replaces tracking; alike, neither is trusted. (Held-out
        OS1-64 highway, seed 48, scan 30: tracking slid 0.47 m along the road on a few poles while
        ICP from the prediction stayed 0.07 m from the truth, both at fitness 0.65.)"""
        if icp is None:  # ``icp``: that ICP when it has run already
            icp = self._checking_icp(prepared, keyframe, prior, tracking)
        if not icp.success or self._agree(icp.transform, tracking.transform):
            return _with_timings(tracking, icp)
        return self._clearer(tracking, icp, _HYPOTHESIS["prior"], _HYPOTHESIS["icp"])

    def _checking_icp(self, prepared: PreparedCloud, keyframe: Keyframe, prior: np.ndarray,
                      tracking: RegistrationResult) -> RegistrationResult:
        """ICP from the prediction ``prior`` as the second start that checks tracking's correction of
        it: a first, coarse ICP takes correspondences as far apart as tracking searched for its
        candidates (``prior_radius``), so that it converges from where tracking started. At two
        voxels alone it stops short of a corner's few degrees: held-out HDL-64 drive (world 801),
        tracking right at 4.2 and 5.9 deg from the prediction, ICP 3.8 and 5.3 deg short of it,
        with the coarse stage on it to 0.01 deg; each such scan cost a global search."""
        return self.registrar.refine(prepared, keyframe.cloud, prior, tracking.correspondences,
                                     coarse=self.registrar.config.prior_radius)

    def _arbitrate(self, global_: RegistrationResult, local: RegistrationResult,
                   prior_trusted: bool) -> RegistrationResult:
        """The global result against the prior's hypothesis ``local`` (tracking or ICP from the
        prediction): agreement keeps the global one, else the clearer explanation of the scan
        (``fitness_fine``, by ``ambiguity_margin``) wins; an untrusted prior may veto, not win.

        A global search that is not trusted leaves the prior's hypothesis to stand alone, but not
        where the search's own estimate lies elsewhere and explains the scan clearly better: the
        scene holds something the hypothesis does not fit. (Held-out handheld VLP-16, parking lot,
        world 921, scans 0.5 s apart: the global estimate, refused as a 0.6 m slide, fitted 0.56;
        ICP from the prediction, 3.4 deg / 0.78 m off, fitted 0.42 and had been trusted.)"""
        name = _HYPOTHESIS.get(local.search, local.search)
        if not global_.success:
            if local.success and prior_trusted:
                if (global_.fitness_fine >= local.fitness_fine + self.cfg.ambiguity_margin
                        and not self._agree(global_.transform, local.transform)):
                    local.success = False
                    local.message = (f"the global search is not trusted, and its estimate explains the scan better "
                                     f"than {name} ({global_.fitness_fine:.2f} vs {local.fitness_fine:.2f}): "
                                     f"neither is trusted")
                    return _with_timings(local, global_)
                local.message = f"the global search is not trusted; {name} is verified"
                local.used_fallback, local.fallback = True, local.message
                return _with_timings(local, global_)
            return global_
        if not local.success or self._agree(global_.transform, local.transform):
            return _with_timings(global_, local)
        return self._clearer(global_, local, "the global search", name, second_may_win=prior_trusted)

    def _clearer(self, first: RegistrationResult, second: RegistrationResult, first_name: str, second_name: str,
                 second_may_win: bool = True) -> RegistrationResult:
        """Two verified hypotheses that disagree: the clearer explanation of the scan
        (``fitness_fine``, by ``ambiguity_margin``) wins, ``second`` only if ``second_may_win``;
        alike, ``first`` comes back not trusted, saying how far apart the two are."""
        margin = self.cfg.ambiguity_margin
        within = f"within {self.registrar.config.inlier_distance / 2:.2f} m"
        if first.fitness_fine >= second.fitness_fine + margin:
            return _with_timings(first, second)
        if second.fitness_fine >= first.fitness_fine + margin and second_may_win:
            second.message = (f"{second_name} explains the scan better than {first_name} "
                              f"({second.fitness_fine:.2f} vs {first.fitness_fine:.2f} {within})")
            return _with_timings(second, first)
        moved = float(np.linalg.norm(first.transform[:3, 3] - second.transform[:3, 3]))
        first.success = False
        first.message = (f"ambiguous: {first_name} and {second_name} differ by {moved:.2f} m but explain the "
                         f"scan alike ({first.fitness_fine:.2f} vs {second.fitness_fine:.2f} {within})")
        return _with_timings(first, second)

    def _reproduced(self, prepared: PreparedCloud, target: PreparedCloud,
                    result: RegistrationResult) -> RegistrationResult:
        """``result``, a global registration no independent hypothesis confirms, still trusted only
        if RANSAC with another seed on its own S2H matches, refined by ICP and verified the same
        way, lands on it again (``_agree``); otherwise not trusted, saying how far the two are.

        A run whose own hypothesis is refused (degenerate, too few inliers) found nothing that
        could contradict ``result``: the next seed tries, without the matches that hypothesis
        explains (sequential RANSAC), up to REPRODUCTION_SEEDS runs. On a
        highway the S2H matches of the ground's rings support zero motion, a slide along the road
        the degeneracy test refuses: held-out OS1-64 highway (world 48), scans 0.2 s apart, the
        first run's result was the truth (4.7-14.4 m on) and a second seed's run landed on that
        refused slide 0.1-1.1 m on at six scans of six, so the drive never started tracking."""
        if not result.success:
            return result
        t0 = time.perf_counter()
        pairs = result.correspondences
        again = None
        if len(pairs) >= 3:
            left, runs = pairs, 0
            for attempt in range(1, REPRODUCTION_SEEDS + 1):
                again, runs = self._ransac_again(prepared, target, left, attempt), attempt
                if again.success:
                    break
                T = geometry.shift_transform(again.transform, -prepared.origin, -target.origin)  # local frames
                left = left[~geometry.correspondence_inlier_mask(prepared.xyz, target.xyz, left[:, 0], left[:, 1], T,
                                                                 self.registrar.config.inlier_distance)]
                if len(left) < 3:
                    break
        ms = 1e3 * (time.perf_counter() - t0)
        result.timings["reproduce"] = ms
        result.timings["total"] = result.timings.get("total", 0.0) + ms
        if again is not None and again.success and self._agree(again.transform, result.transform):
            return result
        result.success = False
        if again is None:
            result.message = f"not reproduced: {len(pairs)} matches are too few for a second RANSAC"
            return result
        if not again.success:
            seeds = f"{runs} other seed{'s' if runs > 1 else ''}"
            result.message = (f"not reproduced: RANSAC with {seeds} on the same {len(pairs)} "
                              f"matches found no trusted hypothesis (the last: {again.message}); the global search "
                              "is not trusted")
            return result
        re, te = geometry.transform_errors(again.transform, result.transform)
        result.message = (f"not reproduced: RANSAC with another seed on the same {len(pairs)} matches lands "
                          f"{te:.2f} m / {re:.1f} deg away (fitness {again.fitness:.2f} vs {result.fitness:.2f}, "
                          f"{again.num_inliers} vs {result.num_inliers} inliers); the global search is not trusted")
        return result

    def _ransac_again(self, prepared: PreparedCloud, target: PreparedCloud, pairs: np.ndarray,
                      attempt: int) -> RegistrationResult:
        """RANSAC on ``pairs`` with the ``attempt``-th seed after the configured one, refined by ICP
        and verified (``Registrar.refine``)."""
        cfg = self.registrar.config
        T = ransac_on_correspondences(prepared.xyz, target.xyz, pairs, cfg.replace(seed=(cfg.seed + attempt) % 2**31))
        return self.registrar.refine(prepared, target, geometry.shift_transform(T, prepared.origin, target.origin), pairs)

    def _global_search(self, prepared: PreparedCloud, keyframe: Keyframe, prior: np.ndarray) -> RegistrationResult:
        """The scan against ``keyframe`` in feature space, ``prior`` its prior: the full search, or
        its quick first try alone while a newer scan is waiting (``step(..., behind=)``, asked
        now: what came before in this step has taken its time)."""
        search = "quick" if self._falling_behind() else "global"
        return self.registrar.register(prepared, keyframe.cloud, init=prior, search=search)

    def _falling_behind(self) -> bool:
        """A newer scan is waiting for this odometry (``step(..., behind=)``), asked now."""
        return self._behind is not None and bool(self._behind())

    def max_gap(self) -> float:
        """Seconds since the last trusted scan beyond which the motion prior is not trusted:
        ``max_gap``, or ``gap_periods`` typical scan intervals when scans come slower than that
        (a caller that falls behind its sensor, a slow sensor)."""
        return max(self.cfg.max_gap, self.cfg.gap_periods * self._typical_interval())

    def _typical_interval(self) -> float:
        """Seconds between scans as they come: the median of the last ``RECENT_INTERVALS`` stamp
        differences (0 before the second scan). A gap and the speed change's window count in it."""
        return float(np.median(self.intervals)) if self.intervals else 0.0

    def _prediction_stale(self, stamp: float) -> bool:
        """The motion prediction for ``stamp`` may be metres off, so tracking's agreement with it
        vouches for little: more than ``max_gap`` seconds since the last trusted scan (the prior is
        kept only because scans come that slowly, ``gap_periods``), or the twist is a
        relocalisation's mean over a gap. Tracking's result must then beat its copy too
        (``_beats_its_copy``): a slide along a street onto a prediction 13 m short had fitness
        0.53, while the copy the test found, 13.3 m on, was the truth (soak, 10 Hz stream taken
        every 1.3-1.7 s, the twist from a relocalisation across a reversal)."""
        return (self.last_stamp is not None and stamp - self.last_stamp > self.cfg.max_gap) or self.twist_relocalised

    def _within_prior(self, T: np.ndarray, prior: np.ndarray) -> bool:
        """``T`` is a correction of the prediction ``prior`` that the motion prior's error explains:
        within tracking's search radius (``prior_radius``) and ``TRACKING_CORRECTION_DEG``."""
        re, te = geometry.transform_errors(T, prior)
        return te < self.registrar.config.prior_radius and re < TRACKING_CORRECTION_DEG

    def agree_distance(self) -> float:
        """Metres within which two hypotheses of one scan agree: ``agree_distance``, or half the
        registration's inlier distance when that is 0."""
        return self.cfg.agree_distance or self.registrar.config.inlier_distance / 2

    def _agree(self, A: np.ndarray, B: np.ndarray) -> bool:
        return agree(A, B, self.agree_distance())

    def _map_refined(self, prepared: PreparedCloud, scan: np.ndarray | None, keyframe: Keyframe,
                     result: RegistrationResult) -> Refinement | None:
        """A trusted ``result`` against ``keyframe`` refined against the local map (``scan``:
        ``LocalMap.scan`` of the points; None without a map, or for a result not trusted).

        A refinement that moves the pose further than the agreement tolerance is not used, and the
        scan is not trusted: the map holds the keyframe among its neighbours at their trusted poses,
        so the map and the keyframe disagreeing about one scan means that the result is wrong, or
        that a keyframe is; the odometry cannot tell which, and says so. Where the map agrees (on
        ordinary held-out drives every trusted step: 174 of 174, moves 0.6 cm median, 10 cm at most)
        nothing changes. Several keyframes hold the scan where one keyframe at 0.3 m voxels let a
        sparse sensor's rotation slip (held-out handheld VLP-16 walks, tracking 3.2 deg / 0.64 m off
        trusted, world 921) or let tracking stop 0.34 m short along a highway (VLP-16, world 802);
        the earlier rule, which kept a result where ICP from the map's pose against the keyframe came
        back to it, trusted the second (docs/reliability.md)."""
        if self.local_map is None or not result.success:
            return None
        # A scan that becomes a keyframe carries the track on: it is refined against the map of the
        # current keyframes (waiting for it); the others against the newest map built (local_map).
        refinement = self.local_map.refine(scan, keyframe.pose @ result.transform, self.agree_distance(),
                                           AGREE_ROTATION_DEG, newest=self._needs_keyframe(result))
        result.timings["map_refine"] = refinement.ms
        result.timings["total"] = result.timings.get("total", 0.0) + refinement.ms
        if not refinement.used and refinement.refined is not None:
            result.success = False
            kept, behind = self.local_map.held, refinement.map_behind
            since = f", built {behind} keyframe{'s' if behind != 1 else ''} ago" if behind else ""
            result.message = (f"{refinement.message.removesuffix(': not used')}: the local map of {kept} "
                              f"keyframe{'s' if kept != 1 else ''}{since} and keyframe {keyframe.id} disagree, not trusted")
        return refinement

    def _tracked(self, index: int, stamp: float, prepared: PreparedCloud, scan: np.ndarray | None, keyframe: Keyframe,
                 result: RegistrationResult, refinement: Refinement | None, event: str = "") -> OdometryStep:
        """Bookkeeping of a trusted registration against ``keyframe``, its pose refined against the
        local map (``refinement``, ``_map_refined``; None without a map)."""
        pose = refinement.pose if refinement is not None else keyframe.pose @ result.transform
        cov_rel = result.covariance if result.covariance is not None else np.diag([1e6] * 6)
        Ad = geometry.adjoint(keyframe.pose)
        covariance = keyframe.covariance + Ad @ cov_rel @ Ad.T
        dt = stamp - self.last_stamp
        if dt > 0:
            delta = geometry.invert_transform(self.last_pose) @ pose
            # Relocalised after a gap or a loss (same odometry frame), or the first trusted scan of a
            # re-seeding segment (the motion since its seed, possibly seconds): a mean over the
            # interval, see motion_prior.relocalised_twist, and the next prediction is stale.
            self.twist_relocalised = bool(event) or self.reseeding
            if self.twist_relocalised:
                self.twist = relocalised_twist(delta, dt)
            else:
                self.twist = body_twist(delta, dt)
            self.speeds.append((self.last_stamp + dt / 2, float(np.linalg.norm(self.twist[:3]))))
            body = geometry.adjoint(geometry.invert_transform(result.transform))  # keyframe -> scan body frame
            self.twist_cov = 2.0 * (body @ cov_rel @ body.T) / dt**2
            self.twist_known = True
        self.failures = 0
        self.rest_holds = 0
        self.reseeding = False
        self._deskew_seed()
        self.last_motion = (float(np.linalg.norm(self.twist[:3])), float(np.linalg.norm(self.twist[3:])))
        self.last_pose, self.last_stamp, self.last_cov = pose, stamp, covariance
        new_kf = self._needs_keyframe(result)
        if new_kf:
            self._add_keyframe(prepared, scan, pose, stamp, covariance)
        T_keyframe_scan = geometry.invert_transform(keyframe.pose) @ pose
        return OdometryStep(index, stamp, True, result.message if event else "", pose, T_keyframe_scan, keyframe.id,
                            keyframe.stamp, new_kf, result, keyframe.cloud.input_frame_xyz(), covariance,
                            self.twist.copy(), self.twist_cov.copy(), self.segment, event, refinement)

    def _held_at_rest(self, index: int, stamp: float, result: RegistrationResult, keyframe: Keyframe) -> OdometryStep:
        """A scan whose search landed at zero motion where the geometry leaves a direction nearly
        free (``RegistrationResult.rest_unconfirmed``): the sensor is at rest, or its own pattern
        lies on its twin (a highway's rings, a tunnel's columns), and nothing but a trusted motion
        tells which. Not trusted, and not counted towards losing the track: ``keyframe`` stays, so
        the motion since it grows until a search sees it (a vehicle pulling away) or a failure of
        another kind says the track is lost. A new segment seeded with each such scan (what the
        failures did) kept every next scan within centimetres of its keyframe: a held-out HDL-64
        drive pulling away on a highway (world 805) was not trusted for its first 90 scans (100 m),
        with 88 new segments (docs/reliability.md)."""
        self.rest_holds += 1
        message = f"{result.message}; keyframe {keyframe.id} kept until the motion since it shows"
        return self._failed(index, stamp, message, result)

    def _recover(self, index: int, stamp: float, prepared: PreparedCloud, scan: np.ndarray | None,
                 failed: RegistrationResult) -> OdometryStep:
        """Tracking is lost: relocalise against the kept keyframes, else start a new segment.

        The current keyframe has just failed its global search; of the others, the
        ``relocalisation_tries`` nearest the predicted position are searched globally
        (``_global_search``: the quick try while the caller falls behind), nearest first, each with
        the prediction as its prior, and each result reproduced. Count and search bound what a lost
        track costs: a node that spends seconds here loses the overlap with every keyframe while its
        sensor moves on (held-out HDL-64 drive at 10 Hz on one loaded CPU core: lost steps of
        20-30 s with full searches)."""
        predicted = self._predict(stamp)
        kept = sorted(list(self.keyframes)[:-1],
                      key=lambda kf: float(np.linalg.norm(kf.pose[:3, 3] - predicted[:3, 3])))
        for keyframe in kept[:self.cfg.relocalisation_tries]:
            init = geometry.invert_transform(keyframe.pose) @ predicted
            result = self._reproduced(prepared, keyframe.cloud, self._global_search(prepared, keyframe, init))
            result = self.registrar.tilt_restarted(prepared, keyframe.cloud, result)
            refinement = self._map_refined(prepared, scan, keyframe, result)
            if result.success:
                result.message = f"relocalised against keyframe {keyframe.id} after {self.failures} failed scans"
                self.keyframes.remove(keyframe)  # the current keyframe again
                self.keyframes.append(keyframe)
                return self._tracked(index, stamp, prepared, scan, keyframe, result, refinement, event="relocalised")
        return self._new_segment(index, stamp, prepared, scan, failed,
                                 f"tracking lost ({failed.message}); no kept keyframe matches")

    def _new_segment(self, index: int, stamp: float, prepared: PreparedCloud, scan: np.ndarray | None,
                     failed: RegistrationResult, why: str) -> OdometryStep:
        """A new segment (not trusted): the scan becomes its seed keyframe at the last trusted pose
        moved by at most a gap of the last motion, its covariance grown by what the last trusted
        speed and turn rate allow over the time since; the segment is re-seeding (module text)."""
        dt = max(min(stamp - self.last_stamp, self.max_gap()), 0.0)
        pose = self._predict(self.last_stamp + dt)
        speed, turn = self.last_motion
        gap = stamp - self.last_stamp
        # The motion since the last trusted scan is unknown: at most the last speed over the gap.
        unknown = np.diag([(speed * gap + 1.0) ** 2] * 3 + [min(turn * gap + 0.1, math.pi) ** 2] * 3)
        covariance = self.last_cov + unknown
        self.segment += 1
        self._start(stamp)
        self.reseeding = self._falling_behind()  # lock-step callers count max_failures against the seed
        self.last_pose, self.last_cov = pose, covariance
        self._add_keyframe(prepared, scan, pose, stamp, covariance)
        message = (f"{why}: segment {self.segment} starts at the last trusted pose, the motion over the last "
                   f"{gap:.1f} s is unknown")
        kf = self.keyframes[-1]
        return OdometryStep(index, stamp, False, message, None, None, kf.id, stamp, True, failed,
                            prepared.input_frame_xyz(), None, None, None, self.segment, "new_segment")

    def _initialise(self, index: int, prepared: PreparedCloud, scan: np.ndarray | None, stamp: float,
                    event: str) -> OdometryStep:
        pose = np.eye(4)
        self.last_pose, self.last_stamp, self.last_cov = pose, stamp, np.zeros((6, 6))
        self._add_keyframe(prepared, scan, pose, stamp, self.last_cov)
        kf = self.keyframes[-1]
        message = "keyframe initialised" if event == "initialised" else "time went backwards: odometry restarted"
        return OdometryStep(index, stamp, True, message, pose, np.eye(4), kf.id, stamp, True, None,
                            prepared.input_frame_xyz(), self.last_cov.copy(), self.twist.copy(),
                            self.twist_cov.copy(), self.segment, event)

    # ------------------------------------------------------------------ helpers
    def _check(self, points: np.ndarray) -> None:
        pts = np.asarray(points)
        if pts.ndim != 2 or pts.shape[1] < 3:
            raise RegistrationError(f"expected (N, 3) points, got shape {pts.shape}")
        n = int(np.isfinite(pts[:, :3]).all(axis=1).sum())
        if n < self.cfg.min_points:
            raise RegistrationError(f"{n} finite points (need {self.cfg.min_points})")

    def _predict(self, stamp: float) -> np.ndarray:
        """Pose at ``stamp`` extrapolated from the last trusted pose with the last twist, its speed
        changing as over the last ``speed_change_window`` seconds and its turn rate kept, each for
        at most ``max_gap`` seconds (``motion_prior.predicted_pose``: a manoeuvre ends)."""
        dt = stamp - self.last_stamp if self.last_stamp is not None else 0.0
        return predicted_pose(self.last_pose, self.twist, dt, turn_horizon=self.cfg.max_gap,
                              change=self._speed_change())

    def _speed_change(self) -> float:
        """m/s^2 the speed changes at, from the trusted intervals whose middles lie within
        ``speed_change_window`` seconds of the last trusted scan, or two typical scan intervals when
        scans come slower (``motion_prior.speed_window``, ``motion_prior.speed_change``)."""
        window = speed_window(self.cfg.speed_change_window, self._typical_interval())
        if window <= 0 or self.last_stamp is None:
            return 0.0
        recent = [(t, v) for t, v in self.speeds if t >= self.last_stamp - window]
        times, speeds = np.array(recent, dtype=float).reshape(-1, 2).T  # fewer than two: no change
        return speed_change(times, speeds)

    def _add_keyframe(self, prepared: PreparedCloud, scan: np.ndarray | None, pose: np.ndarray, stamp: float,
                      covariance: np.ndarray) -> None:
        self.keyframe_id += 1
        self.keyframes.append(Keyframe(prepared, pose, stamp, self.keyframe_id, covariance, self._undeskewed))
        self._warm_keyframe(prepared)
        if self.local_map is not None:
            self.local_map.add(scan, pose)

    def _warm_keyframe(self, cloud: PreparedCloud) -> None:
        """The next scans register against ``cloud``: its k-d tree, normals, planarity and ICP target
        from now, on a helper thread (the next step waits for what is still being computed when it
        asks); on the CPU, with the local map's helper process, its surface there, ahead of the map
        (``PreparedCloud.surface_in``: Open3D's searches hold the interpreter lock)."""
        if self.local_map is not None and self.local_map.background:
            cloud.surface_in(in_low_priority_process, self.registrar.config)
        in_background(cloud.warm, self.registrar.config, name="keyframe")

    def _motion_current(self, stamp: float | None) -> bool:
        """The prior's twist describes the motion at ``stamp``: a trusted motion is known and
        ``stamp`` lies after the last trusted scan by less than a gap (``max_gap``). A scan from
        after a silence, or from a bag that looped, is not deskewed with the motion of another time."""
        last = self.last_stamp
        return (self.twist_known and stamp is not None and last is not None
                and 0.0 < stamp - last <= self.max_gap())

    def _deskew_seed(self) -> None:
        """A segment's only keyframe, taken before any motion was known, is deskewed now that one is
        (its scan's times kept, ``PreparedScan.undeskewed``): prepared again with the twist, and the
        local map holds it as such. Until it is replaced it is what every scan registers against: a
        sweep drawn over 1 m (10 m/s) biased each of them (held-out drives, docs/evaluation.md)."""
        if len(self.keyframes) != 1 or self.keyframes[0].undeskewed is None or not self.twist_known:
            return
        seed = self.keyframes[0]
        points, times = seed.undeskewed
        seed.undeskewed = None
        again = self._prepared(points, times, self.twist)  # the twist just measured
        if again.error:
            return
        seed.cloud = again.cloud
        self._warm_keyframe(again.cloud)
        if self.local_map is not None:
            self.local_map.clear()
            self.local_map.add(again.map_scan, seed.pose)

    def _needs_keyframe(self, result: RegistrationResult) -> bool:
        T = result.transform
        moved = float(np.linalg.norm(T[:3, 3]))
        angle = math.degrees(math.acos(np.clip((np.trace(T[:3, :3]) - 1) / 2, -1.0, 1.0)))
        return (
            moved >= self.cfg.keyframe_distance
            or angle >= self.cfg.keyframe_rotation_deg
            or result.inlier_ratio < self.cfg.keyframe_min_inlier_ratio
            or result.fitness < self.cfg.keyframe_min_fitness
        )

    def _failed(self, index: int, stamp: float, message: str, result: RegistrationResult | None,
                refinement: Refinement | None = None) -> OdometryStep:
        kf = self.keyframes[-1] if self.keyframes else None
        return OdometryStep(index, stamp, False, message, None, None, kf.id if kf else -1, kf.stamp if kf else 0.0,
                            False, result, kf.cloud.input_frame_xyz() if kf else None, segment=self.segment,
                            refinement=refinement)


def _with_timings(chosen: RegistrationResult, other: RegistrationResult) -> RegistrationResult:
    """``chosen`` with the stage times of both hypotheses (the other's prefixed ``alt_``) and their sum."""
    extra = {f"alt_{k}": v for k, v in other.timings.items() if k != "total"}
    total = chosen.timings.get("total", 0.0) + other.timings.get("total", 0.0)
    chosen.timings = {**chosen.timings, **extra, "total": total}
    return chosen
