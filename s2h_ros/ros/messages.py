"""Builders for the messages registration_node publishes (numpy in, ROS messages out)."""
from __future__ import annotations

import numpy as np
from builtin_interfaces.msg import Time
from geometry_msgs.msg import Point, Pose, PoseStamped, Quaternion, Transform, TransformStamped, Vector3
from nav_msgs.msg import Odometry
from scipy.spatial.transform import Rotation
from std_msgs.msg import ColorRGBA, Header
from visualization_msgs.msg import Marker, MarkerArray

from s2h_ros import geometry
from s2h_ros.msg import RegistrationResult as RegistrationResultMsg


def stamp_to_sec(stamp: Time) -> float:
    return stamp.sec + 1e-9 * stamp.nanosec


def sec_to_stamp(t: float) -> Time:
    sec = int(np.floor(t))
    return Time(sec=sec, nanosec=int(round((t - sec) * 1e9)) % 1_000_000_000)


def matrix_to_transform(T: np.ndarray) -> Transform:
    q = Rotation.from_matrix(T[:3, :3]).as_quat()  # x, y, z, w
    return Transform(
        translation=Vector3(x=float(T[0, 3]), y=float(T[1, 3]), z=float(T[2, 3])),
        rotation=Quaternion(x=float(q[0]), y=float(q[1]), z=float(q[2]), w=float(q[3])),
    )


def matrix_to_pose(T: np.ndarray) -> Pose:
    tf = matrix_to_transform(T)
    return Pose(position=Point(x=tf.translation.x, y=tf.translation.y, z=tf.translation.z), orientation=tf.rotation)


def xyzquat_to_matrix(v) -> np.ndarray:
    """[x, y, z, qx, qy, qz, qw] -> (4, 4)."""
    v = np.asarray(v, dtype=np.float64)
    return geometry.make_transform(Rotation.from_quat(v[3:7]).as_matrix(), v[:3])


def transform_stamped(T: np.ndarray, stamp: Time, parent: str, child: str) -> TransformStamped:
    return TransformStamped(header=Header(stamp=stamp, frame_id=parent), child_frame_id=child,
                            transform=matrix_to_transform(T))


def odometry(T: np.ndarray, stamp: Time, parent: str, child: str) -> Odometry:
    msg = Odometry(header=Header(stamp=stamp, frame_id=parent), child_frame_id=child)
    msg.pose.pose = matrix_to_pose(T)
    return msg


def pose_stamped(T: np.ndarray, stamp: Time, frame: str) -> PoseStamped:
    return PoseStamped(header=Header(stamp=stamp, frame_id=frame), pose=matrix_to_pose(T))


def result_message(step, header: Header, scan_id: int, total_ms: float | None = None) -> RegistrationResultMsg:
    """``s2h_ros/RegistrationResult`` of one odometry step (successful or not)."""
    msg = RegistrationResultMsg(header=header, scan_id=scan_id, success=bool(step.success), message=step.message)
    msg.keyframe_id = max(int(step.keyframe_id), 0)
    msg.keyframe_stamp = sec_to_stamp(step.keyframe_stamp)
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
        msg.stage_names = [k for k in r.timings if k != "total"]
        msg.stage_times_ms = [float(r.timings[k]) for k in msg.stage_names]
        msg.total_time_ms = float(r.timings.get("total", 0.0))
    if total_ms is not None:
        msg.total_time_ms = float(total_ms)
    return msg


def _color(w: float) -> ColorRGBA:
    """Weight 0 -> red, 1 -> green."""
    w = float(np.clip(w, 0.0, 1.0))
    return ColorRGBA(r=1.0 - w, g=w, b=0.0, a=0.9)


def correspondence_markers(step, frame: str, stamp: Time, scan_pose: np.ndarray | None,
                           keyframe_pose: np.ndarray | None, max_lines: int, keyframe_max_points: int,
                           rng: np.random.Generator) -> MarkerArray:
    """Inlier correspondences as lines (keyframe point - scan point, coloured by weight) and the
    keyframe cloud, in ``frame`` (odom) via the scan's and keyframe's sensor poses there. A failed
    scan clears the previous drawing and draws nothing it does not trust."""
    header = Header(stamp=stamp, frame_id=frame)
    out = MarkerArray(markers=[Marker(header=header, ns="s2h", action=Marker.DELETEALL)])
    r = step.result
    if not step.success or r is None or scan_pose is None or keyframe_pose is None:
        return out
    idx = np.flatnonzero(r.inlier_mask) if len(r.inlier_mask) else np.zeros(0, int)
    if len(idx) > max_lines:
        idx = rng.choice(idx, max_lines, replace=False)
    scan_pts = geometry.apply_transform(scan_pose, r.source_xyz[r.correspondences[idx, 0]].astype(np.float64))
    kf_pts = geometry.apply_transform(keyframe_pose, r.target_xyz[r.correspondences[idx, 1]].astype(np.float64))
    lines = Marker(header=header, ns="s2h_correspondences", id=0, type=Marker.LINE_LIST, action=Marker.ADD)
    lines.scale.x = 0.03
    lines.pose.orientation.w = 1.0
    w = r.weights[idx] if len(r.weights) else np.ones(len(idx))
    w = w / max(float(w.max()), 1e-9) if len(w) else w
    for a, b, wi in zip(kf_pts, scan_pts, w):
        lines.points.extend([Point(x=float(a[0]), y=float(a[1]), z=float(a[2])),
                             Point(x=float(b[0]), y=float(b[1]), z=float(b[2]))])
        c = _color(wi)
        lines.colors.extend([c, c])
    out.markers.append(lines)
    if step.keyframe_xyz is not None and keyframe_max_points > 0:
        kf = step.keyframe_xyz
        if len(kf) > keyframe_max_points:
            kf = kf[rng.choice(len(kf), keyframe_max_points, replace=False)]
        kf = geometry.apply_transform(keyframe_pose, kf.astype(np.float64))
        cloud = Marker(header=header, ns="s2h_keyframe", id=1, type=Marker.POINTS, action=Marker.ADD)
        cloud.scale.x = cloud.scale.y = 0.08
        cloud.pose.orientation.w = 1.0
        cloud.color = ColorRGBA(r=0.2, g=0.6, b=1.0, a=0.6)
        cloud.points = [Point(x=float(p[0]), y=float(p[1]), z=float(p[2])) for p in kf]
        out.markers.append(cloud)
    return out
