"""Cached S2H correspondences of frozen FCGF: the training data of the context inlier network.

With FCGF frozen (the paper's supplement trains SHM_DGR's inlier network that way), the matches a
pair yields do not change during training, so they are computed once, exactly as the pipeline
computes them (``correspondences.match_features`` with ``RegistrationConfig``'s values), and the network
then trains on them at thousands of steps per minute on a CPU instead of one FCGF + S2H pass per
step.

Each synthetic pair (training worlds, seeds 1000+; validation 2000+; a random sensor and scene
family per world) gives two samples, the two ways the pipeline matches:

- ``global``: the source turned by a random heading, matched by the global feature k-NN support
  at the heading hypothesis the pipeline would try (``heading_hypotheses``: the multiple of 90 deg
  nearest the true relative heading; with probability ``wrong_heading`` a wrong one, whose
  matches are nearly all outliers, so that the network learns to say "none of these");
- ``prior``: tracking, matched on ``matching.prior_support`` around a motion prior that is the
  truth perturbed by a typical constant-velocity error.

A sample stores the matched points ``xs (K, 3)``, ``ys (K, 3)`` (float32, local frames), the
S-step probability of each match, ``T_gt`` (xs -> ys frame) and the source voxel count (the
safeguard's scale). Shards are ``DIR/<split>/matches_<seed>.npz`` plus a JSON index, written
atomically after each world so that an interrupted run keeps its worlds.
"""
from __future__ import annotations

import io
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from s2h_ros import geometry
from s2h_ros.config import RegistrationConfig
from s2h_ros.outputs import write_bytes
from s2h_ros.training.data import RESERVED_EVAL_SEEDS, overlaps_enough

FORMAT = "s2h_ros.match_cache/1"
SEARCHES = ("global", "prior")
PRIOR_SIGMA_SHARE = 1.0 / 6.0  # the tracking samples' prior error (sigma) as a share of prior_radius
OVERLAP_CANDIDATES = 4  # with min_overlap: pairs drawn per wanted pair before the overlap filter


@dataclass
class MatchSample:
    """The S2H matches of one pair as the pipeline would weight them."""

    xs: np.ndarray  # (K, 3) float32 matched source voxels, source frame
    ys: np.ndarray  # (K, 3) float32 matched target voxels, target frame
    probs: np.ndarray  # (K,) float32 S-step probability of each match
    T_gt: np.ndarray  # (4, 4) float64: ys ~ T_gt xs for inliers
    num_source: int  # source voxels (the safeguard threshold scales with it)
    search: str  # "global" or "prior"
    heading_right: bool  # global: the heading hypothesis is the right one (prior: True)
    name: str = ""

    def residuals(self) -> np.ndarray:
        """``(K,)`` ||T_gt xs - ys|| in metres."""
        return np.linalg.norm(geometry.apply_transform(self.T_gt, self.xs.astype(np.float64)) - self.ys, axis=1)


def pair_samples(registrar, source: np.ndarray, target: np.ndarray, T_gt: np.ndarray, rng: np.random.Generator,
                 wrong_heading: float = 0.2, prior_sigma: float | None = None, prior_yaw_sigma_deg: float = 1.0,
                 name: str = "") -> list[MatchSample]:
    """The ``global`` and ``prior`` samples of one pair (``(N, 3)`` clouds, ``T_gt`` source -> target).
    ``prior_sigma``: metres of the prior's horizontal error; default ``PRIOR_SIGMA_SHARE`` of the
    registrar's ``prior_radius`` (0.25 m outdoors, 0.04 m with config/depth_camera.yaml's 0.25 m)."""
    from s2h_ros.correspondences import match_features

    cfg = registrar.config
    if prior_sigma is None:
        prior_sigma = PRIOR_SIGMA_SHARE * cfg.prior_radius
    turn = float(rng.uniform(-180.0, 180.0))  # the sensor may face any way relative to the target
    source = geometry.apply_transform(geometry.yaw_transform(turn), source.astype(np.float64)).astype(np.float32)
    T = np.asarray(T_gt, np.float64) @ geometry.yaw_transform(-turn)
    src = registrar.prepare(source, "source")
    tgt = registrar.prepare(target, "target")
    if src.origin.any() or tgt.origin.any():
        raise ValueError("training pairs are expected near the origin")
    samples = []
    # Global: the hypothesis h whose turned source is nearest the target's heading (|yaw - h| <= 45).
    hypotheses = sorted(registrar.headings(src, None))
    right = min(hypotheses, key=lambda h: abs(geometry.angle_difference_deg(geometry.yaw_deg(T), h)))
    heading = right
    if rng.uniform() < wrong_heading and len(hypotheses) > 1:
        heading = float(rng.choice([h for h in hypotheses if h != right]))
    feats = src.features if heading == 0.0 else registrar.turned_features(src, heading)
    pairs, probs, _ = match_features(feats, tgt.features, cfg, "fcgf")
    samples.append(MatchSample(src.xyz[pairs[:, 0]], tgt.xyz[pairs[:, 1]], probs, T, len(src.xyz), "global",
                               heading == right, name))
    # Prior: the truth moved by a constant-velocity-like error.
    dt = rng.normal(0.0, prior_sigma, 3) * np.array([1.0, 1.0, 0.3])
    init = geometry.make_transform(
        geometry.yaw_transform(float(rng.normal(0.0, prior_yaw_sigma_deg)))[:3, :3], dt) @ T
    pairs, probs, _ = match_features(src.features, tgt.features, cfg, "fcgf", registrar.prior_support(src, tgt, init))
    samples.append(MatchSample(src.xyz[pairs[:, 0]], tgt.xyz[pairs[:, 1]], probs, T, len(src.xyz), "prior",
                               True, name))
    return samples


def _save_shard(path: Path, samples: list[MatchSample], meta: dict) -> None:
    arrays = {}
    for i, s in enumerate(samples):
        arrays[f"{i}_xs"], arrays[f"{i}_ys"], arrays[f"{i}_probs"] = s.xs, s.ys, s.probs
        arrays[f"{i}_T"] = s.T_gt
    info = [{"num_source": s.num_source, "search": s.search, "heading_right": s.heading_right, "name": s.name}
            for s in samples]
    buffer = io.BytesIO()
    np.savez_compressed(buffer, info=json.dumps({"meta": meta, "samples": info}), **arrays)
    write_bytes(path, buffer.getvalue())  # atomic: an interrupted run keeps only whole shards


def load_shard(path: str | Path) -> list[MatchSample]:
    with np.load(path) as z:
        info = json.loads(str(z["info"]))
        return [MatchSample(z[f"{i}_xs"], z[f"{i}_ys"], z[f"{i}_probs"], z[f"{i}_T"], d["num_source"], d["search"],
                            d["heading_right"], d["name"]) for i, d in enumerate(info["samples"])]


def load_matches(split_dir: str | Path) -> list[MatchSample]:
    """Every sample of a split directory (all ``matches_*.npz`` shards, in seed order)."""
    files = sorted(Path(split_dir).glob("matches_*.npz"), key=lambda p: int(p.stem.split("_")[1]))
    if not files:
        raise FileNotFoundError(f"no match shards in {split_dir} (make them with `s2h train matches`)")
    return [s for f in files for s in load_shard(f)]


def _world_pairs(seed: int, sensor: str, family: str, per_world: int, min_distance: float, max_distance: float,
                 min_overlap: float) -> list:
    """``per_world`` pairs of world ``seed``; with ``min_overlap`` only pairs whose ``overlap_ratio``
    reaches it (a depth camera that turned away sees nothing of the other view), drawn from
    ``OVERLAP_CANDIDATES`` times as many. Raises RuntimeError when the drive is too short for them."""
    from s2h_ros.datasets.synthetic import synthetic_pairs

    if min_overlap <= 0.0:
        return synthetic_pairs(per_world, seed, min_distance=min_distance, max_distance=max_distance,
                               sensor=sensor, family=family)
    drawn = synthetic_pairs(per_world * OVERLAP_CANDIDATES, seed, min_distance=min_distance,
                            max_distance=max_distance, sensor=sensor, family=family)
    return [p for p in drawn if overlaps_enough(p, min_overlap)][:per_world]


def write_matches(out_dir: str | Path, seeds: range, sensors: list[str], families: list[str], per_world: int,
                  min_distance: float, max_distance: float, config: RegistrationConfig | None = None,
                  log=print, min_overlap: float = 0.0) -> Path:
    """Generate the samples of worlds ``seeds`` (sensor and family drawn per world) into ``out_dir``,
    matched as a registrar with ``config`` matches them (voxel size, prior radius, weights: e.g.
    config/depth_camera.yaml's for indoor matches at 0.05 m); worlds whose shard exists are
    skipped (resume). ``min_overlap``: see ``_world_pairs``."""
    from s2h_ros.pipeline import Registrar

    if any(s in RESERVED_EVAL_SEEDS for s in (seeds.start, seeds.stop - 1)):
        raise ValueError(f"seeds {seeds.start}..{seeds.stop - 1} overlap the held-out evaluation seeds 0-999")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    registrar = Registrar(config or RegistrationConfig())
    cfg = registrar.config
    for seed in seeds:
        path = out / f"matches_{seed}.npz"
        if path.exists():
            continue
        rng = np.random.default_rng([seed, 77])
        sensor, family = str(rng.choice(sensors)), str(rng.choice(families))
        t0 = time.perf_counter()
        try:
            pairs = _world_pairs(seed, sensor, family, per_world, min_distance, max_distance, min_overlap)
        except RuntimeError as err:  # a drive too short for the pairs: skip the world
            log(f"world {seed}: {err}")
            continue
        samples = []
        for pair in pairs:
            with torch.no_grad():
                samples += pair_samples(registrar, np.asarray(pair.source)[:, :3], np.asarray(pair.target)[:, :3],
                                        pair.T_gt, rng, name=pair.name)
        _save_shard(path, samples, {"seed": seed, "sensor": sensor, "family": family,
                                    "min_distance": min_distance, "max_distance": max_distance,
                                    "min_overlap": min_overlap, "voxel": cfg.voxel_size,
                                    "inlier_distance": cfg.inlier_distance, "prior_radius": cfg.prior_radius})
        inl = [float((s.residuals() < cfg.inlier_distance).mean()) if len(s.xs) else 0.0 for s in samples]
        log(f"world {seed} {sensor}/{family}: {len(samples)} samples, matches "
            f"{[len(s.xs) for s in samples]}, inlier fraction {[round(x, 2) for x in inl]} "
            f"({time.perf_counter() - t0:.1f} s)")
    return out
