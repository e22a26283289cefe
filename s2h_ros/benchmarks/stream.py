"""``s2h bench stream``: the node's odometry under a sensor-rate stream, in one process, on a device.

What registration_node does with each scan, without DDS: scan ``i`` is offered at ``i / rate``
seconds after the start to the node's hand-over (``s2h_ros.handover``: a one-slot buffer where a
newer scan drops an older one, a preparer thread that computes the newest scan's voxels and
features, ``KeyframeOdometry.prepare``, while the worker registers the one before,
``KeyframeOdometry.step``). Every step is timed with the device synchronised
(``torch.cuda.synchronize`` before the clock is read), so no GPU work is in flight when a latency
is taken. ``--rate 0`` is lock-step: every scan, in order, offered as soon as the one before has
been taken, as fast as the odometry goes. ``--no-prepare-ahead`` prepares a scan only once the
odometry is free (one scan at a time: the same run's baseline). ``--every K`` streams every K-th
scan only, each with its own stamp (K sensor periods apart; lock-step: 0.1 s per frame), as a node
that takes one scan in K sees them, deterministically.

Reported: processed rate, scans dropped, latency from a scan being offered to its pose (p50 / p95 /
max), the worker's step time, the mean time per stage and scan (``OdometryStep.timings``: the
scan's voxelisation and features, the registration's stages, the local map's refinement, and the
rest), each step's search, event and message (why a scan was not trusted), trusted fraction and
events, ATE and KITTI drift of the trusted poses against ground truth (only the scans processed;
``s2h bench replay`` holds the last pose for dropped scans instead) and within each segment
(``metrics_by_segment``: after a lost track the poses go on from the last trusted one, the motion
in between unknown, which the whole run's drift counts as error), peak resident and GPU memory,
and, where kiss-icp is installed, KISS-ICP on the same scans offline in the same run.

Why in process as well as ``s2h bench replay`` (the same node over DDS): it isolates compute from
transport, and runs on machines without a ROS runtime (the GPU machines this project is lent have
none), so the GPU path is timed end to end through the odometry. The warm-up (model load, CUDA
context, the first kernels) runs on the first two scans with a separate odometry before the clock
starts. Scans are read into memory before the clock starts, so disk speed does not count.

Scans: ``--sequence`` (KITTI layout with poses, e.g. what ``s2h simulate`` writes) or a simulated
drive of ``--sensor`` / ``--seed`` / ``--frames`` written under ``--cache`` (needs Open3D).
"""
from __future__ import annotations

import argparse
import os
import resource
import time
from collections import Counter
from pathlib import Path

import numpy as np

from s2h_ros.benchmarks.common import kiss_icp_baseline, synchronize
from s2h_ros.handover import helper_process_pid


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sequence", type=Path, help="KITTI-layout sequence (default: simulate one)")
    parser.add_argument("--sensor", default="hdl64",
                        help="sensor preset of the simulated drive, and whose node settings are used (depth_camera: "
                             "config/depth_camera.yaml)")
    parser.add_argument("--seed", type=int, default=163, help="simulated world seed (0-999 are never trained on)")
    parser.add_argument("--frames", type=int, default=300, help="simulated scans (no --sequence)")
    parser.add_argument("--motion-distortion", action="store_true",
                        help="simulate the drive with each column drawn where the sensor was when it fired, and the "
                             "per-point times the odometry deskews with (no --sequence; a sequence's point_times/ are "
                             "always used)")
    parser.add_argument("--start", type=int, default=0, help="first frame of the sequence")
    parser.add_argument("--count", type=int, default=-1, help="frames streamed (-1: all from --start)")
    parser.add_argument("--every", type=int, default=1,
                        help="stream every K-th frame only, with its own stamp (lock-step: as a node that takes one "
                             "scan in K, deterministic)")
    parser.add_argument("--rate", type=float, default=10.0, help="scans per second; 0: lock-step, every scan")
    parser.add_argument("--device", default="cpu", help="registration device: cpu, cuda, cuda:N")
    parser.add_argument("--threads", type=int, default=0,
                        help="CPU threads of torch, BLAS and scipy (0: the node's rule, config.cpu_threads: all cores but one on a CPU, 1 with a GPU)")
    parser.add_argument("--params-file", action="append", default=[],
                        help="registration_node parameter file(s) whose registration.* / odometry.* settings are used "
                             "(default: config/depth_camera.yaml for a depth camera --sensor, the defaults otherwise)")
    parser.add_argument("-p", "--param", action="append", default=[], metavar="SECTION.NAME=VALUE",
                        help="config override, e.g. odometry.map_keyframes=0 or registration.prior_max_points=4000")
    parser.add_argument("--cache", type=Path, default=Path("results/bench_stream"), help="simulated drives go here")
    parser.add_argument("--no-kiss-icp", action="store_true", help="skip KISS-ICP on the same scans")
    parser.add_argument("--no-prepare-ahead", action="store_true",
                        help="prepare a scan only once the odometry is free (registration_node's prepare_ahead: false)")
    parser.add_argument("--prepare-overlap", type=float, default=1.0, metavar="F",
                        help="the fraction of a typical preparation that may run beside the registration before it "
                             "(registration_node's prepare_overlap, 0-1; 1: ready when the registration ends)")


def _configs(args: argparse.Namespace):
    """The node's settings for ``--sensor`` (s2h bench trust's rule: config/depth_camera.yaml for a
    depth camera) or ``--params-file``, then ``--device`` and the ``-p`` overrides."""
    from s2h_ros.benchmarks.trust import drive_settings
    from s2h_ros.config import OdometryConfig, RegistrationConfig, parse_overrides

    files, registration, odometry = drive_settings(args.sensor, args.params_file)
    changes: dict[str, dict] = {"registration": {"device": args.device}, "odometry": {}}
    classes = {"registration": RegistrationConfig, "odometry": OdometryConfig}
    for item in args.param:
        section, dot, rest = item.partition(".")
        if not dot or section not in classes:
            raise SystemExit(f"--param {item!r}: expected registration.NAME=VALUE or odometry.NAME=VALUE")
        changes[section].update(parse_overrides(classes[section], rest))
    return files, registration.replace(**changes["registration"]), odometry.replace(**changes["odometry"])


def _sequence(args: argparse.Namespace):
    from s2h_ros.datasets.kitti import KittiSequence

    seq_dir = args.sequence
    if seq_dir is None:
        from s2h_ros.benchmarks.trust import INDOOR_SENSORS
        from s2h_ros.datasets.synthetic import simulate_sequence

        distorted = "_distorted" if args.motion_distortion else ""
        seq_dir = args.cache / f"seq_{args.sensor}_{args.seed}_{args.frames}{distorted}"
        if not (seq_dir / "poses.txt").exists():  # as s2h bench trust drives: rooms at 1 m/s for a depth camera
            indoor = args.sensor in INDOOR_SENSORS
            simulate_sequence(n_frames=args.frames, seed=args.seed, sensor=args.sensor, out_dir=seq_dir, progress=True,
                              kind="indoor" if indoor else "outdoor", speed=1.0 if indoor else None,
                              motion_distortion=args.motion_distortion)
    return KittiSequence(seq_dir)


def _percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def _stream(odo, scans: list[np.ndarray], times: list[np.ndarray | None], rate: float, device: str, first: int,
            ahead: bool, every: int = 1, overlap: float = 1.0) -> tuple[list[dict], int]:
    """The node's way (``s2h_ros.handover``): scans offered at their time (lock-step: as soon as the
    one before is taken), prepared on one thread (``ahead``: while the one before is registered, up
    to ``overlap`` of a typical preparation), registered on another; ``scans`` are every
    ``every``-th frame from ``first``, each offered and stamped as that frame. Records and the
    number of scans dropped."""
    from s2h_ros.handover import Failed, Handover

    period = 1.0 / rate if rate > 0 else 0.0
    records: list[dict] = []
    t0 = time.perf_counter()

    def prepare(offer: tuple[int, float]):
        index, offered = offer
        return index, offered, odo.prepare(scans[index], times[index], _stamp(index * every, period))

    def process(item) -> None:
        if isinstance(item, Failed):
            raise item.error
        index, offered, prepared = item
        started = time.perf_counter() - t0
        step = odo.step(prepared, _stamp(index * every, period), behind=handover.waiting)
        synchronize(device)
        records.append(_step_record(step, first + index * every, offered, started, time.perf_counter() - t0,
                                    sum(prepared.timings.values())))

    handover = Handover(prepare, process, name="stream", ahead=ahead, overlap=overlap)
    try:
        for index in range(len(scans)):
            wait = index * every * period - (time.perf_counter() - t0)
            if wait > 0:
                time.sleep(wait)  # the scan is "published" at its time
            odo.heard(_stamp(index * every, period))  # as registration_node does for every scan it receives
            handover.offer((index, time.perf_counter() - t0), wait=not period)
        handover.join()
    finally:
        handover.stop()
    if len(records) + handover.dropped != len(scans):
        raise RuntimeError(f"the hand-over lost scans: {len(records)} processed, {handover.dropped} dropped "
                           f"of {len(scans)} (a step raised?)")
    return records, handover.dropped


def _stamp(index: int, period: float) -> float:
    return index * period if period else index * 0.1


def _stage_means(records: list[dict]) -> dict[str, float]:
    """Mean ms per processed scan of each stage (0 where it did not run): they sum to the mean step."""
    names = sorted({k for r in records for k in r["stages"]})
    return {k: float(np.mean([r["stages"].get(k, 0.0) for r in records])) for k in names}


def _helper_peak_rss_mb() -> float | None:
    """The helper process's peak resident memory (MB, Linux's VmHWM; s2h_ros.handover), None when it
    was never started or cannot be read: what the odometry holds beyond this process."""
    from s2h_ros.evaluation.harness import proc_status_kb

    pid = helper_process_pid()
    kb = None if pid is None else proc_status_kb("VmHWM", pid)
    return None if kb is None else kb / 1024


def _step_record(step, index: int, arrival: float, started: float, finished: float, ahead_ms: float) -> dict:
    step_ms = 1e3 * (finished - started)
    # OdometryStep.timings sum to the step inside it and the preparation done ahead (``ahead_ms``, on
    # the preparer thread); what is left (the final synchronisation) joins "rest".
    stages = dict(step.timings)
    stages["rest"] = stages.get("rest", 0.0) + max(0.0, step_ms + ahead_ms - sum(stages.values()))
    return {"index": index, "arrival_s": arrival, "latency_ms": 1e3 * (finished - arrival), "step_ms": step_ms,
            "trusted": bool(step.success), "deskewed": bool(step.deskewed), "event": step.event,
            "message": step.message, "new_keyframe": bool(step.new_keyframe),
            "search": step.result.search if step.result is not None else None, "segment": step.segment,
            "map_behind": step.refinement.map_behind if step.refinement is not None else None,
            "pose": None if step.pose is None else np.asarray(step.pose).tolist(), "stages": stages}


def _metrics(sequence, records: list[dict], first: int) -> dict:
    """ATE and KITTI drift of the trusted poses (in the first scan's frame) against the truth."""
    from s2h_ros.evaluation.metrics import sequence_metrics

    gt_all = sequence.poses
    trusted = [r for r in records if r["pose"] is not None]
    if gt_all is None or len(trusted) < 2:
        return {"note": "no ground truth" if gt_all is None else "fewer than 2 trusted poses"}
    base = np.linalg.inv(gt_all[first])
    gt = np.stack([base @ gt_all[r["index"]] for r in trusted])
    est = np.stack([np.asarray(r["pose"]) for r in trusted])
    return sequence_metrics(gt, est)


def _segment_metrics(sequence, records: list[dict]) -> list[dict]:
    """``_metrics`` of each segment's trusted poses alone (segments with at least 2), in order: a
    new segment continues the odometry frame from the last trusted pose with the motion in between
    unknown, so drift over the whole run counts that motion as error; within a segment it is the
    tracking's own."""
    segments: dict[int, list[dict]] = {}
    for r in records:
        if r["pose"] is not None:
            segments.setdefault(r["segment"], []).append(r)
    out = []
    for segment, members in segments.items():
        if len(members) >= 2:
            m = _metrics(sequence, members, members[0]["index"])
            out.append({"segment": segment, "first": members[0]["index"], **m})
    return out


def _wrong_trusted(sequence, records: list[dict]) -> list[dict] | None:
    """Trusted steps whose motion since the previous trusted scan of the same segment differs from
    the truth by more than s2h bench trust's bounds (the soak's ``judge_stream`` rule); None without
    ground truth. The first pose of a track (``FIRST_OF_TRACK``) or of a new segment is not compared."""
    from s2h_ros.benchmarks.robustness import FIRST_OF_TRACK, is_wrong, step_error

    gt = sequence.poses
    if gt is None:
        return None
    wrong, last = [], None
    for r in records:
        if r["pose"] is None:
            continue
        pose = np.asarray(r["pose"])
        if last is not None and last["segment"] == r["segment"] and r["event"] not in FIRST_OF_TRACK:
            te, re = step_error(np.asarray(last["pose"]), pose, gt[last["index"]], gt[r["index"]])
            if is_wrong((te, re)):
                wrong.append({"index": r["index"], "after": last["index"], "te_m": te, "re_deg": re})
        last = r
    return wrong


def _device_name(device: str) -> str:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return f"cpu ({os.cpu_count()} cores visible, torch {torch.get_num_threads()} threads)"


def run(args: argparse.Namespace) -> dict:
    import torch

    from s2h_ros.config import cpu_threads, use_cpu_threads
    from s2h_ros.handover import limit_malloc_arenas
    from s2h_ros.odometry import KeyframeOdometry
    from s2h_ros.pipeline import Registrar

    limit_malloc_arenas()  # as registration_node does
    params_files, registration, odometry = _configs(args)
    threads = cpu_threads(args.threads, args.device)
    use_cpu_threads(threads)
    sequence = _sequence(args)
    first = args.start
    count = (len(sequence) - first) if args.count < 0 else min(args.count, len(sequence) - first)
    if not 0.0 <= args.prepare_overlap <= 1.0:
        raise SystemExit(f"--prepare-overlap {args.prepare_overlap}: a fraction, 0-1")
    if args.every < 1:
        raise SystemExit(f"--every {args.every}: must be 1 or more")
    if -(-count // args.every) < 3:
        raise SystemExit(f"{count} frames, every {args.every}: need 3 or more to stream")
    read = [sequence[i] for i in range(first, first + count, args.every)]
    scans = [np.ascontiguousarray(scan.points[:, :3], dtype=np.float32) for scan in read]
    times = [scan.times for scan in read]  # per-point times of a motion-distorted sweep, else None
    del read
    registrar = Registrar(registration)

    warm = KeyframeOdometry(registration, odometry, registrar=registrar)  # model load, CUDA context, kernels
    for i in range(2):
        warm.step(scans[i], i * 0.1, times=times[i])
    synchronize(args.device)
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats(torch.device(args.device))

    odo = KeyframeOdometry(registration, odometry, registrar=registrar)
    t0 = time.perf_counter()
    records, dropped = _stream(odo, scans, times, args.rate, args.device, first, ahead=not args.no_prepare_ahead,
                               every=args.every, overlap=args.prepare_overlap)
    duration = time.perf_counter() - t0

    latencies = [r["latency_ms"] for r in records]
    steps = [r["step_ms"] for r in records]
    trusted = sum(r["trusted"] for r in records)
    events = dict(Counter(r["event"] for r in records if r["event"]))
    out = {
        "sequence": str(sequence.folder), "frames": count, "first": first, "every": args.every,
        "points_per_scan_mean": float(np.mean([len(s) for s in scans])),
        "device": args.device, "device_name": _device_name(args.device), "torch": torch.__version__,
        "torch_threads": threads, "rate_hz": args.rate, "duration_s": duration,
        "prepare_ahead": not args.no_prepare_ahead, "prepare_overlap": args.prepare_overlap,
        "processed": len(records), "dropped": dropped, "processed_rate_hz": len(records) / duration,
        "latency_ms": {"p50": _percentile(latencies, 50), "p95": _percentile(latencies, 95), "max": max(latencies)},
        "step_ms": {"p50": _percentile(steps, 50), "p95": _percentile(steps, 95), "max": max(steps)},
        "stage_ms_mean": _stage_means(records),
        "trusted": trusted, "deskewed": sum(r["deskewed"] for r in records), "events": events,
        "searches": dict(Counter(r["search"] for r in records if r["search"])),
        "metrics_trusted": _metrics(sequence, records, first),
        "metrics_by_segment": _segment_metrics(sequence, records),
        "wrong_trusted": _wrong_trusted(sequence, records),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "helper_peak_rss_mb": _helper_peak_rss_mb(),
        "peak_gpu_mb": (torch.cuda.max_memory_allocated(torch.device(args.device)) / 2**20
                        if args.device.startswith("cuda") else None),
        "params_files": [Path(f).name for f in params_files], "config_overrides": args.param,
        "steps": [{k: v for k, v in r.items() if k != "pose"} for r in records],
    }
    if not args.no_kiss_icp:
        out["kiss_icp"] = kiss_icp_baseline(sequence, first, count)
    print(summary(out))
    return out


def summary(out: dict) -> str:
    """A few readable lines of one run."""
    m = out["metrics_trusted"]
    lines = [
        f"stream: {out['frames']} scans"
        + (f" (every {out['every']}th streamed)" if out.get("every", 1) > 1 else "")
        + f" ({out['points_per_scan_mean']:.0f} points each) at "
        f"{out['rate_hz']:g} Hz on {out['device_name']}",
        f"  processed {out['processed']} ({out['processed_rate_hz']:.2f} scans/s), dropped {out['dropped']}, "
        f"trusted {out['trusted']}"
        + ("" if out["wrong_trusted"] is None else f" ({len(out['wrong_trusted'])} wrong)")
        + f", events {out['events'] or 'none'}",
        f"  latency p50 {out['latency_ms']['p50']:.0f} ms, p95 {out['latency_ms']['p95']:.0f} ms; "
        f"step p50 {out['step_ms']['p50']:.0f} ms, p95 {out['step_ms']['p95']:.0f} ms",
        "  mean ms per scan: " + ", ".join(f"{k} {v:.1f}" for k, v in out["stage_ms_mean"].items() if v >= 0.05),
        f"  peak memory: {out['peak_rss_mb']:.0f} MB resident"
        + ("" if out.get("helper_peak_rss_mb") is None else f", the helper process {out['helper_peak_rss_mb']:.0f} MB"),
    ]
    if "ate_rmse_m" in m:
        lines.append(f"  trusted poses: ATE {100 * m['ate_rmse_m']:.1f} cm, KITTI drift "
                     f"{m['t_err_pct']:.2f} % over {m['length_m']:.0f} m")
    parts = [s for s in out.get("metrics_by_segment", []) if "ate_rmse_m" in s]
    if len(parts) > 1 or (parts and parts[0]["first"] != out["first"]):
        longest = max(parts, key=lambda s: s["length_m"])
        lines.append(f"  within segments ({len(parts)} with 2+ trusted scans; the motion between them is unknown): "
                     f"the longest, {longest['frames']} scans over {longest['length_m']:.0f} m, ATE "
                     f"{100 * longest['ate_rmse_m']:.1f} cm, KITTI drift {longest['t_err_pct']:.2f} %")
    kiss = out.get("kiss_icp")
    if kiss and "metrics" in kiss:
        km = kiss["metrics"]
        lines.append(f"  KISS-ICP (offline, every scan): {kiss['fps']:.1f} scans/s, ATE {100 * km['ate_rmse_m']:.1f} cm, "
                     f"drift {km['t_err_pct']:.2f} %")
    elif kiss:
        lines.append(f"  KISS-ICP: {kiss['unavailable']}")
    return "\n".join(lines)
