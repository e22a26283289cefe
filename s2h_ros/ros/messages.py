"""Builders for the messages registration_node publishes (numpy in, ROS messages out), and the
one conversion between stamps (s2h_ros.stamps) and builtin_interfaces/Time."""
from __future__ import annotations

import numpy as np
from builtin_interfaces.msg import Time
from geometry_msgs.msg import Point, Pose, PoseStamped, Quaternion, Transform, TransformStamped, Twist, Vector3
from nav_msgs.msg import Odometry
from std_msgs.msg import ColorRGBA, Header
from visualization_msgs.msg import Marker, MarkerArray

from s2h_ros import geometry, stamps
from s2h_ros.msg import RegistrationResult as RegistrationResultMsg


def stamp_msg(stamp: float | int | Time | None) -> Time:
    """builtin_interfaces/Time from seconds (float), nanoseconds (int), a Time message or an
    rclpy.time.Time (None: zero)."""
    if stamp is None:
        return Time()
    if isinstance(stamp, Time):
        return stamp
    if hasattr(stamp, "to_msg"):  # rclpy.time.Time
        return stamp.to_msg()
    ns = int(stamp) if isinstance(stamp, (int, np.integer)) else stamps.sec_to_ns(float(stamp))
    sec, nanosec = stamps.split_ns(ns)
    return Time(sec=sec, nanosec=nanosec)


def stamp_to_sec(stamp: Time) -> float:
    return stamps.stamp_sec(stamp)


def matrix_to_transform(T: np.ndarray) -> Transform:
    t, q = geometry.matrix_to_pose(T)
    return Transform(translation=Vector3(x=float(t[0]), y=float(t[1]), z=float(t[2])),
                     rotation=Quaternion(x=float(q[0]), y=float(q[1]), z=float(q[2]), w=float(q[3])))


def matrix_to_pose(T: np.ndarray) -> Pose:
    t, q = geometry.matrix_to_pose(T)
    return Pose(position=Point(x=float(t[0]), y=float(t[1]), z=float(t[2])),
                orientation=Quaternion(x=float(q[0]), y=float(q[1]), z=float(q[2]), w=float(q[3])))


def transform_stamped(T: np.ndarray, stamp: Time, parent: str, child: str) -> TransformStamped:
    return TransformStamped(header=Header(stamp=stamp, frame_id=parent), child_frame_id=child,
                            transform=matrix_to_transform(T))


def odometry(T: np.ndarray, stamp: Time, parent: str, child: str, pose_covariance: np.ndarray | None = None,
             twist: np.ndarray | None = None, twist_covariance: np.ndarray | None = None) -> Odometry:
    """nav_msgs/Odometry of pose ``T`` (child in parent). Covariances are ``(6, 6)`` in ROS order
    (x, y, z, rot x, rot y, rot z); ``twist`` is ``(6,)`` [vx, vy, vz, wx, wy, wz] in the child frame."""
    msg = Odometry(header=Header(stamp=stamp, frame_id=parent), child_frame_id=child)
    msg.pose.pose = matrix_to_pose(T)
    if pose_covariance is not None:
        msg.pose.covariance = [float(v) for v in np.asarray(pose_covariance, dtype=np.float64).reshape(36)]
    if twist is not None:
        v = [float(x) for x in twist]
        msg.twist.twist = Twist(linear=Vector3(x=v[0], y=v[1], z=v[2]), angular=Vector3(x=v[3], y=v[4], z=v[5]))
    if twist_covariance is not None:
        msg.twist.covariance = [float(v) for v in np.asarray(twist_covariance, dtype=np.float64).reshape(36)]
    return msg


def pose_stamped(T: np.ndarray, stamp: Time, frame: str) -> PoseStamped:
    return PoseStamped(header=Header(stamp=stamp, frame_id=frame), pose=matrix_to_pose(T))


def result_message(step, header: Header, scan_id: int, total_ms: float | None = None) -> RegistrationResultMsg:
    """``s2h_ros/RegistrationResult`` of one odometry step (successful or not), with its tracking
    segment and continuity event (s2h_ros.odometry.OdometryStep), the result's weakest
    direction (s2h_ros.degeneracy) and its strongest shifted copy (s2h_ros.repetition)."""
    msg = RegistrationResultMsg(header=header, scan_id=scan_id, success=bool(step.success), message=step.message,
                                segment=int(step.segment), event=step.event,
                                deskewed=bool(step.deskewed))
    msg.keyframe_id = max(int(step.keyframe_id), 0)
    msg.keyframe_stamp = stamp_msg(step.keyframe_stamp)
    T = step.T_keyframe_scan if step.T_keyframe_scan is not None else (
        step.result.transform if step.result is not None else np.eye(4))
    msg.transform = matrix_to_transform(T)
    r = step.result
    if r is not None:
        msg.num_source_points = len(r.source_xyz)
        msg.num_target_points = len(r.target_xyz)
        msg.num_candidates = r.num_candidates
        msg.num_inliers = r.num_inliers
        msg.inlier_ratio = float(r.inlier_ratio)
        msg.fitness = float(r.fitness)
        msg.weight_sum = float(r.weight_sum)
        msg.fallback = r.fallback
        msg.levelled_deg = [float(v) for v in r.levelled_deg]
        if r.degeneracy is not None:
            msg.weakest_constraint = float(r.degeneracy.eigenvalue)
            msg.weakest_direction = [float(v) for v in r.degeneracy.direction]
        if r.repetition is not None:
            msg.repetition = float(r.repetition.ratio)
            msg.repetition_shift = [float(v) for v in r.repetition.shift]
    # The whole step's stages (OdometryStep.timings: preparation, registration, map refinement,
    # rest); a step without them (built by hand) reports its registration's.
    timings = dict(step.timings or (r.timings if r is not None else {}))
    total = timings.pop("total", None)
    msg.stage_names = list(timings)
    msg.stage_times_ms = [float(timings[k]) for k in msg.stage_names]
    msg.total_time_ms = float(sum(timings.values()) if total is None else total)
    if total_ms is not None:
        msg.total_time_ms = float(total_ms)
    return msg


def correspondence_markers(step, frame: str, stamp: Time, scan_pose: np.ndarray | None,
                           keyframe_pose: np.ndarray | None, max_lines: int) -> MarkerArray:
    """Inlier correspondences as lines (keyframe point - scan point, coloured by weight) in
    ``frame`` (odom), via the scan's and keyframe's sensor poses there; at most ``max_lines`` (a
    fixed-seed subset, ``geometry.fixed_subset``: the same result draws the same lines).
    A failed scan clears the previous drawing and draws nothing it does not trust."""
    header = Header(stamp=stamp, frame_id=frame)
    out = MarkerArray(markers=[Marker(header=header, ns="s2h", action=Marker.DELETEALL)])
    r = step.result
    if not step.success or r is None or scan_pose is None or keyframe_pose is None or max_lines <= 0:
        return out
    idx = np.flatnonzero(r.inlier_mask) if len(r.inlier_mask) else np.zeros(0, int)
    if len(idx) > max_lines:
        idx = idx[geometry.fixed_subset(len(idx), max_lines)]
    scan_pts = geometry.apply_transform(scan_pose, r.source_xyz[r.correspondences[idx, 0]].astype(np.float64))
    kf_pts = geometry.apply_transform(keyframe_pose, r.target_xyz[r.correspondences[idx, 1]].astype(np.float64))
    lines = Marker(header=header, ns="s2h_correspondences", id=0, type=Marker.LINE_LIST, action=Marker.ADD)
    lines.scale.x = 0.03
    lines.pose.orientation.w = 1.0
    w = r.weights[idx] if len(r.weights) else np.ones(len(idx))
    w = np.clip(w / max(float(w.max()), 1e-9), 0.0, 1.0) if len(w) else w
    # Marker.points/colors are sequences of message objects: one per end point is unavoidable,
    # which is why the lines are capped at max_lines (the keyframe cloud goes out as PointCloud2).
    ends = np.stack([kf_pts, scan_pts], axis=1).reshape(-1, 3).tolist()
    lines.points = [Point(x=x, y=y, z=z) for x, y, z in ends]
    lines.colors = [ColorRGBA(r=1.0 - wi, g=wi, b=0.0, a=0.9) for wi in np.repeat(w, 2).tolist()]
    out.markers.append(lines)
    return out
