"""The robustness catalogue of ``s2h bench robustness`` (s2h_ros.benchmarks.robustness), case by
case, against one registration_node process over DDS with its default configuration: malformed
PointCloud2 messages, odd but valid clouds, bad stamps and frames, a gap, a teleport, noise,
another scene, a burst, a 16-beam drive, between real scans of the curved 64-beam drive. Each case
must end with its own outcome (the message, event, TF or not), the node alive and tracking (the
next real scan trusted), and nothing of the case's own trusted that is wrong. Every case of the
catalogue, the start-up, process, CLI and library ones included, names the test that asserts
it; that those tests exist is checked here.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import rclpy
from rclpy.context import Context

from s2h_ros.benchmarks.robustness import CASES, Bench, Scenes, other_world_scan, run_case

TEST_DIR = Path(__file__).parent
DOMAIN = 140 + os.getpid() % 10  # apart from the other modules' domains (see test_process_faults.py)
CASE = {c.name: c for c in CASES}

NEXT_TRUSTED = "; next scan trusted"  # the case's answer, then the drive's next real scan, trusted
TRUSTED_RIGHT = r"^trusted, TF x1, \d cm / 0\.\d deg off" + NEXT_TRUSTED
MALFORMED = "^failed: malformed PointCloud2: "
TOO_FEW = r"^failed: bad scan: {} finite points \(need 100\), no TF" + NEXT_TRUSTED
# below min_fitness, from low_fitness_floor up: how much fits off the ground too (a global search's
# result: both ways, the source's voxels against the target's and back)
NOT_TRUSTED = (r"^failed: not trusted: \d+ inlier correspondences \(need 30\), fitness 0\.\d+"
               r"(, 0\.\d+ the better way)? \(need 0\.50\)"
               r"(, 0\.\d+ off the ground \(need 0\.45 below fitness 0\.50\)"
               r"|; off the ground (0\.\d+|-) of the source's voxels and (0\.\d+|-) of the target's fit "
               r"\(need 0\.45 either way below fitness 0\.50\))?, no TF")

# The outcome of each node case (the bench's table text), in the catalogue's order.
NODE_OUTCOMES = {
    "drive_before": r"^8 of 8 trusted, worst \d cm / 0\.\d deg \[initialised\], TF for 8$",
    "pc2_no_z": MALFORMED + r"PointCloud2 has no field z \(fields: \['x', 'y'\]\), no TF" + NEXT_TRUSTED,
    "pc2_unknown_datatype": MALFORMED + r"field 'x' has unsupported datatype 9 \(PointField allows 1\.\.8\), no TF"
                            + NEXT_TRUSTED,
    "pc2_point_step_too_small": MALFORMED + r"field 'z' spans bytes \[8, 12\) outside point_step 8, no TF"
                                + NEXT_TRUSTED,
    "pc2_data_one_byte_short": MALFORMED + r"data holds \d+ bytes; height 1 \* row_step (\d+) = \1 \(width \d+, "
                               r"point_step 12\), no TF" + NEXT_TRUSTED,
    "pc2_row_step_too_small": MALFORMED + r"row_step \d+ < width \d+ \* point_step 12, no TF" + NEXT_TRUSTED,
    "pc2_huge_width": MALFORMED + r"row_step \d+ < width 4294967295 \* point_step 12, no TF" + NEXT_TRUSTED,
    "pc2_height_without_data": MALFORMED + r"data holds (\d+) bytes; height 2 \* row_step \1 = \d+ .*, no TF"
                               + NEXT_TRUSTED,
    "pc2_count_zero": MALFORMED + "field 'x' has count 0; expected >= 1, no TF" + NEXT_TRUSTED,
    "pc2_field_twice": MALFORMED + "field 'x' appears twice, no TF" + NEXT_TRUSTED,
    "pc2_coordinate_count_2": MALFORMED + "field 'x' has count 2; coordinates need count 1, no TF" + NEXT_TRUSTED,
    "scan_big_endian": TRUSTED_RIGHT,
    "scan_byte_order_flag_wrong": r"^failed: bad scan: cloud: \d+ of \d+ finite points lie more than 10000 m from the "
                                  r"cloud's median along some axis: not metric coordinates \(random, corrupt or "
                                  r"byte-swapped data\?\), no TF" + NEXT_TRUSTED,
    "scan_nan_inf_points": TRUSTED_RIGHT,
    "scan_organized_nan_holes": TRUSTED_RIGHT,
    "scan_point_at_1e9": TRUSTED_RIGHT,
    "scan_point_at_1e30": TRUSTED_RIGHT,
    "scan_float64": TRUSTED_RIGHT,
    "scan_extra_fields": TRUSTED_RIGHT,
    "scan_empty": TOO_FEW.format(0),
    "scan_all_nan": TOO_FEW.format(0),
    "scan_one_point": TOO_FEW.format(1),
    "scan_fifty_points": TOO_FEW.format(50),
    "stamp_zero": r"^failed: stamp is zero \(sec 0, nanosec 0\): the driver set no time; not registered, no TF"
                  + NEXT_TRUSTED,
    "frame_id_odom": r"^failed: frame_id 'odom' is the odometry frame: a scan must be in its sensor frame "
                     r"\(registering it would publish odom -> odom\); not registered, no TF" + NEXT_TRUSTED,
    "frame_id_empty": TRUSTED_RIGHT,
    "stamp_duplicate": r"^failed: stamp (\d+\.\d+) s is not after the last scan's \1 s \(duplicate or out of order\), "
                       r"no TF" + NEXT_TRUSTED,
    "stamp_backwards": r"^failed: stamp (\d+)\.(\d)00000000 s is not after the last scan's \1\.\d00000000 s "
                       r"\(duplicate or out of order\), no TF" + NEXT_TRUSTED,
    "stamp_loop_back_50s": r"^trusted \[time_reset\], TF x1; then 2 of 2 trusted, worst \d cm / 0\.\d deg, TF for 2$",
    "motion_zero": r"^3 of 3 trusted, worst 0 cm / 0\.0 deg, TF for 3" + NEXT_TRUSTED,
    "motion_gap_10s": r"^trusted \[relocalised\], TF x1, \d cm / 0\.\d deg off$",
    "motion_teleport": r"^4\d m: failed: not (trusted|reproduced): .*, no TF; "
                       r"4\d m: failed: (not trusted|ambiguous): .*, no TF; "
                       r"4\d m: failed: tracking lost \(not (trusted|reproduced): .*\); no kept keyframe matches: "
                       r"segment \d+ starts at the last trusted pose, .* \[new_segment\], no TF; "
                       r"4\d m: trusted, TF x1; 4\d m: trusted, TF x1, \d cm / 0\.\d deg off$",
    "motion_very_fast": r"^2 of 2 trusted, worst \d cm / 0\.\d deg, TF for 2" + NEXT_TRUSTED,
    "scene_noise": NOT_TRUSTED + NEXT_TRUSTED,
    "scene_other_world": NOT_TRUSTED + NEXT_TRUSTED,
    "burst": r"^[1-5] of 6 answered, the newest trusted( \[relocalised\])?, TF x1, \d cm / 0\.\d deg off"
             + NEXT_TRUSTED,
    "sensor_vlp16": r"^5 of 5 trusted, worst \d cm / 0\.\d deg \[time_reset\], TF for 5$",
    "drive_after": r"^20 of 20 trusted, worst \d cm / 0\.\d deg \[time_reset\], TF for 20$",
    "node_sigint": r"^exit 0 after \d+\.\d s$",
}


@pytest.fixture(scope="module")
def bench(curved_drive, vlp16_drive, tmp_path_factory):
    """The catalogue's bench on the conftest drives, its node in this module's DDS domain."""
    context = Context()
    rclpy.init(context=context, domain_id=DOMAIN)
    env = dict(os.environ, ROS_DOMAIN_ID=str(DOMAIN), ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST")
    scenes = Scenes(drive=curved_drive, vlp16=vlp16_drive, other=other_world_scan(), drive_dir=curved_drive.folder)
    b = Bench(scenes, tmp_path_factory.mktemp("robustness"), context=context, env=env)
    yield b
    b.close()
    rclpy.try_shutdown(context=context)


def test_every_node_case_is_here_and_every_case_names_a_test_that_exists():
    node_cases = [c.name for c in CASES if c.layer.startswith("node:") or c.final]
    assert node_cases == list(NODE_OUTCOMES)
    for case in CASES:
        file, name = case.test.split("::")
        assert re.search(rf"^def {name}\(", (TEST_DIR / file).read_text(), re.M), (case.name, case.test)


@pytest.mark.parametrize("name", list(NODE_OUTCOMES))
def test_node_case(bench, name):
    row = run_case(bench, CASE[name])
    assert re.search(NODE_OUTCOMES[name], row["outcome"]), row["outcome"]
    assert not row["crashed"], row
    assert row.get("case_trusted_wrong", False) is False, row["outcome"]
    assert row["expected"], row["outcome"]
