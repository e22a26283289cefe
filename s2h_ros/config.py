"""One typed configuration with every default in one place.

``RegistrationConfig`` drives ``s2h_ros.pipeline`` (one scan pair); ``OdometryConfig`` drives the
keyframe odometry of ``s2h_ros.odometry`` (and so the ROS node, whose parameters mirror both
dataclasses field by field, see ``s2h_ros.ros.parameters``). Values are checked on construction so
a wrong type or range fails at start-up with a message naming the field.
"""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field, fields
from typing import Any

# field name -> (allowed values) for string options
_CHOICES: dict[str, tuple[str, ...]] = {
    "features": ("auto", "fcgf", "fpfh"),
    "matcher": ("s2h", "nn", "mutual_nn"),
    "outlier_profit": ("inverse_variance", "scaled_inverse_variance", "slack", "constant"),  # matching.OUTLIER_RULES
    "refine": ("icp", "none"),
    "icp_backend": ("auto", "open3d", "torch"),
}


class ConfigError(ValueError):
    """A configuration value has the wrong type or is out of range."""


def _meta(description: str, lo: float | None = None, hi: float | None = None) -> dict:
    return {"description": description, "range": (lo, hi)}


@dataclass
class RegistrationConfig:
    """SHM_DGR registration of one source cloud to one target cloud."""

    voxel_size: float = field(default=0.3, metadata=_meta("voxel size in metres (KITTI 0.3, 3DMatch 0.05)", 1e-3, 10.0))
    device: str = field(default="cpu", metadata=_meta("torch device: cpu, cuda, cuda:N"))
    features: str = field(default="auto", metadata=_meta("point features: fcgf (learned), fpfh (Open3D, no weights), auto (fcgf from the shipped weights trained at voxel_size: outdoor 0.3 m, indoor 0.05 m; fpfh at other sizes)"))
    weights: str = field(default="", metadata=_meta("FCGF/DGR checkpoint path; empty: the shipped weights for voxel_size"))
    max_points: int = field(default=30000, metadata=_meta("voxels kept per cloud after voxelisation (above it a random subset seeded by seed alone: the same cloud keeps the same voxels in every call)", 100, 10_000_000))

    matcher: str = field(default="s2h", metadata=_meta("correspondences: s2h (soft-to-hard PPM), nn (DGR 1-NN), mutual_nn"))
    k: int = field(default=16, metadata=_meta("feature-space neighbours per point, both directions (S2H support)", 1, 256))
    sinkhorn_iters: int = field(default=5, metadata=_meta("augmented Sinkhorn iterations (S-step)", 1, 1000))
    temperature: float = field(default=0.02, metadata=_meta("S-step score = -||f_x - f_y||^2 / temperature for learned (FCGF) features (docs/matching.md)", 1e-4, 100.0))
    slack_score: float = field(default=-15.0, metadata=_meta("S-step score of 'no partner' (slack row/column); -15 with temperature 0.02: partners farther than squared feature distance 0.3 lose to the slack", -1e3, 1e3))
    fpfh_temperature: float = field(default=0.1, metadata=_meta("temperature when the features are FPFH (flatter than FCGF: 0.02 loses the real KITTI loop pair, 0.1 registers it)", 1e-4, 100.0))
    fpfh_slack_score: float = field(default=-5.0, metadata=_meta("slack score when the features are FPFH", -1e3, 1e3))
    outlier_profit: str = field(default="scaled_inverse_variance", metadata=_meta("H-step outlier profit rule: inverse_variance (the paper's literal 1/var), scaled_inverse_variance (measured default, docs/matching.md), slack, constant"))
    outlier_scale: float = field(default=-1.0, metadata=_meta("scale of the outlier-profit rule; negative: the rule's calibrated default", -1.0, 1e6))
    prior_radius: float = field(default=1.5, metadata=_meta("tracking: metres around each voxel's predicted position searched for S2H candidates (how far the motion prior may be off); ICP from the prediction, when it checks tracking's correction, first takes correspondences this far apart", 0.01, 1000.0))
    prior_max_points: int = field(default=6000, metadata=_meta("tracking: at most this many source voxels (a fixed-seed random subset) are matched around the motion prior; ICP and verification still use every voxel (measured on a held-out HDL-64 drive: tracking registration 191 -> 89 ms per scan on 2 CPU cores, same ATE; docs/performance.md); 0: all", 0, 10_000_000))
    global_max_points: int = field(default=8000, metadata=_meta("global search with a prior (init given, as the odometry gives its prediction): a first try matches at most this many source voxels (a fixed-seed random subset) at the heading hypothesis nearest the prior's yaw, refined and verified on every voxel; it stands only when decisive (trusted, >= 10 % inlier matches), else the full search runs (every voxel, every heading, the safeguard). The feature k-NN costs source x target voxels both ways, so a 64-beam keyframe-to-scan search is about 2x faster (docs/performance.md); 0: always the full search", 0, 10_000_000))
    heading_hypotheses: int = field(default=4, metadata=_meta("global search with learned features: source headings tried about the cloud's z axis (z up, REP-103), as given first, then the turn-around, each refined and verified, until one is trusted with at least 10 % of its matches inliers (without a prior every heading is tried in any case: hear_every_heading); the trusted one with most inliers wins, else the highest fitness (4: 0/180/90/270 deg, any relative heading for features trained within +-45 deg; measured on held-out pairs at 90-180 deg, 4 lidar presets: 12 -> 40 of 40 right; 1: as given only)", 1, 36))
    halfway_headings: bool = field(default=True, metadata=_meta("a global search without a prior (init) whose heading_hypotheses gave no trusted result tries the headings halfway between them as well (4: 45/135/225/315 deg), each with the safeguard: learned features match worst 45 deg from every hypothesis. Development matrices (base seeds 1128 and 1131, Livox and HDL-32 > Livox cells, 100 pairs): 2 more right and trusted, none fewer; fresh held-out matrix (base seed 1132, Livox, HDL-32 > Livox and degenerate HDL-32 cells, 90 pairs): registered 46 -> 50, right and trusted 40 -> 43, 0 wrong trusted either way; a pair trusted in the first round costs the same, one that fails up to twice (docs/evaluation.md)"))
    hear_every_heading: bool = field(default=True, metadata=_meta("a global search without a prior (init) tries every heading hypothesis even after a decisive result at the heading as given, so that the most inlier matches win and the rival test (two poses the scene fits alike are neither trusted) hears them all: rooms, offices, corridors and streets are nearly symmetric under a half or a quarter turn, and the first heading's decisive match can be a turned copy of the truth (development OS1-64 office at 0.3 m voxels: trusted 180 deg / 2.9 m off with 241 inlier matches; the turn-around had 400 at the truth). Costs the other headings where the first was decisive (docs/reliability.md); false: stop at the first decisive heading (the quick try of the odometry, with a prior, always does)"))
    heading_screen_points: int = field(default=3000, metadata=_meta("hear_every_heading: a heading heard after a decisive result is first screened by matching at most this many source voxels (a fixed-seed random subset) there; it is heard in full only when the inlier matches of that estimate, scaled to every voxel, could make a rival to the decisive result (within 2x of min_inliers and of its inlier matches / 1.5) and the estimate does not agree with it (docs/reliability.md); 0: every heading in full", 0, 10_000_000))
    level_above_deg: float = field(default=10.0, metadata=_meta("learned features see a tilted cloud levelled: its up is estimated from its ground (the densest slab 0.1-5 m below the sensor, searched within 45 deg of z; s2h_ros.gravity) and, when it tilts more than this, the features (and the heading hypotheses) are computed on the cloud turned onto it; voxels, transform, ICP and verification stay in the input frames, RegistrationResult.levelled_deg says by how much. Held-out pairs with both clouds tilted 20-45 deg, VLP-16 / HDL-32 / OS1-64 in towns, suburbs, parking lots: 18 -> 24 of 24 registered, 7 -> 24 trusted (docs/evaluation.md); level clouds measured 0.3-1.5 deg and are left as given; 90: never", 0.0, 90.0))
    min_matches: int = field(default=300, metadata=_meta("fewer S2H matches than this: H-step again with the authors' constant outlier profit (safeguard when the calibrated rule keeps too few pairs)", 0, 1_000_000))

    use_inlier_model: bool = field(default=True, metadata=_meta("weight correspondences with the learned inlier network when the weights provide one (the shipped weights do: the context inlier network), then weighted Procrustes; false: RANSAC on the matches"))
    weight_floor: float = field(default=0.05, metadata=_meta("inlier weights below this are zeroed (DGR)", 0.0, 1.0))
    robust_procrustes_iters: int = field(default=10, metadata=_meta("weighted Procrustes on the learned weights is refined by at most this many reweighted fits against the matches it leaves far off (DGR's robust step, Geman-McClure kernel of half inlier_distance; geometry.robust_weighted_procrustes): the learned weights spread over matches a voxel or two off the consensus and the least-squares fit follows them. Held-out worlds, 8 lidars, before ICP: mean RE 0.095-0.516 -> 0.064-0.266 deg, TE 2.98-7.67 -> 1.83-4.84 cm, below RANSAC on the same matches in every sensor; after ICP the same result (docs/evaluation.md); 0: weighted Procrustes alone", 0, 1000))
    safeguard_min_weight: float = field(default=30.0, metadata=_meta("DGR's safeguard: below max(this, safeguard_ratio * source voxels) of inlier weight sum, RANSAC estimates the transform instead; RANSAC also re-estimates when no learned estimate is trusted (RegistrationResult.fallback says which)", 0.0, 1e6))
    safeguard_ratio: float = field(default=0.0, metadata=_meta("see safeguard_min_weight; 0 because the context network's weight sums do not tell its failures apart (validation: right-heading weight sums 10th percentile about 115, failures anywhere from 24 to 590; docs/training.md)", 0.0, 1.0))
    ransac_iters: int = field(default=50000, metadata=_meta("RANSAC iterations of the safeguard fallback", 100, 10_000_000))

    refine: str = field(default="icp", metadata=_meta("refinement after Procrustes: icp (robust point-to-plane) or none"))
    refine_iters: int = field(default=30, metadata=_meta("refinement iterations", 1, 1000))
    refine_tolerance: float = field(default=1e-4, metadata=_meta("ICP stops when its fitness and inlier RMSE change by less than this fraction in one iteration (Open3D's relative criteria; its default 1e-6 ran the 30 iterations nearly always). Held-out VLP-32 drive, 400 scans, one thread: registration ICP 61 -> 34 ms, map refinement 94 -> 56 ms, ATE 1.67 / 1.71 cm, drift 0.074 / 0.070 %; 1e-3 was faster again but drift rose to 0.13 % (docs/performance.md); 0: run every iteration", 0.0, 1.0))
    fine_voxel: float = field(default=0.1, metadata=_meta("metres: a pair registered from its input points (register(), s2h register, s2h eval; not the odometry, which refines against its local map) is polished last by robust point-to-plane ICP (Open3D, Tukey kernel of half voxel_size) on the two input clouds downsampled at this size, correspondences within voxel_size, onto target normals fitted over 5 voxel_size (wider than a sparse lidar's rings), from the refined result; kept when it moves that result by less than half voxel_size and 2 deg (RegistrationResult.fine says so); trust is decided before, at voxel_size. Held-out worlds (matrix base 4321: 8 lidars x 4 families, VLP-16 > OS1-128, the real KITTI loop; 252 pairs, 2-core VM, one thread): mean RE 0.078 deg without the stage, 0.081 with the generalized ICP used before 2026-12-06, 0.066 with this one; TE 2.6 / 2.1 / 2.3 cm (outside highways 1.12 -> 0.94 cm against the old stage; on highways it leaves 10-13 cm along the road); worst cell (VLP-16 parking lot) 0.33 / 0.42 / 0.31 deg; 0.02-0.6 s per pair (docs/evaluation.md, 'The fine stage again'); 0, or not below voxel_size: off", 0.0, 10.0))
    icp_min_planarity: float = field(default=0.6, metadata=_meta("the point-to-plane ICP (the registration's, the local map's) aligns a scan to the target's voxels with a plane: a voxel whose neighbourhood's planarity (s2h_ros.surface) is below this is a line, e.g. a sparse lidar's ring on the ground or a wall, whose normal is any direction across it and whose rows pull the scan onto the target's rings; such a voxel takes a wider neighbourhood's normal where that is planar, keeps its own where the line runs along the rings' axis (poles, edges), else is left out, unless the planes left would hold the translation by less than 4.5 m^2 of surface in some direction (highways, tunnels: s2h_ros.surface.planar_surface); 0: every voxel", 0.0, 1.0))
    icp_backend: str = field(default="auto", metadata=_meta("where the point-to-plane ICP runs (the registration's and the local map's): open3d (CPU), torch (s2h_ros.icp, on device: the same iteration, equal to Open3D within 0.02 mm / 0.001 deg on the real KITTI pair), auto (torch when device is a GPU, else open3d)"))
    inlier_distance: float = field(default=0.6, metadata=_meta("metres: a correspondence is an inlier within this after alignment (DGR: 2 x voxel)", 1e-4, 100.0))
    min_inliers: int = field(default=30, metadata=_meta("success needs at least this many inlier correspondences", 3, 1_000_000))
    few_inliers_floor: int = field(default=10, metadata=_meta("a global search's result with fewer than min_inliers inlier correspondences, down to this many, is still trusted when it fits min_fitness, min_structure_fitness of its source voxels off the ground fit, its weakest constraint is at least weak_constraint and the free-space test passes (max_free_space on): a sparse sensor's features match a dense sensor's few times (held-out matrix, base seed 1130: VLP-16 against OS1-128, 11-27 inlier matches at fitness 0.76-0.81, right); the wrong results with 3-28 matches there were slides along highways and a parking lot, below min_constraint; 0 or >= min_inliers: off", 0, 1_000_000))
    min_fitness: float = field(default=0.5, metadata=_meta("success needs this fraction of source voxels within inlier_distance of the target (wrong lidar alignments measured <= 0.43, right ones >= 0.64; a scan of another world up to 0.50). It measures overlap and the sensor's sampling as much as the alignment: right global results of 16/32-beam sensors 10-20 m apart fit 0.27-0.5 and are refused (21 of the 60 right VLP-16 / HDL-32 pairs in towns, suburbs and parking lots of a held-out matrix), but scans of other worlds reach 0.32-0.39 with 54-143 inlier matches and pass every other test (development worlds; docs/reliability.md), so it stays, and a result between low_fitness_floor and this is decided by its structure off the ground instead (low_fitness_structure)", 0.0, 1.0))
    low_fitness_floor: float = field(default=0.3, metadata=_meta("a result below min_fitness but at or above this fitness is still trusted when low_fitness_structure of its source voxels off the ground (normal not within about 25 deg of z, z up) lie within inlier_distance of the target, every other test passing: the off-ground structure (walls, poles, cars) does not depend on how a sparse sensor's rings sample the ground the way the fitness does, and the ground that lifts a wrong result's fitness is left out (development worlds, never used for evaluation: right results at fitness 0.30-0.50 fit 0.38-0.85 off the ground, 99 of 104 at least 0.45; wrong ones passing every other test, parking lots turned 90-180 deg and scans of another world, 0.14-0.37; docs/reliability.md). A global search's result, with max_free_space on, is asked both ways: the fitness of the target's voxels against the source's too, and the target's structure off the ground against the source (a dense sensor against a sparse one, or a narrow view against a wide one, fits one way and not the other at the truth: development OS1-128 against VLP-16, 0.27-0.51 forward, 0.52-0.86 back); 0 or >= min_fitness: off", 0.0, 1.0))
    low_fitness_structure: float = field(default=0.45, metadata=_meta("see low_fitness_floor: the fraction of the off-ground source voxels within inlier_distance that a result between low_fitness_floor and min_fitness needs to be trusted", 0.0, 1.0))
    low_fitness_inliers: int = field(default=100, metadata=_meta("a global search's result in the band of low_fitness_floor whose structure off the ground does not fit low_fitness_structure either way is still trusted on its matches when it has at least this many inlier correspondences and lays at most low_fitness_free_space of its seen structure (at least 100 voxels of it seen) where the target's sensor saw through (max_free_space on): a view that overlaps its target by a third fits about a third at the truth, and its structure off the ground (walls, furniture, racks) no more, so the structure cannot tell little overlap from a wrong pose (development worlds 6000-6012, depth camera: right results 0.000-0.005 seen through; ICP-converged wrong poses in the band 0.000-0.78, 3 of 77 at most 0.01, which the matches and the rival test are left to refuse; docs/reliability.md, 'Many matches and free space for views that overlap little'); 0: off", 0, 1_000_000))
    low_fitness_free_space: float = field(default=0.01, metadata=_meta("see low_fitness_inliers: the free-space fraction such a result may reach at most (max_free_space applies to every other global result)", 0.0, 1.0))
    back_free_space: float = field(default=1.0, metadata=_meta("a global search's result in the band of low_fitness_floor whose own structure off the ground does not fit low_fitness_structure but the target's does against it (the way back: a dense sensor against a sparse one, a narrow view against a wide one) is trusted only if at most this fraction of its seen structure lies where the target's sensor saw through (the lower of this and max_free_space): the way back fits another place's look-alike too (development worlds 6019 / 6719, two depth-camera rooms of different worlds: trusted at fitness 0.46, 0.49 of the target's structure fitting, 0.047 seen through), where the right results of the development mixed-sensor cells lay 0.002-0.018 of theirs (docs/reliability.md, 'Two more ways to stand on little overlap'); 1.0: off (max_free_space alone applies, whatever it is set to), as shipped: held out, 0.03 cost one right mixed-sensor pair of 36 (a Livox target lays 0.02-0.03 of a right result where it saw through) and changed nothing else", 0.0, 1.0))
    grey_zone_inliers: int = field(default=0, metadata=_meta("a global search's result in the grey zone of the constraint measure (weakest constraint below weak_constraint, the slide test passed), away from zero motion, whose structure off the ground does not fit min_structure_fitness is still trusted on its matches when it has at least this many inlier correspondences and lays at most low_fitness_free_space of its seen structure (at least 100 voxels of it seen) where the target's sensor saw through (max_free_space on): indoors a wall, a shelf or a corridor is the weakest direction of many right results, and a depth camera's view overlapping its target by a third fits off the ground no better than its overlap (development worlds 6014-6017: 12 right results in the grey zone, 5 refused at 0.31-0.45 off the ground); 0: off, as shipped: it carried one right result in 150 development registrations and changed no pair of a held-out indoor matrix (docs/reliability.md, 'Two more ways to stand on little overlap')", 0, 1_000_000))
    min_structure_fitness: float = field(default=0.5, metadata=_meta("a global search's result at zero motion (the sensors less than inlier_distance apart) is trusted only if this fraction of the source voxels off the ground (normal not within about 25 deg of z, z up) also lies within inlier_distance of the target: the ground's sensor pattern (rings, rosette) aligns with itself at zero motion whatever the scene (held-out Livox pair 15.6 m apart: fitness 0.51, 0.38 off the ground, TE 15.4 m, had been trusted); in the grey zone of the constraint measure (below weak_constraint) such a result is not trusted at all (see weak_constraint); and away from zero motion too, a result in that grey zone must have this fraction of its voxels off the ground fit: the ground and rows of cars or facades running the same way carry a wrong result's fitness there (held-out Livox parking-lot pair sharing nothing at the truth: trusted 93 deg / 7.8 m off at fitness 0.59, 0.33 off the ground; development worlds, matrix base seed 1128: right results in the grey zone 0.68-0.93, wrong ones outside highways 0.11-0.47); tracking, confirmed by the motion prior, is exempt; 0: off", 0.0, 1.0))
    max_free_space: float = field(default=0.08, metadata=_meta("a global search's result is trusted only if at most this fraction of the source voxels off the ground that it lays in directions the target's sensor saw lie where that sensor's rays passed, nearer than its return by more than inlier_distance plus 2 cm per metre (s2h_ros.free_space): the target would have seen them. Right results leave almost none there whatever their overlap, wrong ones that the ground and structure running the same way carry past the other tests many (development worlds, matrix base seed 1128, 4 sensors x town, suburban, parking lot: right results 0.000-0.022, wrong ones with 30 or more inlier matches 0.14-0.51; the real KITTI loop pair 0.002 and 3DMatch demo pair 0.005 at the truth; docs/reliability.md). The clouds must each be one sweep seen from its frame's origin (a raw scan, a depth image): 0 (off) for fused maps or fragments from many viewpoints; tracking is exempt", 0.0, 1.0))
    max_repetition: float = field(default=0.9, metadata=_meta("a global search's result is trusted only if no copy of it shifted sideways (x, y by 5-50 inlier distances: 0.5-5 m indoors, 3-30 m outdoors, z up; to 120, 72 m outdoors, beyond a highway's lamp spacing, for a result whose weakest constraint is below weak_constraint) fits the scene's structure with this fraction or more of the result's own fit, each point weighted by how much its surface constrains the shift: repeated structure (pallet-rack bays every 2.4-2.9 m, colonnades) supports both poses (s2h_ros.repetition; measured on development worlds never used for evaluation: right results 0.12-0.74 when trusted, up to 0.94 among untrusted ones, the real 3DMatch demo pair 0.86 (0.85 refused it); results a bay, a room or a highway slide off 1.1-9.9 for 12 of 15; docs/reliability.md); a copy that would fail the free-space test itself (more than max_free_space of the scan laid where the target's rays passed) is set aside, not a pose the data support: narrow views (Livox) sharing a fifth of the scene had right results refused at 0.94-1.58 by copies 13-26 m along the street that the target saw through (docs/reliability.md, 'A copy the target saw through'); tracking, confirmed by the motion prior, is exempt while the prediction is fresh (at most odometry.max_gap seconds old and not a relocalisation's twist); after a stale one it must also explain the scan clearly better than ICP from the copy (a stale prediction 13 m short vouched for a slide along a street in the 10 Hz soak); 0: off", 0.0, 10.0))
    tilt_restart_deg: float = field(default=0.0, metadata=_meta("a sensor with rings far apart (16-32-beam lidars, s2h_ros.scan_pattern): a result that tilts the scan this much or more against the target (a swaying handheld or legged sensor) is refined again from starts tilted this much either way about the sensor's x and y axes, and the restart whose scan lies closest to the target's surfaces (a fraction of the voxels within voxel_size / 6 of their neighbour's plane) replaces it when it gains at least 0.01: ICP moves a sparse sensor's tilt by about 1 deg in 30 iterations and can stop between the rings' aliases (a held-out handheld VLP-16 walk: tracking trusted 2.1-4.0 deg off; docs/reliability.md). Off by default since ICP aligns to the target's planes (icp_min_planarity): on 15 held-out handheld walks the restarts then changed 3 of 281 trusted steps, the walks' errors alike to 0.001 deg, at 8-40 % more time a scan; 2.5 is the setting measured with icp_min_planarity 0; 0: off", 0.0, 45.0))
    seed: int = field(default=0, metadata=_meta("random seed (subsampling, RANSAC)", 0, 2**31 - 1))
    min_constraint: float = field(default=0.007, metadata=_meta("success needs the geometry to constrain every direction of the pose: the weakest eigenvalue of the scale-free point-to-plane information matrix at the result, each row weighted by the planarity of its target neighbourhood (s2h_ros.degeneracy; measured on held-out drives: right results in streets and rooms 0.0075-0.15; analytic tunnels, two walls and ground, open fields, and ring-aligned zero-motion results in simulated tunnels below 0.007; 16-beam highways overlap, docs/reliability.md) must reach this, else the result is degenerate and not trusted; 0: off", 0.0, 1.0))
    weak_constraint: float = field(default=0.03, metadata=_meta("a result whose weakest constraint is below this (but above min_constraint) must also pass the slide test (slide_margin): there the constraint measure does not tell a sparse lidar's slide from the truth (development worlds: 16-beam highway slides 2-7 m at zero motion 0.0078-0.0097, the truth 0.0085-0.015, right results elsewhere from 0.0075; right results in ordinary streets and rooms 0.035-0.29, so this costs them nothing); and a global search's result at zero motion (the sensors less than inlier_distance apart) below it is not trusted: there the sensor's own pattern lies on its twin (rings on the ground, rails and walls; a wall seen at a grazing angle drawn as columns that look like poles) and every fit favours rest (held-out HDL-64 tunnel, world 785, scans 11.4 m apart: trusted at zero motion with 0.93 of the slide test's structure fitting, as a sensor at rest fits its poles, 0.90-0.96), so rest is left to the motion prior to confirm (tracking is not asked), and the odometry keeps its keyframe through such scans until the motion since it shows; 0: off", 0.0, 1.0))
    slide_margin: float = field(default=0.1, metadata=_meta("below weak_constraint: the result is degenerate and not trusted when the scan's structure not extended along the weakest direction (poles, sign posts, ends of walls; s2h_ros.degeneracy.slide_evidence) fits the keyframe's this much better (a fraction of those voxels within inlier_distance / 2) at another position along it (half an inlier distance to 50 away) than at the result (development worlds, never used for evaluation: right results -0.13 to 0.00, 16-beam highway slides of 0.7-9.9 m +0.14 to +0.79, found at their true offset)", 0.0, 1.0))
    slide_recovery: bool = field(default=True, metadata=_meta("a global search's or tracking's result refused as a slide (weakest constraint below weak_constraint; s2h_ros.degeneracy.slide_evidence) is moved along its weakest direction to where the structure that would show the slide (poles, signs, ends of walls) fits best, when that position gains slide_margin over the result and stands out by slide_margin from every position two inlier distances or more away (evenly spaced poles do not), refined by ICP and verified by every test again; RegistrationResult.slid_m says how far it moved (held-out highways: docs/reliability.md); false: such results stay refused"))

    def __post_init__(self) -> None:
        _validate(self)

    def s_step(self, feature_kind: str) -> tuple[float, float]:
        """``(temperature, slack_score)`` of the S-step for ``fcgf`` or ``fpfh`` features."""
        if feature_kind == "fpfh":
            return self.fpfh_temperature, self.fpfh_slack_score
        return self.temperature, self.slack_score

    def replace(self, **changes: Any) -> "RegistrationConfig":
        return dataclasses.replace(self, **changes)


@dataclass
class OdometryConfig:
    """Scan-to-keyframe odometry: when to take a new keyframe and when to give up on one."""

    keyframe_distance: float = field(default=5.0, metadata=_meta("new keyframe after this much travel from the current one (m)", 0.0, 1e4))
    keyframe_rotation_deg: float = field(default=20.0, metadata=_meta("new keyframe after this much rotation (deg)", 0.0, 360.0))
    keyframe_min_inlier_ratio: float = field(default=0.3, metadata=_meta("new keyframe when the inlier ratio falls below this", 0.0, 1.0))
    keyframe_min_fitness: float = field(default=0.6, metadata=_meta("new keyframe when the fitness falls below this, before it reaches registration.min_fitness: a sparse sensor's overlap with its keyframe shrinks fast (held-out VLP-16 drive, 2 m steps: fitness 0.79, 0.70, 0.62, 0.54, then 0.49 and lost)", 0.0, 1.0))
    max_failures: int = field(default=3, metadata=_meta("consecutive failed scans before tracking counts as lost: relocalisation against the kept keyframes, else a new segment", 1, 1000))
    min_points: int = field(default=100, metadata=_meta("scans with fewer valid points are rejected", 3, 10_000_000))
    tracking: bool = field(default=True, metadata=_meta("while the motion prior is trusted, S2H candidates come from around each voxel's predicted position (fast); the global feature search runs at start-up, after failures, gaps and relocalisation"))
    deskew: bool = field(default=True, metadata=_meta("motion-compensate a scan that carries per-point times (PointCloud2 fields t, time, timestamp, time_stamp or offset_time; s2h_ros.deskew) with the constant-velocity prior before registering it, once a trusted motion is known; scans without times are registered as given (RegistrationResult.deskewed says which)"))
    use_motion_prior: bool = field(default=True, metadata=_meta("check each global result against ICP from the motion prior's prediction (the better explanation wins, a tie is not trusted); that ICP alone is accepted when the global result fails"))
    max_gap: float = field(default=1.0, metadata=_meta("seconds without a trusted scan after which the motion prior is not trusted (a failure then means lost at once), unless gap_periods scan intervals are longer; stamps this far backwards reset the odometry; also the longest a prediction carries the last turn rate (a turn ends: on real KITTI trajectories 3 s ahead, heading errors p50 4.7-6.2 -> 3.5-4.6 deg with 1 s)", 0.01, 3600.0))
    speed_change_window: float = field(default=1.0, metadata=_meta("seconds of trusted motion whose speeds (one per registered interval) give the rate at which the speed changes (braking, pulling away; their least-squares line, at most 5 m/s^2, from 0.5 m/s on), carried in a prediction for at most max_gap seconds: a node behind its sensor predicts 1-1.5 s ahead: on real KITTI trajectories 1.3 s ahead, poses predicted more than prior_radius off 0-33 % -> 0-18 % per sequence, median error 0.25-0.92 -> 0.16-0.67 m (s2h bench prediction); widened to two typical scan intervals when scans come slower, so that a node taking a scan every 1.2 s has two speeds (motion_prior.speed_window; real KITTI 1.2 s ahead: beyond prior_radius 14-43 % -> 8-34 %); 0: constant speed", 0.0, 60.0))
    agree_distance: float = field(default=0.0, metadata=_meta("metres: two hypotheses of one scan (the global search, tracking, ICP from the prediction, a second RANSAC seed, the local map's refinement) closer than this (and 2 deg) agree; 0: half the registration's inlier_distance (0.3 m at the outdoor 0.6). Depth cameras at 0.05 m voxels need more: there ICP from the prediction and a second RANSAC seed land 5-15 cm from right results, so config/depth_camera.yaml sets 0.1 (held-out warehouse drives, 120 scans: needless rejections 12 -> 1, 0 wrong either way; docs/reliability.md)", 0.0, 100.0))
    ambiguity_margin: float = field(default=0.05, metadata=_meta("two disagreeing hypotheses (global, motion prior): the winner must explain this much more of the scan within inlier_distance / 2, else neither is trusted", 0.0, 1.0))
    relocalisation_keyframes: int = field(default=5, metadata=_meta("recent keyframes kept to relocalise against when tracking is lost", 1, 1000))
    map_keyframes: int = field(default=5, metadata=_meta("fine refinement: a trusted pose is refined against a local map of the last this many keyframe scans (robust point-to-plane ICP at map_voxel, s2h_ros.local_map); a refinement that moves it by more than the registration's agreement tolerance is not used and the scan is not trusted (the map and the keyframe disagree); 0: poses are the registration's against the current keyframe alone", 0, 1000))
    map_voxel: float = field(default=0.0, metadata=_meta("fine refinement: metres, the downsampling of scans and of the local map; 0: the registration's voxel_size (0.3 m outdoors; measured at 0.15 m: half the drift, 2.2x the time)", 0.0, 10.0))
    map_in_background: bool = field(default=True, metadata=_meta("fine refinement: a new keyframe's local map is built in a low-priority helper process and used from the first refinement after it is ready (until then the previous map: the scans keep the cores), a scan that becomes a keyframe waits for it (s2h_ros.local_map; held-out HDL-64 drive at 10 Hz on 2 cores: latency p95 554-589 -> 422-482 ms, the same drift); false: built on a helper thread and the next refinement waits for it, so that each pose is independent of timing (offline evaluation)"))
    relocalisation_tries: int = field(default=2, metadata=_meta("when tracking is lost, at most this many kept keyframes besides the current one are searched, nearest the predicted position first (each failed full search costs 6-8 s on a 2-core CPU while the sensor moves on; a node that falls behind its sensor runs the quick try instead, about 1 s)", 0, 1000))
    gap_periods: float = field(default=3.0, metadata=_meta("a gap is also counted in scans: the motion prior stays trusted up to this many typical scan intervals (median of the last 10 stamp differences) when that is longer than max_gap, e.g. when the node falls behind its sensor and takes a scan every 1-3 s; 0: max_gap alone", 0.0, 1000.0))

    def __post_init__(self) -> None:
        _validate(self)

    def replace(self, **changes: Any) -> "OdometryConfig":
        return dataclasses.replace(self, **changes)


def _field_type(f: dataclasses.Field) -> type:
    """The field's type (annotations are strings under ``from __future__ import annotations``)."""
    return f.type if isinstance(f.type, type) else {"float": float, "int": int, "str": str, "bool": bool}[f.type]


def _validate(cfg: Any) -> None:
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        expected = _field_type(f)
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
            setattr(cfg, f.name, value)
        if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            raise ConfigError(f"{f.name}: expected {expected.__name__}, got {type(value).__name__} {value!r}")
        if expected is float and not math.isfinite(value):
            raise ConfigError(f"{f.name}: must be finite, got {value!r}")
        lo, hi = f.metadata.get("range", (None, None))
        if lo is not None and not (lo <= value <= hi):
            raise ConfigError(f"{f.name}: {value!r} is outside [{lo}, {hi}]")
        if f.name in _CHOICES and value not in _CHOICES[f.name]:
            raise ConfigError(f"{f.name}: {value!r} is not one of {', '.join(_CHOICES[f.name])}")
    dev = getattr(cfg, "device", None)
    if dev is not None:
        if not (dev == "cpu" or dev == "cuda" or (dev.startswith("cuda:") and dev[5:].isdigit())):
            raise ConfigError(f"device: {dev!r} is not cpu, cuda or cuda:N")


def cpu_threads(requested: int, device: str) -> int:
    """CPU threads for registration on ``device`` (torch's, BLAS's and scipy's: ``use_cpu_threads``):
    ``requested`` when > 0; else on a CPU all cores but one (at least 1; the other serves the
    executor and DDS), and on a GPU 1: the device path's CPU work is Open3D's and scipy's, and idle
    torch threads only take cores from them and from the kernel launches (H200, held-out 64-beam
    drive, lock-step, same machine: step p50 200 ms with 15 threads, 152 ms with 1; FCGF's
    preparation 71 -> 28 ms; docs/performance.md)."""
    if requested > 0:
        return requested
    return 1 if device != "cpu" else max(1, (os.cpu_count() or 1) - 1)


_CPU_THREADS: int | None = None  # set by use_cpu_threads


def use_cpu_threads(threads: int) -> None:
    """Run torch's intra-op work, the BLAS pools of numpy and scipy (threadpoolctl, which also sets
    the calling thread's OpenMP count) and scipy's k-d tree queries and FFTs (``cpu_workers``) on
    ``threads`` threads, for the whole process from now on.

    torch's setting alone leaves numpy's and scipy's OpenBLAS at all cores: its idle threads spin
    after every matrix product of the odometry's step (verification, Procrustes, degeneracy) and
    take the core that its other thread (the next scan's features) runs on. Held-out simulated
    HDL-64 drive, 2-core VM, ``config/cpu.yaml`` lock-step: 3.5 -> 3.8-4.4 scans/s with one BLAS
    thread, the same poses (docs/performance.md, "One BLAS thread")."""
    global _CPU_THREADS
    # An OpenMP runtime loaded after this (torch's, which Open3D shares) takes it as the count for
    # threads that never set their own (s2h eval calls this before importing torch).
    os.environ["OMP_NUM_THREADS"] = str(threads)
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(threads)
    threadpool_limits(limits=threads)
    _CPU_THREADS = threads


def cpu_workers() -> int:
    """``workers`` for scipy's parallel calls (cKDTree queries, FFTs): the threads ``use_cpu_threads``
    set, or -1 (all cores) when nothing set them."""
    return _CPU_THREADS or -1


def config_from_dict(cls: type, values: dict[str, Any]) -> Any:
    """Build ``cls`` from a flat dict, rejecting unknown keys by name."""
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ConfigError(f"unknown {cls.__name__} keys: {', '.join(unknown)} (known: {', '.join(sorted(names))})")
    return cls(**values)


def configs_from_params_files(paths, node: str = "registration_node") -> tuple["RegistrationConfig", "OdometryConfig"]:
    """The registration and odometry settings that ``node`` started with these ROS 2 parameter
    files (YAML, applied in order over the defaults, as ``--params-file`` does) runs with: their
    ``registration.*`` and ``odometry.*`` keys; the node's other parameters are not read here.
    Unknown keys and bad values raise :class:`ConfigError` naming them (and the file)."""
    from pathlib import Path

    import yaml

    values: dict[str, dict[str, Any]] = {"registration": {}, "odometry": {}}
    for path in paths:
        data = yaml.safe_load(Path(path).read_text()) or {}
        params = (data.get(node) or {}).get("ros__parameters") or {}
        for group, given in values.items():
            section = params.get(group) or {}
            if not isinstance(section, dict):
                raise ConfigError(f"{path}: {node}.ros__parameters.{group} must be a mapping")
            given.update(section)
    return config_from_dict(RegistrationConfig, values["registration"]), config_from_dict(OdometryConfig, values["odometry"])


def parse_bool(text: str) -> bool:
    """``1/true/yes/on`` or ``0/false/no/off`` (any case) -> bool; anything else raises ValueError."""
    value = text.lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true/false, got {text!r}")


def parse_overrides(cls: type, text: str) -> dict[str, Any]:
    """``"key=value+key=value"`` -> typed values for ``cls``'s fields (the CLI's config variants).

    ``"matcher=nn+k=8"`` -> ``{"matcher": "nn", "k": 8}``; unknown keys and unparsable values
    raise :class:`ConfigError` naming them.
    """
    types = {f.name: _field_type(f) for f in fields(cls)}
    out: dict[str, Any] = {}
    for item in filter(None, text.split("+")):
        key, sep, raw = item.partition("=")
        if not sep or key not in types:
            raise ConfigError(f"{item!r}: expected KEY=VALUE with KEY one of {', '.join(sorted(types))}")
        kind = types[key]
        try:
            out[key] = parse_bool(raw) if kind is bool else kind(raw)
        except ValueError:
            raise ConfigError(f"{key}: cannot read {raw!r} as {kind.__name__}") from None
    return out


def describe(cls: type) -> list[tuple[str, type, Any, str, tuple]]:
    """(name, type, default, description, (lo, hi)) for every field: what the ROS node declares."""
    out = []
    for f in fields(cls):
        out.append((f.name, _field_type(f), f.default, f.metadata.get("description", ""), f.metadata.get("range", (None, None))))
    return out
