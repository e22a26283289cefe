"""``s2h simulate``: write a synthetic lidar sequence (KITTI layout, optionally a rosbag2), or
compare simulated scans with the bundled real KITTI scans (``--compare-kitti``) or with the raw
real scans of the shared data folder (``--compare-raw``)."""
from __future__ import annotations

import argparse
from pathlib import Path

from s2h_ros.outputs import json_text, write_json, write_text

# Kept in step with FAMILIES, LIDAR_PRESETS and CARRIERS of s2h_ros.datasets.synthetic (checked by the tests),
# so that building the parser does not import Open3D.
FAMILY_NAMES = ("town", "suburban", "parking_lot", "open_field", "highway", "tunnel", "rooms", "office", "warehouse")
SENSOR_NAMES = ("hdl64", "vlp32", "vlp16", "os128", "depth_camera", "hdl32", "vlp32c", "os1_32", "os1_64",
                "os1_64_gen1", "os1_128", "os0_128", "livox", "xt32m2x")
CARRIER_NAMES = ("vehicle", "handheld")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, help="output folder (KITTI odometry single-sequence layout)")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--frames", type=int, help="number of scans")
    size.add_argument("--length-m", type=float, help="drive length in metres")
    parser.add_argument("--seed", type=int, default=0, help="world and drive seed (default 0)")
    parser.add_argument("--sensor", default="hdl64", choices=SENSOR_NAMES, help="sensor preset (default hdl64)")
    parser.add_argument("--mount-height", type=float, metavar="M",
                        help="sensor height above the ground (default: the family's vehicle, 1.73 m outdoors)")
    parser.add_argument("--tilt-deg", type=float, metavar="DEG", help="downward pitch of the sensor (default 0)")
    parser.add_argument("--sway-deg", type=float, metavar="DEG",
                        help="slow roll / pitch sway of the carried sensor up to DEG (half in yaw; default 0)")
    parser.add_argument("--carrier", choices=CARRIER_NAMES, default="vehicle",
                        help="how the sensor is carried: handheld sets --mount-height 1.6 --tilt-deg 20 --sway-deg 12 "
                             "--speed 1.0 1.6 where those are not given (default vehicle)")
    parser.add_argument("--kind", choices=("outdoor", "indoor"),
                        help="outdoor (default: the town) or indoor (default: the rooms)")
    parser.add_argument("--family", choices=FAMILY_NAMES,
                        help="scene family (default: town outdoors, rooms indoors)")
    parser.add_argument("--speed", type=float, nargs="+", metavar="M_S",
                        help="cruise speed, or low high range in m/s (default outdoor 5 15, indoor 0.4 1.5)")
    parser.add_argument("--moving-objects", type=int, default=0, help="number of moving cars / people")
    parser.add_argument("--motion-distortion", action="store_true", help="rays fired along the sweep's motion")
    parser.add_argument("--no-noise", action="store_true", help="exact ranges, no dropouts")
    parser.add_argument("--bag", action="store_true", help="also write a rosbag2 (mcap) with PointCloud2 + /tf")
    parser.add_argument("--compare-kitti", action="store_true",
                        help="print simulated-vs-real KITTI statistics instead of writing a sequence")
    parser.add_argument("--compare-raw", action="store_true",
                        help="print raw simulated-vs-real statistics (KITTI raw HDL-64E, Newer College OS1-64)")
    parser.add_argument("--data", type=Path, help="with --compare-raw: the real-data folder (default ../shared/data)")
    parser.add_argument("--png", type=Path, help="with --compare-raw: write the side-by-side plots here")
    parser.add_argument("--json", type=Path, help="write the summary / comparison as JSON here")
    parser.add_argument("--markdown", type=Path, help="with --compare-kitti / --compare-raw: write the markdown here")


def run(args: argparse.Namespace) -> int:
    if args.compare_raw:
        from s2h_ros.datasets.synthetic.realism import compare_with_raw, raw_comparison_markdown, raw_comparison_png

        result = compare_with_raw(args.data, seed=args.seed)
        text = raw_comparison_markdown(result)
        print(text)
        if args.markdown:
            write_text(args.markdown, text)
        if args.png:
            raw_comparison_png(result, args.png)
        if args.json is not None:
            write_json(args.json, result)
        return 0
    if args.compare_kitti:
        from s2h_ros.datasets.synthetic.realism import compare_with_kitti, comparison_markdown

        result = compare_with_kitti(seed=args.seed)
        text = comparison_markdown(result)
        print(text)
        if args.markdown:
            write_text(args.markdown, text)
        if args.json is not None:
            write_json(args.json, result)
        return 0
    if args.out is None or (args.frames is None and args.length_m is None):
        raise SystemExit("s2h simulate: give --out DIR and one of --frames N / --length-m L (or --compare-kitti)")
    from s2h_ros.datasets.synthetic import CARRIERS, simulate_sequence

    speed = None
    if args.speed:
        if len(args.speed) > 2:
            raise SystemExit("--speed takes one value or a low high pair")
        speed = args.speed[0] if len(args.speed) == 1 else (args.speed[0], args.speed[1])
    given = {"mount_height": args.mount_height, "tilt_deg": args.tilt_deg, "sway_deg": args.sway_deg, "speed": speed}
    carried = {**CARRIERS[args.carrier], **{k: v for k, v in given.items() if v is not None}}
    seq = simulate_sequence(n_frames=args.frames, length_m=args.length_m, seed=args.seed, sensor=args.sensor,
                            kind=args.kind, family=args.family, **carried, noise=not args.no_noise,
                            motion_distortion=args.motion_distortion, moving_objects=args.moving_objects)
    summary = {"out": str(args.out), **seq.write_kitti(args.out, progress=True)}
    if args.bag:
        summary["bag"] = str(_write_bag(seq, args.out / "bag"))
    print(json_text(summary))
    if args.json is not None:
        write_json(args.json, summary)
    return 0


def _write_bag(seq, path: Path) -> Path:
    """rosbag2 (mcap): scans as PointCloud2 on /velodyne_points, exact poses as /tf world -> velodyne."""
    try:
        from s2h_ros.datasets.rosbag import write_pointcloud_bag
    except ImportError as exc:
        raise SystemExit(f"--bag needs s2h_ros.datasets.rosbag.write_pointcloud_bag, not available: {exc}")
    return write_pointcloud_bag(path, iter(seq), topic="/velodyne_points", frame_id="velodyne", storage="mcap",
                                tf=seq.poses, overwrite=True)
