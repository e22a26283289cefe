"""``s2h bench trust``: does the odometry ever mark a wrong pose as trusted, and how often does it
reject a right one? One held-out synthetic drive per sensor preset, run through
``KeyframeOdometry`` with the defaults (what registration_node runs), in one run.

A trusted step is **wrong** when its motion since the previous trusted scan of the same segment
differs from the ground truth by more than ``--max-te`` metres or ``--max-re`` degrees. An
untrusted scan whose registration result was nevertheless within those bounds of the truth
(against its keyframe) is a **needless rejection**. ``min_constraint`` is the smallest weakest-direction
constraint (s2h_ros.degeneracy) of a trusted registration: its margin over the degeneracy gate
(RegistrationConfig.min_constraint). The world seeds default to 0-999, which no
model is trained on.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

PRESETS = ("vlp16", "vlp32", "hdl64", "os128", "depth_camera")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sensors", default=",".join(PRESETS), help="comma-separated sensor presets")
    parser.add_argument("--frames", type=int, default=30, help="scans registered per drive (default 30)")
    parser.add_argument("--every", type=int, default=2, help="use every N-th simulated scan (more motion per step)")
    parser.add_argument("--seed", type=int, default=41, help="world seed of the first drive (+1 per sensor)")
    parser.add_argument("--max-te", type=float, default=0.3, help="metres: a trusted step further off is wrong")
    parser.add_argument("--max-re", type=float, default=2.0, help="degrees: a trusted step further off is wrong")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--markdown", help="also write the table here")


def drive_trust(sensor: str, seed: int, frames: int, every: int, max_te: float, max_re: float, registrar) -> dict:
    """Run one simulated drive through the odometry; count trusted, wrong and needlessly rejected scans."""
    from s2h_ros import geometry
    from s2h_ros.config import OdometryConfig
    from s2h_ros.datasets.synthetic import simulate_sequence
    from s2h_ros.odometry import KeyframeOdometry

    indoor = sensor == "depth_camera"
    seq = simulate_sequence(n_frames=frames * every, seed=seed, sensor=sensor, kind="indoor" if indoor else "outdoor",
                            speed=1.0 if indoor else 10.0)
    gt = seq.poses
    odo = KeyframeOdometry(odometry=OdometryConfig(), registrar=registrar)
    keyframe_frame: dict[int, int] = {}
    last = None  # (frame, pose, segment) of the previous trusted scan
    counts = {"trusted": 0, "wrong_trusted": 0, "rejected": 0, "needless_rejections": 0, "new_segments": 0}
    wrong, rejected, constraints, t0 = [], [], [], time.perf_counter()
    for i in range(0, frames * every, every):
        step = odo.step(seq[i].points, float(seq.stamps[i]))
        if step.success and step.pose is not None:
            counts["trusted"] += 1
            if step.result is not None and step.result.degeneracy is not None:
                constraints.append(step.result.degeneracy.eigenvalue)
            if last is not None and last[2] == step.segment and not step.event:
                re, te = geometry.transform_errors(geometry.invert_transform(last[1]) @ step.pose,
                                                   geometry.invert_transform(gt[last[0]]) @ gt[i])
                if te > max_te or re > max_re:
                    counts["wrong_trusted"] += 1
                    wrong.append({"frame": i, "te_m": float(te), "re_deg": float(re)})
            last = (i, step.pose, step.segment)
        else:
            counts["rejected"] += 1
            counts["new_segments"] += step.event == "new_segment"
            kf = keyframe_frame.get(step.keyframe_id)
            if step.result is not None and kf is not None:
                re, te = geometry.transform_errors(step.result.transform, geometry.invert_transform(gt[kf]) @ gt[i])
                needless = te <= max_te and re <= max_re
                counts["needless_rejections"] += needless
                rejected.append({"frame": i, "message": step.message, "result_te_m": float(te), "right": bool(needless)})
        if odo.keyframes and odo.keyframes[-1].id not in keyframe_frame:
            keyframe_frame[odo.keyframes[-1].id] = i
    return {"sensor": sensor, "seed": seed, "kind": "indoor" if indoor else "outdoor", "scans": frames,
            **counts, "trusted_fraction": counts["trusted"] / frames,
            "min_constraint": min(constraints) if constraints else None, "seconds_per_scan": (time.perf_counter() - t0) / frames,
            "wrong": wrong, "rejections": rejected}


def run(args: argparse.Namespace) -> dict:
    import torch

    from s2h_ros.config import RegistrationConfig
    from s2h_ros.evaluation.report import markdown_table
    from s2h_ros.outputs import write_text
    from s2h_ros.pipeline import Registrar

    torch.set_num_threads(args.threads)
    registrar = Registrar(RegistrationConfig())
    drives = [drive_trust(sensor, args.seed + k, args.frames, args.every, args.max_te, args.max_re, registrar)
              for k, sensor in enumerate(s.strip() for s in args.sensors.split(",") if s.strip())]
    table = markdown_table(
        ["sensor", "world", "scans", "trusted", "wrong but trusted", "rejected", "of those right", "new segments",
         "weakest constraint (min)", "s / scan"],
        [[d["sensor"], f"{d['kind']} seed {d['seed']}", str(d["scans"]), str(d["trusted"]), str(d["wrong_trusted"]),
          str(d["rejected"]), str(d["needless_rejections"]), str(d["new_segments"]),
          "-" if d["min_constraint"] is None else f"{d['min_constraint']:.4f}", f"{d['seconds_per_scan']:.2f}"]
         for d in drives])
    print(table, end="")
    if args.markdown:
        write_text(args.markdown, table)
    return {"every": args.every, "max_te_m": args.max_te, "max_re_deg": args.max_re, "threads": args.threads,
            "wrong_trusted_total": sum(d["wrong_trusted"] for d in drives), "drives": drives, "table": table}
