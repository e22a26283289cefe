"""``s2h bench prediction``: how far the odometry's motion prior is off when a scan comes late, on
ground-truth trajectories.

A node that falls behind its sensor, or loses a few scans, predicts the next scan's pose from the
last trusted motion (``s2h_ros.motion_prior``) over seconds instead of 0.1 s. The prediction is the
tracking search's centre and orders the global search's heading hypotheses
(``Registrar.headings``), so its error decides what a late scan costs and risks. This bench takes
every ``--every``-th pose of each ``--poses`` file (KITTI layout: camera-0 poses, made Velodyne
poses with ``--calib``; default: the bundled KITTI 00 ground truth), measures the twist over each
``--twist-over`` interval ending there, predicts ``--ahead`` seconds on with the turn rate carried
over each ``--turn-horizons`` (``inf``: carried on; default also the shipped ``max_gap``), with
the speed kept (key: the horizon) or changing at the rate the speeds of the last
``--speed-change-windows`` seconds give (``motion_prior.speed_change``, over the same horizon; key
``<horizon>+speed_<window>s``: the speeds of intervals of ``--twist-over`` seconds, as a node taking
every such scan measures them, the window widened to two such intervals as the odometry's
``motion_prior.speed_window`` does), and compares with the true pose then: yaw and position error (and
``beyond_radius``, the share more than ``prior_radius`` off), and whether the heading hypothesis the
global search tries first (``hypotheses.heading_order``) is the one nearest the true yaw
(``right_heading_first``) or a turned one where the truth is within half a hypothesis step of the
heading as given (``turned_first``: the search tries a wrong turned heading first).
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

from s2h_ros import geometry


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--poses", type=Path, nargs="*", default=[],
                        help="KITTI poses files (default: the bundled sequence 00 ground truth)")
    parser.add_argument("--calib", type=Path, default=None, help="KITTI calib.txt (default: the bundled 00's)")
    parser.add_argument("--rate", type=float, default=10.0, help="poses per second")
    parser.add_argument("--twist-over", type=float, nargs="+", default=[0.1, 1.0],
                        help="seconds the twist is measured over (0.1: lock-step at 10 Hz; 1: a node behind)")
    parser.add_argument("--ahead", type=float, nargs="+", default=[1.0, 1.5, 2.0, 3.0, 4.0],
                        help="seconds predicted ahead")
    parser.add_argument("--turn-horizons", type=float, nargs="+", default=None,
                        help="seconds the turn rate is carried (default: inf and odometry.max_gap)")
    parser.add_argument("--speed-change-windows", type=float, nargs="+", default=None,
                        help="seconds of speeds the speed change is measured over; 0: constant speed "
                             "(default: 0 and odometry.speed_change_window)")
    parser.add_argument("--every", type=int, default=3, help="take every k-th pose as a last trusted one")


def _velodyne_poses(path: Path, calib: Path) -> np.ndarray:
    from s2h_ros.datasets.kitti import camera_to_velodyne, read_poses, velodyne_to_camera

    return camera_to_velodyne(read_poses(path), velodyne_to_camera(calib))


def _speeds(poses: np.ndarray, i: int, back: int, rate: float, window: float) -> tuple[np.ndarray, np.ndarray]:
    """Middle times (s) and mean speeds (m/s) of the intervals of ``back`` poses ending at pose
    ``i``, ``i - back``, ... whose middles lie within ``window`` seconds before pose ``i``: what an
    odometry taking every ``back``-th scan measured."""
    ends = []
    for j in range(i, back - 1, -back):  # the middles only grow older: stop at the window's edge
        if (i - j + back / 2) / rate > window:
            break
        ends.append(j)
    times = np.array([(j - back / 2) / rate for j in ends[::-1]])
    speeds = np.array([np.linalg.norm(poses[j][:3, 3] - poses[j - back][:3, 3]) * rate / back for j in ends[::-1]])
    return times, speeds


def prediction_errors(poses: np.ndarray, rate: float, twist_over: float, ahead: float, horizons: list[float],
                      every: int, hypotheses: int, windows: list[float], radius: float) -> dict[str, dict]:
    """Per turn horizon and speed-change window: the errors of predictions ``ahead`` seconds on
    from every ``every``-th pose of ``poses`` (N, 4, 4), the twist measured over the
    ``twist_over`` seconds before it; ``beyond_radius``: the fraction more than ``radius`` metres
    off (tracking's ``prior_radius``: a correction beyond it costs a global search)."""
    from s2h_ros.motion_prior import body_twist, predicted_pose, speed_change, speed_window
    from s2h_ros.hypotheses import heading_order

    back, on = max(1, round(twist_over * rate)), max(1, round(ahead * rate))
    samples = range(back, len(poses) - on, every)
    out = {}
    for horizon, window in ((h, w) for h in horizons for w in windows):
        yaw_err, pos_err, right, turned = [], [], [], []
        for i in samples:
            twist = body_twist(geometry.invert_transform(poses[i - back]) @ poses[i], back / rate)
            change = speed_change(*_speeds(poses, i, back, rate, speed_window(window, back / rate))) \
                if window > 0 else 0.0
            truth = geometry.invert_transform(poses[i]) @ poses[i + on]
            moved = predicted_pose(np.eye(4), twist, on / rate, horizon, change)
            true_yaw, yaw = geometry.yaw_deg(truth), geometry.yaw_deg(moved)
            yaw_err.append(abs(geometry.angle_difference_deg(yaw, true_yaw)))
            pos_err.append(float(np.linalg.norm(moved[:3, 3] - truth[:3, 3])))
            first, true_first = heading_order(hypotheses, yaw)[0], heading_order(hypotheses, true_yaw)[0]
            right.append(first == true_first)
            turned.append(true_first == 0.0 and first != 0.0)
        name = "inf" if math.isinf(horizon) else f"{horizon:g}"
        if window > 0:
            name += f"+speed_{window:g}s"
        out[name] = {
            "samples": len(yaw_err),
            "yaw_error_deg": {q: float(np.percentile(yaw_err, p)) for q, p in (("p50", 50), ("p90", 90), ("p99", 99))},
            "position_error_m": {q: float(np.percentile(pos_err, p)) for q, p in (("p50", 50), ("p95", 95))},
            "beyond_radius": float(np.mean(np.array(pos_err) > radius)),
            "right_heading_first": float(np.mean(right)),
            "turned_first": float(np.mean(turned)),
        }
    return out


def run(args: argparse.Namespace) -> dict:
    from s2h_ros.config import OdometryConfig, RegistrationConfig
    from s2h_ros.datasets.kitti import SAMPLE_CALIB, SAMPLE_POSES

    horizons = args.turn_horizons if args.turn_horizons is not None else [math.inf, OdometryConfig().max_gap]
    windows = (args.speed_change_windows if args.speed_change_windows is not None
               else [0.0, OdometryConfig().speed_change_window])
    hypotheses, radius = RegistrationConfig().heading_hypotheses, RegistrationConfig().prior_radius
    calib = args.calib or SAMPLE_CALIB
    results = {}
    for path in args.poses or [SAMPLE_POSES]:
        poses = _velodyne_poses(path, calib)
        results[path.stem] = {f"twist_over_{over:g}s": {f"ahead_{ahead:g}s": prediction_errors(
            poses, args.rate, over, ahead, horizons, args.every, hypotheses, windows, radius) for ahead in args.ahead}
            for over in args.twist_over}
    return {"heading_hypotheses": hypotheses, "turn_horizons_s": [str(h) for h in horizons],
            "speed_change_windows_s": windows, "radius_m": radius,
            "rate_hz": args.rate, "every": args.every, "sequences": results}
