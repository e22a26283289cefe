"""``s2h train data|fcgf|inlier|matches|context``: make the pair cache, train FCGF, train the
inlier/S2H network; cache frozen-FCGF S2H matches and train the context inlier network on them.

Only ``data`` and ``matches`` need Open3D (they ray-cast synthetic scans); ``fcgf``, ``inlier`` and
``context`` read the caches alone, so they run on a GPU machine with just torch, numpy, scipy and tqdm. Launch with
``torchrun --nproc_per_node N -m s2h_ros.cli train ...`` for DDP.
"""
from __future__ import annotations

import argparse
from pathlib import Path


def _loop_options(p: argparse.ArgumentParser, data: str = "data") -> None:
    if data == "matches":
        p.add_argument("--matches", type=Path, required=True, help="match cache directory (with train/ and val/)")
    else:
        p.add_argument("--data", type=Path, required=True, help="pair cache directory (with train/ and val/)")
    p.add_argument("--out", type=Path, required=True, help="checkpoint to write (and resume from)")
    p.add_argument("--steps", type=int, default=1000, help="optimiser steps (each: one pair per process)")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate")
    p.add_argument("--lr-schedule", choices=("constant", "cosine"), default="constant",
                   help="cosine: the rate falls to 0 at --steps (computed from the step, so --resume follows it)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (under torchrun: cuda = this rank's GPU)")
    p.add_argument("--seed", type=int, default=0, help="seed of data order, augmentation and sampling")
    p.add_argument("--resume", action="store_true", help="continue from --out when it holds a training state")
    p.add_argument("--max-minutes", type=float, default=0.0, help="stop cleanly (checkpoint written) after this")
    p.add_argument("--checkpoint-every", type=int, default=200, help="write the checkpoint every N steps")
    p.add_argument("--val-every", type=int, default=500, help="validate every N steps (0: only at the end)")
    p.add_argument("--val-pairs", type=int, default=20, help="validation pairs used (from DIR/val)")
    p.add_argument("--train-pairs", type=int, default=0, help="use only the first N training pairs (0: all)")
    p.add_argument("--log-every", type=int, default=25, help="print one progress line every N steps")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: leave torch's default)")
    if data == "matches":
        return
    p.add_argument("--no-augment", action="store_true", help="train on the cached pairs as they are")
    p.add_argument("--max-yaw", type=float, default=45.0,
                   help="augmentation yaw range per side, +- degrees (also the validation rotations); 180: any heading")
    p.add_argument("--max-tilt", type=float, default=3.0,
                   help="augmentation roll/pitch range per side, +- degrees (also the validation rotations)")
    p.add_argument("--any-orientation", action="store_true",
                   help="also turn both sides by one common random rotation (clouds with no known gravity, "
                        "e.g. depth-camera fragments; also validated)")
    p.add_argument("--crop-range", type=float, nargs=2, metavar=("MIN", "MAX"), default=(40.0, 120.0),
                   help="each side keeps the points within a random horizontal range in MIN..MAX m")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="what", metavar="WHAT", required=True)

    d = sub.add_parser("data", help="generate synthetic training pairs into a cache directory")
    d.add_argument("--out", type=Path, required=True, help="cache directory (pairs go to OUT/SPLIT)")
    d.add_argument("--pairs", type=int, required=True, help="number of pairs")
    d.add_argument("--seed", type=int, required=True, help="first world seed (training 1000+, validation 2000+)")
    d.add_argument("--split", default="", help="train or val (default: val for seeds >= 2000, else train)")
    d.add_argument("--per-world", type=int, default=5, help="pairs per synthetic world (one drive each)")
    d.add_argument("--sensors", "--sensor", nargs="+", default=["hdl64"],
                   help="lidar presets (hdl64, vlp32, vlp16, os128, ...), one drawn per world")
    d.add_argument("--families", nargs="+", default=["town"], help="scene families, one drawn per world")
    d.add_argument("--mount-heights", type=float, nargs=2, metavar=("MIN", "MAX"),
                   help="mount height drawn per world, uniform in MIN..MAX m (default: each sensor's)")
    d.add_argument("--mixed", type=float, default=0.0,
                   help="probability that a world's targets come from a second drawn sensor")
    d.add_argument("--voxel", type=float, default=0.3, help="voxel size of the stored clouds (m)")
    d.add_argument("--min-distance", type=float, default=10.0, help="min sensor distance of a pair (m)")
    d.add_argument("--max-distance", type=float, default=20.0, help="max sensor distance of a pair (m)")
    d.add_argument("--min-overlap", type=float, default=0.0,
                   help="skip pairs whose overlap (fraction of 0.05 m voxels within 7.5 cm of the other cloud, "
                        "the smaller side) is below this")

    f = sub.add_parser("fcgf", help="train FCGF with the hardest-contrastive loss")
    _loop_options(f)
    f.add_argument("--preset", default="compact", help="FCGF preset (compact, kitti)")
    f.add_argument("--voxel", type=float, default=0.0, help="voxel (m); 0: the cache's voxel")
    f.add_argument("--init", type=Path, help="start from these FCGF weights")
    f.add_argument("--num-pos", type=int, default=1024, help="positive pairs sampled per step")
    f.add_argument("--num-hn", type=int, default=256, help="hardest-negative candidates per side")
    f.add_argument("--pos-margin", type=float, default=0.1, help="positive margin (FCGF: 0.1)")
    f.add_argument("--neg-margin", type=float, default=1.4, help="negative margin (FCGF: 1.4)")

    i = sub.add_parser("inlier", help="train DGR's inlier network (BCE) or the S2H path (L1+L2+L3, L3)")
    _loop_options(i)
    i.add_argument("--fcgf", type=Path, required=True, help="trained FCGF checkpoint (frozen unless --loss s2h or sstep)")
    i.add_argument("--loss", choices=("bce", "s2h", "l3", "sstep"), default="l3",
                   help="bce: DGR labels; l3: SHM_DGR motion loss; s2h: L1+L2+L3, FCGF fine-tuned too; "
                        "sstep: the S-step-only ablation (L1, L2 on the soft P, L3 on virtual points)")
    i.add_argument("--preset", default="compact",
                   help="new inlier network: compact or dgr (DGR's 6-D network), context (the shipped kind)")
    i.add_argument("--inlier-init", type=Path,
                   help="start from the inlier network of this checkpoint (e.g. the shipped weights); overrides --preset")
    i.add_argument("--matcher", choices=("s2h", "nn"), default="s2h", help="correspondences fed to the network")
    i.add_argument("--max-points", type=int, default=8000, help="voxels kept per cloud per step")
    i.add_argument("--inlier-distance", type=float, default=0.6, help="label/recall inlier distance (m)")
    i.add_argument("--fcgf-lr", type=float, default=1e-4, help="FCGF learning rate with --loss s2h")


    m = sub.add_parser("matches", help="cache the S2H matches of frozen FCGF on synthetic pairs (context network data)")
    m.add_argument("--out", type=Path, required=True, help="split directory to write (e.g. .cache/matches/train)")
    m.add_argument("--seeds", type=int, nargs=2, required=True, metavar=("FIRST", "END"),
                   help="world seeds FIRST..END-1 (training 1000+, validation 2000+; 0-999 are held out)")
    m.add_argument("--sensors", nargs="+", default=list(CONTEXT_SENSORS), help="lidar presets drawn per world")
    m.add_argument("--families", nargs="+", default=list(CONTEXT_FAMILIES), help="scene families drawn per world")
    m.add_argument("--per-world", type=int, default=3, help="pairs per world")
    m.add_argument("--min-distance", type=float, default=10.0, help="min sensor distance of a pair (m)")
    m.add_argument("--max-distance", type=float, default=20.0, help="max sensor distance of a pair (m)")
    m.add_argument("--weights", default="", help="FCGF weights (default: the shipped ones)")
    m.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    m.add_argument("--params-file", type=Path, nargs="+", default=[], metavar="FILE",
                   help="match as registration_node with these ROS 2 parameter files does (their registration.* "
                        "keys: voxel size, inlier distance, prior radius), e.g. config/depth_camera.yaml for indoor "
                        "matches at 0.05 m; default: the defaults (0.3 m)")
    m.add_argument("--min-overlap", type=float, default=0.0,
                   help="keep only pairs whose overlap (the smaller of its two fractions, at 0.05 m) reaches this")

    c = sub.add_parser("context", help="train the context inlier network on cached matches")
    _loop_options(c, data="matches")
    c.add_argument("--voxel", type=float, default=0.3, help="voxel size the matches were made at (m)")
    c.add_argument("--channels", type=int, default=64, help="channels per PointCN block")
    c.add_argument("--blocks", type=int, default=4, help="PointCN blocks per stage")
    c.add_argument("--stages", type=int, default=2, help="consistency stages")
    c.add_argument("--anchors", type=int, default=256, help="anchor correspondences per stage")
    c.add_argument("--first-anchors", choices=("random", "probability"), default="random",
                   help="stage 1 anchors: uniform random, or the matches of highest S-step probability")
    c.add_argument("--inlier-distance", type=float, default=0.6, help="label inlier distance (m)")
    c.add_argument("--init", type=Path,
                   help="start from the context inlier network of this file (e.g. the shipped weights); "
                        "its configuration replaces --channels, --blocks, --stages, --anchors, --first-anchors")

    k = sub.add_parser("pack", help="one weights file for the pipeline: an FCGF checkpoint plus an inlier network")
    k.add_argument("--fcgf", type=Path, required=True, help="FCGF checkpoint (its keys are kept)")
    k.add_argument("--inlier", type=Path, required=True, help="checkpoint holding the inlier network")
    k.add_argument("--out", type=Path, required=True, help="file to write")


# Sensors and scene families of the context network's training worlds; the others (vlp32, vlp32c,
# os1_64, os0_128, livox; tunnel, open_field) are left for held-out evaluation.
CONTEXT_SENSORS = ("hdl64", "vlp16", "os128", "hdl32", "os1_32")
CONTEXT_FAMILIES = ("town", "suburban", "highway", "parking_lot")


def run(args: argparse.Namespace) -> int:
    if args.what == "data":
        return _run_data(args)
    if args.what == "matches":
        return _run_matches(args)
    if args.what == "pack":
        from s2h_ros.models.checkpoint import combine_weights

        print(f"wrote {combine_weights(args.fcgf, args.inlier, args.out)}")
        return 0
    if args.what == "context":
        from s2h_ros.training.context_trainer import train_context_inlier

        train_context_inlier(args)
        return 0
    if args.what == "fcgf":
        from s2h_ros.training.fcgf_trainer import train_fcgf

        train_fcgf(args)
        return 0
    from s2h_ros.training.inlier_trainer import train_inlier

    train_inlier(args)
    return 0


def _run_data(args: argparse.Namespace) -> int:
    import time

    from tqdm import tqdm

    from s2h_ros.training.data import synthetic_training_pairs, write_pairs

    split = args.split or ("val" if args.seed >= 2000 else "train")
    pairs = synthetic_training_pairs(args.pairs, args.seed, args.per_world, tuple(args.sensors),
                                     args.min_distance, args.max_distance, tuple(args.families),
                                     tuple(args.mount_heights) if args.mount_heights else None, args.mixed,
                                     args.min_overlap)
    meta = {"seed": args.seed, "per_world": args.per_world, "sensors": args.sensors, "families": args.families,
            "mount_heights": args.mount_heights, "mixed": args.mixed, "min_overlap": args.min_overlap,
            "min_distance": args.min_distance, "max_distance": args.max_distance,
            "source": "s2h_ros synthetic lidar world (procedural, generated here)"}
    t0 = time.perf_counter()
    out = write_pairs(args.out / split, tqdm(pairs, total=args.pairs, desc=f"pairs -> {split}", mininterval=5),
                      args.voxel, meta)
    size = sum(p.stat().st_size for p in out.glob("*.npz"))
    print(f"wrote {args.pairs} pairs to {out} ({size / 1e6:.1f} MB) in {time.perf_counter() - t0:.0f} s")
    return 0


def _run_matches(args: argparse.Namespace) -> int:
    import torch

    from s2h_ros.config import RegistrationConfig, configs_from_params_files
    from s2h_ros.training.match_data import write_matches

    torch.set_num_threads(args.threads)
    config = configs_from_params_files(args.params_file)[0] if args.params_file else RegistrationConfig()
    if args.weights:
        config = config.replace(weights=args.weights)
    write_matches(args.out, range(*args.seeds), args.sensors, args.families, args.per_world, args.min_distance,
                  args.max_distance, config, log=lambda m: print(m, flush=True), min_overlap=args.min_overlap)
    return 0
