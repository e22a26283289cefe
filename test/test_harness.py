"""The evaluation harness: measurement, side-by-side pair and sequence runs, reports and plots."""
from __future__ import annotations

import json
import mmap

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from s2h_ros.datasets.types import PointCloudPair, Scan
from s2h_ros.evaluation.harness import chain_odometry, evaluate_pairs, evaluate_sequence, measure
from s2h_ros.evaluation.methods import MethodResult
from s2h_ros.evaluation.metrics import THRESHOLDS
from s2h_ros.evaluation.plots import error_cdfs, trajectories_top_view
from s2h_ros.evaluation.report import pairs_table, sequence_table
from s2h_ros.outputs import jsonable

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _transform(yaw_deg: float, t) -> np.ndarray:
    T = np.eye(4)
    T[:3, :3] = Rotation.from_euler("z", yaw_deg, degrees=True).as_matrix()
    T[:3, 3] = t
    return T


class Identity:
    """Answers identity for every pair: right only when the pair has (almost) not moved."""

    name = "identity"

    def register(self, source, target) -> MethodResult:
        return MethodResult(transform=np.eye(4), success=True, timings={"solve": 0.001},
                            info={"inliers": len(source), "note": "always identity", "matrix": np.eye(2)})


class Crashes:
    name = "crashes"

    def register(self, source, target) -> MethodResult:
        raise RuntimeError("solver exploded")


class PoseOracle:
    """Registers scan k to scan k-1 exactly from their stored poses; may refuse some frames."""

    name = "oracle"

    def __init__(self, poses_by_id: dict[int, np.ndarray], refuse: set[int] = frozenset()):
        self.poses_by_id, self.refuse = poses_by_id, refuse

    def register(self, source, target) -> MethodResult:
        Ps, Pt = self.poses_by_id[id(source)], self.poses_by_id[id(target)]
        return MethodResult(transform=np.linalg.inv(Pt) @ Ps, success=id(source) not in self.refuse)


class Drive:
    """A generated curving drive (1.5 m/frame) of random-point scans with known poses (world origin offset)."""

    name = "generated_drive"

    def __init__(self, frames: int = 100, rng=None, with_truth: bool = True):
        self.with_truth = with_truth
        rng = rng or np.random.default_rng(0)
        offset = _transform(30.0, [100.0, -50.0, 2.0])  # truth does not start at identity
        self._poses = np.stack([offset @ _transform(0.8 * k, [1.5 * k, 0.02 * k**1.5, 0]) for k in range(frames)])
        self._scans = [Scan(stamp=0.1 * k, points=rng.normal(size=(50, 3)).astype(np.float32), pose=p, index=k)
                       for k, p in enumerate(self._poses)]

    def __len__(self):
        return len(self._scans)

    def __getitem__(self, i):
        return self._scans[i]

    def __iter__(self):
        return iter(self._scans)

    @property
    def poses(self):
        return self._poses if self.with_truth else None


@pytest.fixture
def pairs(rng) -> list[PointCloudPair]:
    cloud = rng.normal(size=(200, 3)).astype(np.float32)
    motions = [_transform(1.0, [0.1, 0, 0]), _transform(2.0, [0, 0.2, 0]), _transform(90.0, [5, 0, 0]),
               _transform(0.0, [0.7, 0, 0])]
    return [PointCloudPair(cloud, cloud, T, name=f"p{k}") for k, T in enumerate(motions)]


def test_measure_sees_native_peak_memory_freed_before_the_block_ends():
    with measure() as m:
        # Fresh anonymous pages (a numpy array may reuse resident heap after earlier tests).
        block = mmap.mmap(-1, 40 * 2**20)
        block.write(b"\1" * len(block))  # 40 MiB, touched, then freed
        block.close()
    assert m.rss_method in ("vmhwm", "ru_maxrss")
    if m.rss_method == "vmhwm":  # exact peak growth on Linux
        assert 35 < m.peak_rss_mb < 200
    assert m.wall_s > 0
    assert m.cuda_peak_mb is None or m.cuda_peak_mb >= 0


def test_pairs_are_scored_per_method_side_by_side_and_crashes_are_failures(pairs):
    ev = evaluate_pairs({"identity": Identity(), "crashes": Crashes()}, pairs, THRESHOLDS["kitti"], progress=False)
    assert len(ev.records) == 2 * len(pairs)
    assert [r["method"] for r in ev.records[:4]] == ["identity", "crashes", "identity", "crashes"]
    ident = ev.summary["identity"]
    assert ident["recall"] == pytest.approx(0.5)  # 1 deg/0.1 m and 2 deg/0.2 m pass; 90 deg and 0.7 m fail
    assert ident["re_mean_deg"] == pytest.approx(1.5) and ident["te_mean_m"] == pytest.approx(0.15)
    assert ident["stage_time_mean_s"] == {"solve": pytest.approx(0.001)}
    assert ev.records[0]["info"] == {"inliers": 200, "note": "always identity"}  # plain values only
    assert ident["info_mean"] == {"inliers": pytest.approx(200.0)}
    crash = ev.summary["crashes"]
    assert crash["recall"] == 0 and crash["exceptions"] == len(pairs) and crash["reported_success"] == 0
    assert "solver exploded" in ev.records[1]["error"]


def test_sequence_only_method_is_refused_for_pairs(pairs):
    class OdometryOnly:
        def odometry(self, sequence):
            return sequence.poses

    with pytest.raises(ValueError, match="'kiss' has no register"):
        evaluate_pairs({"kiss": OdometryOnly()}, pairs, THRESHOLDS["kitti"], progress=False)


def test_chained_exact_registrations_reproduce_the_trajectory_and_refusals_keep_velocity():
    seq = Drive(frames=20)
    poses_by_id = {id(s.points): s.pose for s in seq}
    exact = chain_odometry(PoseOracle(poses_by_id), seq)
    truth = np.linalg.inv(seq.poses[0]) @ seq.poses
    np.testing.assert_allclose(exact, truth, atol=1e-9)
    refused = chain_odometry(PoseOracle(poses_by_id, refuse={id(seq[7].points)}), seq)
    np.testing.assert_allclose(refused[:7], truth[:7], atol=1e-9)
    step6 = np.linalg.inv(truth[5]) @ truth[6]
    np.testing.assert_allclose(refused[7], refused[6] @ step6, atol=1e-9)  # constant velocity


def test_sequence_evaluation_rebases_truth_and_reports_drift_and_time():
    seq = Drive(frames=100)
    poses_by_id = {id(s.points): s.pose for s in seq}

    class Drifting:
        """Odometry that stretches the true path by 2 %."""

        def odometry(self, sequence):
            rel = np.linalg.inv(sequence.poses[0]) @ sequence.poses
            out = rel.copy()
            out[:, :3, 3] *= 1.02
            return out

    ev = evaluate_sequence({"oracle": PoseOracle(poses_by_id), "drifting": Drifting()}, seq, progress=False)
    np.testing.assert_allclose(ev.gt[0], np.eye(4), atol=1e-12)
    exact, drift = ev.summary["oracle"], ev.summary["drifting"]
    assert exact["length_m"] > 100 and exact["segments"] > 0
    assert exact["t_err_pct"] == pytest.approx(0, abs=1e-6) and exact["ate_rmse_m"] == pytest.approx(0, abs=1e-6)
    assert 1.9 < drift["t_err_pct"] < 2.2 and drift["ate_rmse_m"] > 0.1
    assert exact["time_per_frame_ms"] > 0 and exact["frames"] == 100
    method_s = exact["time_per_frame_ms"] * 100 / 1e3  # the method's time excludes scan loading
    assert 0 <= exact["load_time_s"] and method_s + exact["load_time_s"] == pytest.approx(exact["time_total_s"])


def test_sequence_without_truth_or_too_short_is_rejected():
    with pytest.raises(ValueError, match="at least 2"):
        evaluate_sequence({"i": Identity()}, Drive(frames=1), progress=False)
    with pytest.raises(ValueError, match="no ground-truth poses"):
        evaluate_sequence({"i": Identity()}, Drive(frames=5, with_truth=False), progress=False)


def test_reports_are_valid_json_markdown_and_png(pairs, tmp_path):
    ev = evaluate_pairs({"identity": Identity(), "crashes": Crashes()}, pairs, THRESHOLDS["kitti"], progress=False)
    text = json.dumps(jsonable({"summary": ev.summary, "pairs": ev.records}), allow_nan=False)
    assert json.loads(text)["summary"]["crashes"]["re_mean_deg"] is None
    table = pairs_table(ev.summary).splitlines()
    assert table[0].startswith("| method | pairs | recall (%)") and len(table) == 4
    assert table[2].startswith("| identity | 4 | 50.0 | 1.50 | 15.0 |")
    cdf = error_cdfs(ev.records, tmp_path / "cdf.png", 5.0, 0.6)
    assert cdf.read_bytes()[:8] == PNG_MAGIC

    seq = Drive(frames=30)
    sev = evaluate_sequence({"oracle": PoseOracle({id(s.points): s.pose for s in seq})}, seq, progress=False)
    assert sequence_table(sev.summary).splitlines()[2].startswith("| oracle | 30 |")
    top = trajectories_top_view(sev.gt, sev.poses, tmp_path / "traj.png", title=seq.name)
    assert top.read_bytes()[:8] == PNG_MAGIC


def test_eval_command_writes_json_table_and_plot_for_the_real_3dmatch_pair(tmp_path, capsys):
    from s2h_ros.cli import main

    out = tmp_path / "demo.json"
    rc = main(["eval", "--dataset", "3dmatch-demo", "--methods", "icp,fpfh_ransac", "--json", str(out),
               "--markdown", str(tmp_path / "demo.md"), "--plots", str(tmp_path), "--no-progress",
               "--jsonl", str(tmp_path / "records.jsonl")])
    assert rc == 0
    result = json.loads(out.read_text())
    streamed = [json.loads(line) for line in (tmp_path / "records.jsonl").read_text().splitlines()]
    assert streamed == result["pairs"]
    assert result["scale"] == "indoor" and result["threshold"] == {"re_deg": 15.0, "te_m": 0.3}
    assert set(result["summary"]) == {"icp", "fpfh_ransac"}
    assert result["summary"]["fpfh_ransac"]["recall"] == 1.0  # RANSAC registers this real pair
    assert result["settings"]["fpfh_ransac"]["settings"]["voxel"] == 0.05
    assert "| fpfh_ransac | 1 | 100.0 |" in capsys.readouterr().out
    assert (tmp_path / "demo.md").read_text() == result["table"]
    assert (tmp_path / "3dmatch-demo_error_cdf.png").read_bytes()[:8] == PNG_MAGIC


def test_eval_command_refuses_a_sequence_method_on_pairs_with_a_clear_message():
    from s2h_ros.cli import main

    with pytest.raises(SystemExit, match="'kiss_icp' evaluates sequence only, not pairs"):
        main(["eval", "--dataset", "3dmatch-demo", "--methods", "kiss_icp", "--no-progress"])
    with pytest.raises(SystemExit, match="needs --root"):
        main(["eval", "--dataset", "kitti", "--methods", "icp", "--no-progress"])


def test_eval_command_runs_kiss_icp_on_a_short_simulated_sequence(tmp_path):
    pytest.importorskip("kiss_icp")
    from s2h_ros.cli import main

    out = tmp_path / "seq.json"
    rc = main(["eval", "--dataset", "synthetic", "--task", "sequence", "--length-m", "20", "--limit", "4",
               "--methods", "kiss_icp", "--json", str(out), "--plots", str(tmp_path), "--no-progress"])
    assert rc == 0
    summary = json.loads(out.read_text())["summary"]["kiss_icp"]
    assert summary["frames"] == 4 and summary["segments"] == 0  # far shorter than 100 m
    assert summary["ate_rmse_m"] < 0.5
    assert (tmp_path / "synthetic_trajectory.png").read_bytes()[:8] == PNG_MAGIC


def test_eval_command_reads_a_rosbag_with_tf_truth(tmp_path):
    pytest.importorskip("kiss_icp")
    from s2h_ros import paths
    from s2h_ros.cli import main
    from s2h_ros.datasets.io import read_points
    from s2h_ros.datasets.rosbag import write_pointcloud_bag

    world = read_points(paths.KITTI_LOOP_PAIR[0])[::3]
    poses = [_transform(1.0 * k, [1.0 * k, 0.0, 0.0]) for k in range(6)]
    scans = [Scan(stamp=1.0 + 0.1 * k, points=((world - P[:3, 3]) @ P[:3, :3]).astype(np.float32), pose=P,
                  frame_id="velodyne", index=k) for k, P in enumerate(poses)]
    bag = write_pointcloud_bag(tmp_path / "drive_bag", scans, topic="/points")
    out = tmp_path / "bag.json"
    assert main(["eval", "--dataset", "bag", "--root", str(bag), "--methods", "kiss_icp,icp",
                 "--json", str(out), "--no-progress"]) == 0
    result = json.loads(out.read_text())
    assert result["task"] == "sequence"
    for name in ("kiss_icp", "icp"):
        assert result["summary"][name]["frames"] == 6
        assert result["summary"][name]["ate_rmse_m"] < 0.05


def test_synthetic_drive_pairs_are_ten_metres_apart_with_exact_truth():
    from s2h_ros.commands.eval import DrivePairs
    from s2h_ros.datasets.synthetic.sequence import simulate_sequence
    from s2h_ros.evaluation.metrics import trajectory_distances

    drive = simulate_sequence(length_m=120.0, seed=3)
    pairs = DrivePairs(drive, n=5, min_distance=10.0, spacing=15.0)
    arc = trajectory_distances(drive.poses)
    sources = [a for a, _ in pairs.frames]
    assert len(pairs) == 5 and np.all(np.diff(arc[sources]) >= 15.0)
    for a, b in pairs.frames:
        gap = np.linalg.norm(drive.poses[b, :3, 3] - drive.poses[a, :3, 3])
        before = np.linalg.norm(drive.poses[b - 1, :3, 3] - drive.poses[a, :3, 3])
        assert gap >= 10.0 > before  # the first scan at least 10 m away
    pair = next(iter(pairs))
    a, b = pairs.frames[0]
    np.testing.assert_allclose(drive.poses[b] @ pair.T_gt, drive.poses[a], atol=1e-9)
    assert pair.source.shape[1] == 3 and len(pair.source) > 1000
    with pytest.raises(ValueError, match="too short for 50 pairs"):
        DrivePairs(drive, n=50)


def test_eval_command_reads_a_kitti_layout_sequence_folder(tmp_path):
    from s2h_ros.cli import main
    from s2h_ros.datasets.synthetic.sequence import simulate_sequence

    simulate_sequence(n_frames=5, seed=2).write_kitti(tmp_path / "seq")
    out = tmp_path / "kitti.json"
    assert main(["eval", "--dataset", "kitti", "--root", str(tmp_path / "seq"), "--methods", "icp",
                 "--json", str(out), "--no-progress"]) == 0
    summary = json.loads(out.read_text())["summary"]["icp"]
    assert summary["frames"] == 5 and summary["length_m"] > 1.0  # the vehicle moved
    assert summary["ate_rmse_m"] < 0.05  # read back from velodyne/*.bin + poses.txt + calib.txt


def test_the_s2h_method_on_a_sequence_is_the_nodes_keyframe_odometry(tmp_path):
    """`s2h eval ... --methods s2h` on a sequence runs KeyframeOdometry (tracking, trust, the local
    map) on the scans in order, not chained pair registrations: its summary counts the trusted scans."""
    from s2h_ros.cli import main
    from s2h_ros.datasets.synthetic.sequence import simulate_sequence

    simulate_sequence(n_frames=8, seed=5, sensor="hdl64", speed=8.0).write_kitti(tmp_path / "seq")
    out = tmp_path / "odometry.json"
    assert main(["eval", "--dataset", "kitti", "--root", str(tmp_path / "seq"), "--methods", "s2h",
                 "--json", str(out), "--no-progress"]) == 0
    summary = json.loads(out.read_text())["summary"]["s2h"]
    assert summary["frames"] == 8 and summary["trusted"] == 8 and "not_trusted" not in summary
    assert summary["initialised"] == 1  # the first scan starts the odometry
    assert summary["length_m"] > 4.0 and summary["ate_rmse_m"] < 0.03
