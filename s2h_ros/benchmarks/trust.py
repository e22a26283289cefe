"""``s2h bench trust``: does the odometry ever mark a wrong pose as trusted, and how often does it
reject a right one? Held-out synthetic drives run through ``KeyframeOdometry`` with the defaults
(what registration_node runs), in one run.

Without ``--families``: one drive per sensor preset, in the town (lidars) or the rooms (the depth
camera) at a fixed speed (10 m/s, 1 m/s). With ``--families``: one drive per (sensor, family)
cell, lidars in the outdoor families and the depth camera in the indoor ones (``rooms``,
``office``, ``warehouse``), each at its family's own speeds (a highway at 20-33 m/s, a parking lot
at 1.5-5 m/s). Every drive is a world of its own seed, ``--seed`` plus the drive's index; the
seeds must stay within 0-999, the held-out worlds no model is trained on
(``s2h_ros.training.data.RESERVED_EVAL_SEEDS``).

A trusted step is **wrong** when its motion since the previous trusted scan of the same segment,
or its registration against its keyframe, differs from the ground truth by more than
``--max-te`` metres or ``--max-re`` degrees. An untrusted scan whose registration result was
nevertheless within those bounds of the truth (against its keyframe) is a **needless rejection**;
rejections that the degeneracy gate made (message ``degenerate: ...``) are counted apart, with how
many of them were right anyway (by luck along the free direction: the geometry cannot tell).
``min_constraint`` is the smallest weakest-direction constraint (s2h_ros.degeneracy) of a trusted
registration: its margin over the degeneracy gate (RegistrationConfig.min_constraint).

``--motion-distortion`` draws each sweep while the sensor moves (a spinning lidar's columns over
its 0.1 s) and gives the odometry the per-point times, which it deskews with (``odometry.deskew``,
the default): the trust test on the sweeps a moving sensor really draws.

Settings: each drive runs with what registration_node would run with for that sensor: the library
defaults (config/register.yaml) for lidars, and config/depth_camera.yaml over them for the depth
camera (0.05 m voxels and the indoor FCGF, as the README launches it); ``--params-file`` (given
once or more, applied in order, as the node's ``--params-file``) replaces that choice for every
drive.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from s2h_ros.benchmarks.robustness import FIRST_OF_TRACK, MAX_RE_DEG, MAX_TE_M, step_error
from s2h_ros.commands.simulate import CARRIER_NAMES

if TYPE_CHECKING:
    from s2h_ros.config import OdometryConfig, RegistrationConfig


PRESETS = ("vlp16", "vlp32", "hdl64", "os128", "depth_camera")
INDOOR_SENSORS = ("depth_camera",)
HELD_OUT_SEEDS = range(0, 1000)  # as s2h_ros.training.data.RESERVED_EVAL_SEEDS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sensors", default=",".join(PRESETS), help="comma-separated sensor presets")
    parser.add_argument("--families", default="",
                        help="comma-separated scene families: one drive per (sensor, family) cell, indoor families "
                             "(rooms, office, warehouse) for the depth camera and outdoor ones for lidars; "
                             "default: the town / the rooms, one drive per sensor")
    parser.add_argument("--frames", type=int, default=30, help="scans registered per drive (default 30)")
    parser.add_argument("--every", type=int, default=2, help="use every N-th simulated scan (more motion per step)")
    parser.add_argument("--seed", type=int, default=41, help="world seed of the first drive (+1 per drive; 0-999)")
    parser.add_argument("--max-te", type=float, default=MAX_TE_M, help="metres: a trusted step further off is wrong")
    parser.add_argument("--max-re", type=float, default=MAX_RE_DEG, help="degrees: a trusted step further off is wrong")
    parser.add_argument("--min-constraint", type=float, default=None,
                        help="degeneracy gate (RegistrationConfig.min_constraint; default: the shipped one)")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads of torch, BLAS and scipy (config.use_cpu_threads)")
    parser.add_argument("--params-file", action="append", default=[], metavar="FILE",
                        help="ROS 2 parameter file(s) for every drive, applied in order over the defaults as "
                             "registration_node's --params-file (its registration.* and odometry.* keys); default: "
                             "config/depth_camera.yaml for the depth camera, the defaults for lidars")
    parser.add_argument("--markdown", help="also write the table here")
    parser.add_argument("--carrier", choices=CARRIER_NAMES, default="vehicle",
                        help="how the sensor is carried (s2h_ros.datasets.synthetic.CARRIERS): on a vehicle (default) "
                             "or handheld (1.6 m up, leaning 20 deg, swaying 12 deg, walking 1.0-1.6 m/s)")
    parser.add_argument("--motion-distortion", action="store_true",
                        help="draw each sweep while the sensor moves and hand the odometry its per-point times, "
                             "as a driver's time field does (deskewed with odometry.deskew, the default)")


def plan_cells(sensors: list[str], families: list[str], seed: int) -> list[tuple[str, str | None, int]]:
    """The drives, ``(sensor, family, seed)``: one per sensor without ``families`` (family None:
    the town or the rooms), else one per (sensor, family) of the sensor's kind, seeds counting up
    from ``seed``. Unknown families and seeds outside the held-out 0-999 are refused."""
    from s2h_ros.datasets.synthetic import FAMILIES

    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        raise ValueError(f"unknown families {unknown}; choose from {tuple(FAMILIES)}")
    if not families:
        cells = [(sensor, None) for sensor in sensors]
    else:
        cells = [(sensor, family) for sensor in sensors for family in families
                 if (FAMILIES[family].kind == "indoor") == (sensor in INDOOR_SENSORS)]
        if not cells:
            raise ValueError(f"no cell: families {families} fit none of the sensors {sensors} "
                             f"(indoor families for {INDOOR_SENSORS}, outdoor ones for lidars)")
    planned = [(sensor, family, seed + k) for k, (sensor, family) in enumerate(cells)]
    outside = [s for _, _, s in planned if s not in HELD_OUT_SEEDS]
    if outside:
        raise ValueError(f"world seeds {outside[0]}..{outside[-1]} are outside the held-out seeds 0-999")
    return planned


def drive_settings(sensor: str, params_files: list[str]) -> tuple[list[str], RegistrationConfig, OdometryConfig]:
    """The parameter files a drive of ``sensor`` runs with (``params_files``, else
    config/depth_camera.yaml for an indoor sensor, else none) and the settings they give."""
    from s2h_ros.config import configs_from_params_files
    from s2h_ros.paths import config_dir

    files = list(params_files) or ([str(config_dir() / "depth_camera.yaml")] if sensor in INDOOR_SENSORS else [])
    return (files, *configs_from_params_files(files))


def drive_trust(sensor: str, seed: int, frames: int, every: int, max_te: float, max_re: float, registrar,
                family: str | None = None, odometry=None, carrier: str = "vehicle",
                motion_distortion: bool = False) -> dict:
    """Run one simulated drive through the odometry (``odometry``: its OdometryConfig, default the
    defaults); count trusted, wrong and needlessly rejected scans. ``family`` None: the town (rooms
    for the depth camera) at 10 m/s (1 m/s); else that family at its own speeds. ``carrier``
    (``CARRIERS``): "handheld" walks the drive with the sensor held, tilted and swaying.
    ``motion_distortion``: each sweep drawn over its 0.1 s while the sensor moves, its per-point
    times given to the odometry (``KeyframeOdometry.step(..., times=)``)."""
    from s2h_ros import geometry
    from s2h_ros.config import OdometryConfig
    from s2h_ros.datasets.synthetic import CARRIERS, simulate_sequence
    from s2h_ros.odometry import KeyframeOdometry

    indoor = sensor in INDOOR_SENSORS
    carried = dict(CARRIERS[carrier], motion_distortion=motion_distortion)
    if family is None:
        carried.setdefault("speed", 1.0 if indoor else 10.0)
        seq = simulate_sequence(n_frames=frames * every, seed=seed, sensor=sensor,
                                kind="indoor" if indoor else "outdoor", **carried)
    else:
        seq = simulate_sequence(n_frames=frames * every, seed=seed, sensor=sensor, family=family, **carried)
    gt = seq.poses
    odo = KeyframeOdometry(odometry=odometry if odometry is not None else OdometryConfig(), registrar=registrar)
    keyframe_frame: dict[int, int] = {}
    last = None  # (frame, pose, segment) of the previous trusted scan
    counts = {"trusted": 0, "wrong_trusted": 0, "rejected": 0, "needless_rejections": 0,
              "degenerate_rejections": 0, "degenerate_right": 0, "new_segments": 0}
    wrong, rejected, trusted, t0 = [], [], [], time.perf_counter()
    deskewed = 0  # scans the odometry motion-compensated from their times
    for i in range(0, frames * every, every):
        scan = seq[i]
        step = odo.step(scan.points, float(seq.stamps[i]), times=scan.times)
        deskewed += step.deskewed
        kf = keyframe_frame.get(step.keyframe_id)
        # The registration against the keyframe, and its error from the truth (None: nothing to compare).
        re_kf = te_kf = None
        if step.result is not None and kf is not None:
            re_kf, te_kf = geometry.transform_errors(step.result.transform, geometry.invert_transform(gt[kf]) @ gt[i])
        if step.success and step.pose is not None:
            counts["trusted"] += 1
            errors = []
            if last is not None and last[2] == step.segment and step.event not in FIRST_OF_TRACK:
                te_step, re_step = step_error(last[1], step.pose, gt[last[0]], gt[i])
                errors.append((re_step, te_step))
            if te_kf is not None:
                errors.append((re_kf, te_kf))
            re, te = max(errors, key=lambda e: e[1]) if errors else (0.0, 0.0)
            is_wrong = any(e_te > max_te or e_re > max_re for e_re, e_te in errors)
            record = {"frame": i, "te_m": float(te), "re_deg": float(re), "wrong": bool(is_wrong), **_describe(step)}
            trusted.append(record)
            if is_wrong:
                counts["wrong_trusted"] += 1
                wrong.append(record)
            last = (i, step.pose, step.segment)
        else:
            counts["rejected"] += 1
            counts["new_segments"] += step.event == "new_segment"
            degenerate = "degenerate:" in step.message
            counts["degenerate_rejections"] += degenerate
            if te_kf is not None:
                right = te_kf <= max_te and re_kf <= max_re
                counts["needless_rejections"] += right
                counts["degenerate_right"] += right and degenerate
                rejected.append({"frame": i, "result_te_m": float(te_kf), "result_re_deg": float(re_kf),
                                 "right": bool(right), "degenerate": degenerate, **_describe(step)})
        if odo.keyframes and odo.keyframes[-1].id not in keyframe_frame:
            keyframe_frame[odo.keyframes[-1].id] = i
    constraints = [t.get("weakest_constraint") for t in trusted]
    return {"sensor": sensor, "family": family or ("rooms" if indoor else "town"), "seed": seed, "carrier": carrier,
            "motion_distortion": motion_distortion, "deskewed": deskewed,
            "kind": "indoor" if indoor else "outdoor", "scans": frames, "speed": "fixed" if family is None else "family",
            **counts, "trusted_fraction": counts["trusted"] / frames,
            "min_constraint": min((c for c in constraints if c is not None), default=None),
            "seconds_per_scan": (time.perf_counter() - t0) / frames, "wrong": wrong, "rejections": rejected,
            "trusted_steps": trusted}


def _describe(step) -> dict:
    """What a step's registration said: message, fitness, inliers, weakest constraint; how far the local
    map's refinement moved its pose."""
    r = step.result
    out = {"message": step.message or (r.message if r is not None else ""), "event": step.event,
           "deskewed": bool(step.deskewed)}
    if r is not None:
        out.update(fitness=r.fitness, fitness_fine=r.fitness_fine, inliers=r.num_inliers, search=r.search,
                   weakest_constraint=None if r.degeneracy is None else r.degeneracy.eigenvalue,
                   weakest=None if r.degeneracy is None else r.degeneracy.describe())
    if step.refinement is not None:
        out["map_refinement"] = step.refinement.to_dict()
    return out


def _table(drives: list[dict], families: bool) -> str:
    from s2h_ros.evaluation.report import markdown_table

    if not families:  # today's table
        return markdown_table(
            ["sensor", "world", "settings", "scans", "trusted", "wrong but trusted", "rejected", "of those right",
             "new segments", "weakest constraint (min)", "s / scan"],
            [[d["sensor"], f"{d['kind']} seed {d['seed']}", _settings(d), str(d["scans"]), str(d["trusted"]),
              str(d["wrong_trusted"]), str(d["rejected"]), str(d["needless_rejections"]), str(d["new_segments"]),
              _constraint(d), f"{d['seconds_per_scan']:.2f}"] for d in drives])
    return markdown_table(
        ["sensor", "family", "seed", "settings", "scans", "trusted", "wrong but trusted", "rejected",
         "needless rejections", "degenerate (right anyway)", "new segments", "weakest constraint (min)", "s / scan"],
        [[d["sensor"], d["family"], str(d["seed"]), _settings(d), str(d["scans"]), str(d["trusted"]),
          str(d["wrong_trusted"]), str(d["rejected"]), str(d["needless_rejections"]),
          f"{d['degenerate_rejections']} ({d['degenerate_right']})", str(d["new_segments"]), _constraint(d),
          f"{d['seconds_per_scan']:.2f}"] for d in drives])


def _settings(d: dict) -> str:
    return " + ".join(d.get("params_files") or []) or "defaults"


def _constraint(d: dict) -> str:
    return "-" if d["min_constraint"] is None else f"{d['min_constraint']:.4f}"


def run(args: argparse.Namespace) -> dict:
    from s2h_ros.config import RegistrationConfig, use_cpu_threads
    from s2h_ros.outputs import write_text
    from s2h_ros.pipeline import Registrar

    sensors = [s.strip() for s in args.sensors.split(",") if s.strip()]
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    cells = plan_cells(sensors, families, args.seed)
    use_cpu_threads(args.threads)
    registrars: dict[str, Registrar] = {}  # one per setting (keyed by its repr): models load once
    drives = []
    for sensor, family, seed in cells:
        files, config, odometry = drive_settings(sensor, args.params_file)
        if args.min_constraint is not None:
            config = config.replace(min_constraint=args.min_constraint)
        if repr(config) not in registrars:
            registrars[repr(config)] = Registrar(config)
        registrar = registrars[repr(config)]
        drives.append(drive_trust(sensor, seed, args.frames, args.every, args.max_te, args.max_re, registrar, family,
                                  odometry, args.carrier, args.motion_distortion))
        d = drives[-1]
        d["params_files"] = [Path(f).name for f in files]
        print(f"# {sensor} {d['family']} seed {seed}: {d['trusted']}/{d['scans']} trusted, {d['wrong_trusted']} wrong, "
              f"{d['needless_rejections']} needless, {d['degenerate_rejections']} degenerate"
              + (f", {d['deskewed']} deskewed" if args.motion_distortion else ""), file=sys.stderr, flush=True)
    table = _table(drives, bool(families))
    print(table, end="")
    if args.markdown:
        write_text(args.markdown, table)
    gate = RegistrationConfig().min_constraint if args.min_constraint is None else args.min_constraint
    return {"every": args.every, "carrier": args.carrier, "motion_distortion": args.motion_distortion,
            "min_constraint_gate": gate, "max_te_m": args.max_te, "max_re_deg": args.max_re, "threads": args.threads,
            "families": families, "wrong_trusted_total": sum(d["wrong_trusted"] for d in drives),
            "drives": drives, "table": table}
