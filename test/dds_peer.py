"""Two ROS 2 processes exchanging a PointCloud2 and a RegistrationResult over DDS (for test_dds.py).

``python test/dds_peer.py pair --qos reliable|sensor --cloud kitti|large --topic-suffix S`` starts
a *responder* and a *requester* process (same environment, so the same network namespace and
ROS_DOMAIN_ID), waits for both and prints their JSON reports as one JSON object.

- requester: publishes the cloud, waits until the responder is matched (count_subscribers /
  count_publishers polling), republishes every ``--resend`` s until a RegistrationResult for it
  arrives, then reports what came back.
- responder: decodes each cloud with s2h_ros.ros.pointcloud2.from_msg and answers with a
  RegistrationResult carrying the point count and the SHA-256 of the decoded (N, 3) float32
  points; exits once the requester's publisher has gone.
Every wait is on a condition with a deadline; nothing sleeps a fixed time.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time

import numpy as np


def make_cloud(kind: str) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The cloud the requester sends: a real KITTI scan, or 120,000 lidar-like points."""
    if kind == "kitti":
        from s2h_ros import paths

        data = np.fromfile(paths.KITTI_LOOP_PAIR[0], dtype=np.float32).reshape(-1, 6)
        return data[:, :3].copy(), {"intensity": np.abs(data[:, 5]).copy()}
    rng = np.random.default_rng(120_000)
    n = 120_000
    xyz = rng.uniform(-80, 80, size=(n, 3)).astype(np.float32)
    return xyz, {"intensity": rng.random(n, dtype=np.float32),
                 "ring": (np.arange(n) % 128).astype(np.uint16),
                 "time": np.linspace(0, 0.1, n, dtype=np.float32)}


def digest(xyz: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(xyz, dtype=np.float32).tobytes()).hexdigest()


def qos_profile(name: str):
    from rclpy.qos import QoSProfile, ReliabilityPolicy, qos_profile_sensor_data

    if name == "sensor":
        return qos_profile_sensor_data  # BEST_EFFORT, KEEP_LAST 5, VOLATILE
    return QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)


def spin_until(node, condition, timeout: float, what: str) -> float:
    """Spin ``node`` until ``condition()``; seconds waited. Raises TimeoutError naming ``what``."""
    import rclpy

    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"{what} not reached within {timeout} s")
        rclpy.spin_once(node, timeout_sec=0.05)
    return time.monotonic() - start


def requester(args) -> dict:
    import rclpy

    from s2h_ros.msg import RegistrationResult
    from s2h_ros.ros.pointcloud2 import to_msg
    from sensor_msgs.msg import PointCloud2

    xyz, extra = make_cloud(args.cloud)
    rclpy.init()
    node = rclpy.create_node("dds_requester")
    try:
        pub = node.create_publisher(PointCloud2, args.cloud_topic, qos_profile(args.qos))
        results: list = []
        node.create_subscription(RegistrationResult, args.result_topic, results.append, qos_profile("reliable"))
        matched_s = spin_until(
            node, lambda: node.count_subscribers(args.cloud_topic) >= 1
            and node.count_publishers(args.result_topic) >= 1 and pub.get_subscription_count() >= 1,
            args.timeout, "discovery of the responder")
        msg = to_msg(xyz, frame_id="velodyne", stamp=1_700_000_000_000_000_123, extra=extra)
        sends, sent_at = 0, 0.0
        deadline = time.monotonic() + args.timeout
        while not results:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no RegistrationResult within {args.timeout} s after {sends} sends")
            if sends == 0 or time.monotonic() - sent_at > args.resend:
                sent_at = time.monotonic()
                pub.publish(msg)
                sends += 1
            rclpy.spin_once(node, timeout_sec=0.02)
        round_trip_ms = (time.monotonic() - sent_at) * 1e3
        burst_delivered = burst(node, pub, msg, results, args)
        r = results[0]
        return {
            "matched_after_s": matched_s, "sends": sends, "round_trip_ms": round_trip_ms,
            "sent_points": len(xyz), "sent_sha256": digest(xyz), "cloud_bytes": len(msg.data),
            "reply": {"success": r.success, "num_source_points": r.num_source_points, "sha256": r.message,
                      "frame_id": r.header.frame_id, "stamp": [r.header.stamp.sec, r.header.stamp.nanosec],
                      "centroid": [r.transform.translation.x, r.transform.translation.y,
                                   r.transform.translation.z],
                      "stage_names": list(r.stage_names)},
            "sent_centroid": xyz.astype(np.float64).mean(axis=0).tolist(),
            "burst_sent": args.burst, "burst_delivered": burst_delivered,
        }
    finally:
        node.destroy_node()
        rclpy.shutdown()


def burst(node, pub, msg, results: list, args) -> int:
    """Once the channel works, publish ``args.burst`` clouds at ``args.rate`` Hz; replies counted.

    Every cloud is answered over RELIABLE QoS, so replies count the clouds that arrived.
    Waits for all replies, giving up ``args.grace`` s after the last send (best effort may drop).
    """
    import rclpy

    before = len(results)
    start = time.monotonic()
    for k in range(args.burst):
        while time.monotonic() < start + k / args.rate:  # pace at the sensor rate
            rclpy.spin_once(node, timeout_sec=max(0.0, start + k / args.rate - time.monotonic()))
        pub.publish(msg)
    last = time.monotonic()
    while len(results) - before < args.burst and time.monotonic() - last < args.grace:
        rclpy.spin_once(node, timeout_sec=0.02)
    return len(results) - before


def responder(args) -> dict:
    import rclpy

    from s2h_ros.msg import RegistrationResult
    from s2h_ros.ros.pointcloud2 import from_msg
    from sensor_msgs.msg import PointCloud2

    rclpy.init()
    node = rclpy.create_node("dds_responder")
    answered: list[int] = []
    try:
        result_pub = node.create_publisher(RegistrationResult, args.result_topic, qos_profile("reliable"))

        def on_cloud(msg: PointCloud2) -> None:
            start = time.perf_counter()
            xyz, dropped = from_msg(msg)
            decode_ms = (time.perf_counter() - start) * 1e3
            reply = RegistrationResult(header=msg.header, success=True, message=digest(xyz),
                                       num_source_points=len(xyz), stage_names=["decode"],
                                       stage_times_ms=[decode_ms], total_time_ms=decode_ms)
            centroid = xyz.astype(np.float64).mean(axis=0)
            reply.transform.translation.x, reply.transform.translation.y, reply.transform.translation.z = (
                float(c) for c in centroid)
            result_pub.publish(reply)
            answered.append(len(xyz))

        node.create_subscription(PointCloud2, args.cloud_topic, on_cloud, qos_profile(args.qos))
        spin_until(node, lambda: bool(answered), args.timeout, "a PointCloud2 from the requester")
        # Stay until the requester got its reply and left (its cloud publisher disappears).
        spin_until(node, lambda: node.count_publishers(args.cloud_topic) == 0, args.timeout,
                   "the requester leaving")
        return {"clouds_answered": len(answered), "points": answered[0]}
    finally:
        node.destroy_node()
        rclpy.shutdown()


def pair(args, argv: list[str]) -> dict:
    """Run responder and requester as two processes; their reports (or failures) as one dict."""
    common = [a for a in argv if a != "pair"]
    procs = {role: subprocess.Popen([sys.executable, __file__, role, *common], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
             for role in ("responder", "requester")}
    out: dict = {}
    try:
        for role, proc in procs.items():
            stdout, stderr = proc.communicate(timeout=args.timeout * 2 + 30)
            lines = stdout.strip().splitlines()
            out[role] = json.loads(lines[-1]) if lines else {"error": stderr[-2000:]}
            out[role]["returncode"] = proc.returncode
            if proc.returncode:
                out[role]["stderr"] = stderr[-2000:]
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    out["env"] = {k: os.environ.get(k) for k in
                  ("ROS_DOMAIN_ID", "ROS_AUTOMATIC_DISCOVERY_RANGE", "FASTDDS_BUILTIN_TRANSPORTS")}
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", choices=["pair", "requester", "responder"])
    parser.add_argument("--qos", choices=["reliable", "sensor"], default="reliable")
    parser.add_argument("--cloud", choices=["kitti", "large"], default="kitti")
    parser.add_argument("--topic-suffix", default="")
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument("--burst", type=int, default=0, help="clouds sent after the first reply")
    parser.add_argument("--rate", type=float, default=10.0, help="burst rate (Hz)")
    parser.add_argument("--grace", type=float, default=3.0, help="wait for burst replies (s)")
    parser.add_argument("--resend", type=float, default=0.5, help="republish period until a reply (s)")
    args = parser.parse_args(argv)
    args.cloud_topic = f"/s2h_test/cloud{args.topic_suffix}"
    args.result_topic = f"/s2h_test/result{args.topic_suffix}"
    try:
        if args.role == "pair":
            report = pair(args, argv)
        else:
            report = (requester if args.role == "requester" else responder)(args)
    except TimeoutError as exc:
        print(json.dumps({"error": str(exc)}))
        return 1
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
