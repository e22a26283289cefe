"""What one registration returns (:class:`RegistrationResult`) and how a refinement moved it
(:class:`Refinement`); no ROS. ``to_dict`` gives the JSON the CLI and the benchmarks write."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from s2h_ros import geometry
from s2h_ros.degeneracy import Degeneracy, SlideEvidence
from s2h_ros.free_space import FreeSpace
from s2h_ros.repetition import Repetition


@dataclass
class Refinement:
    """A refinement of a pose that may only polish it: used when it moves the pose less than a
    tolerance (the pair's fine stage, ``RegistrationResult.fine``; the odometry's local map,
    ``s2h_ros.local_map``), else the pose stands and ``message`` says why."""

    pose: np.ndarray  # (4, 4) the refined pose (or transform); the given one when not used
    used: bool  # the refined pose replaced the given one
    message: str  # why not, when not used ("" otherwise)
    moved_m: float  # how far the refinement moved the pose (translation, metres)
    moved_deg: float  # and by how much it turned it
    ms: float
    refined: np.ndarray | None = None  # (4, 4) where the refinement went, used or not; None when it did not run
    map_behind: int = 0  # the odometry's local map: keyframes added since the map it aligned to was started

    @classmethod
    def bounded(cls, given: np.ndarray, refined: np.ndarray, max_move_m: float, max_turn_deg: float,
                what: str, ms: float) -> "Refinement":
        """``refined`` (4, 4) used in place of ``given`` when it moves it by less than ``max_move_m``
        and ``max_turn_deg``; else ``given`` stands and the message names ``what`` moved how far."""
        turn, move = geometry.transform_errors(refined, given)
        message = ""
        if move >= max_move_m or turn >= max_turn_deg:
            message = (f"{what} {move:.2f} m / {turn:.1f} deg (more than {max_move_m:.2f} m / "
                       f"{max_turn_deg:.1f} deg): not used")
        return cls(given if message else refined, not message, message, float(move), float(turn), ms, refined)

    def to_dict(self) -> dict:
        return {"used": self.used, "message": self.message, "moved_m": self.moved_m, "moved_deg": self.moved_deg,
                "ms": self.ms}


@dataclass
class RegistrationResult:
    """What ``register`` found; ``transform`` maps source points into the target frame."""

    transform: np.ndarray  # (4, 4) float64
    success: bool
    message: str
    correspondences: np.ndarray  # (K, 2) int64: (source voxel index, target voxel index)
    weights: np.ndarray  # (K,) float32 inlier weights used by Procrustes
    source_xyz: np.ndarray  # (Ns, 3) voxels the indices refer to, input frame (float64 if centred)
    target_xyz: np.ndarray  # (Nt, 3)
    num_candidates: int = 0
    num_inliers: int = 0
    inlier_ratio: float = 0.0
    fitness: float = 0.0
    fitness_fine: float = 0.0  # fraction of source voxels within inlier_distance / 2 (compares hypotheses)
    search: str = "global"  # candidate search: global (feature k-NN), prior (tracking) or icp (refine only)
    heading_deg: float = 0.0  # source heading hypothesis (about z) whose features found the matches
    weight_sum: float = 0.0
    used_fallback: bool = False  # RANSAC (DGR's safeguard) estimated the transform, not the learned weights
    fallback: str = ""  # why: "no inlier network", "inlier weight sum below N", "learned estimate not trusted"
    feature_kind: str = ""
    features_used: str = ""  # the features with their weight file, e.g. "fcgf (s2h_compact_indoor.pt)"
    # (source, target): degrees each cloud's features were levelled by (its ground's tilt from z,
    # ``level_above_deg``); 0 where the features saw the cloud as given.
    levelled_deg: tuple[float, float] = (0.0, 0.0)
    inlier_mask: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))  # (K,) within inlier distance
    timings: dict[str, float] = field(default_factory=dict)  # ms per stage, plus "total"
    # (6, 6) covariance of the transform's left perturbation [translation, rotation] in the target
    # frame (point-to-plane normal equations at the result, scaled by the residual variance).
    covariance: np.ndarray | None = None
    # input points dropped: {source,target}_{non_finite,out_of_range} -> count
    dropped_points: dict[str, int] = field(default_factory=dict)
    # The weakest direction of the point-to-plane normal equations at the result and how much the
    # geometry constrains it (s2h_ros.degeneracy); below RegistrationConfig.min_constraint: not trusted.
    degeneracy: Degeneracy | None = None
    # Below RegistrationConfig.weak_constraint: whether the structure that would show a slide along
    # the weakest direction agrees (s2h_ros.degeneracy.slide_evidence); None where not asked.
    slide: SlideEvidence | None = None
    # The fraction of the source voxels off the ground within inlier_distance (structure_fitness),
    # where it was asked: a result below min_fitness (trusted only with low_fitness_structure of
    # it) or a global search's result at zero motion or below weak_constraint; None elsewhere.
    structure_fit: float | None = None
    # A global search's result refused because it lies at zero motion where the geometry leaves a
    # direction nearly free (``trust.rest_doubt``): rest, or the sensor's own pattern lying on
    # its twin; only a motion prior tells them apart. The odometry keeps its keyframe through such
    # scans, so that the motion since it grows until a search can see it.
    rest_unconfirmed: bool = False
    # Of the source voxels off the ground that a global search's result lays in directions the
    # target's sensor saw, the fraction where its rays passed (s2h_ros.free_space); None where not
    # asked (tracking, max_free_space off, a result refused before it).
    free_space: FreeSpace | None = None
    # The strongest sideways-shifted copy of the result (s2h_ros.repetition), asked of a global
    # search's and of tracking's after a stale prediction (s2h_ros.odometry); None where not asked
    # (tracking with a fresh prediction, ICP only, or a result already refused by the tests before it).
    repetition: Repetition | None = None
    # The fine stage of a pair registered from its input points (``fine_voxel``): robust
    # point-to-plane ICP on the input clouds from the refined result; ``transform`` is its result
    # when ``fine.used``.
    # None where it did not run (prepared clouds, as the odometry gives; refine none; fine_voxel off).
    fine: Refinement | None = None
    # Metres along the weakest direction (target frame) a global search's result refused as a slide
    # was moved to where its poles and signs fit before it was refined and verified again
    # (``slide_recovery``, ``Registrar._slide_recovered``); None where it was not moved.
    slid_m: float | None = None
    # Degrees a restart tilted from this result moved it (``tilt_restart_deg``, ``Registrar.tilt_restarted``);
    # None where no restart replaced it.
    restarted_deg: float | None = None
    # Where the slide recovery moved this refused result, refused there too (``slid_m`` set): the
    # global search returns such moves when several agree (``hypotheses.agreed_move``).
    refused_move: RegistrationResult | None = field(default=None, repr=False)

    def to_dict(self) -> dict:
        return {
            "transform": self.transform.tolist(),
            "success": self.success,
            "message": self.message,
            "num_source_voxels": int(len(self.source_xyz)),
            "num_target_voxels": int(len(self.target_xyz)),
            "num_candidates": self.num_candidates,
            "num_correspondences": int(len(self.correspondences)),
            "num_inliers": self.num_inliers,
            "degeneracy": self.degeneracy.to_dict() if self.degeneracy is not None else None,
            "repetition": self.repetition.to_dict() if self.repetition is not None else None,
            "slide_evidence": self.slide.to_dict() if self.slide is not None else None,
            "structure_fit": self.structure_fit,
            "rest_unconfirmed": self.rest_unconfirmed,
            "free_space": self.free_space.to_dict() if self.free_space is not None else None,
            "fine": self.fine.to_dict() if self.fine is not None else None,
            "slid_m": self.slid_m,
            "restarted_deg": self.restarted_deg,
            "inlier_ratio": self.inlier_ratio,
            "fitness": self.fitness,
            "fitness_fine": self.fitness_fine,
            "weight_sum": self.weight_sum,
            "used_fallback": self.used_fallback,
            "fallback": self.fallback,
            "feature_kind": self.feature_kind,
            "features_used": self.features_used,
            "levelled_deg": list(self.levelled_deg),
            "search": self.search,
            "heading_deg": self.heading_deg,
            "timings_ms": self.timings,
            "dropped_points": self.dropped_points,
            "correspondences": self.correspondences.tolist(),
            "weights": self.weights.tolist(),
        }
