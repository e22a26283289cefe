"""Baselines (Open3D FPFH + RANSAC / FGR, point-to-plane ICP, KISS-ICP) on real and generated data."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from s2h_ros import paths
from s2h_ros.datasets.io import read_points
from s2h_ros.datasets.types import Scan
from s2h_ros.evaluation.metrics import THRESHOLDS, absolute_trajectory_error, pair_errors
from s2h_ros.evaluation.methods import METHODS, MethodSpec, MethodUnavailable, make_method

pytest.importorskip("open3d")


def _transform(yaw_deg: float, t) -> np.ndarray:
    T = np.eye(4)
    T[:3, :3] = Rotation.from_euler("z", yaw_deg, degrees=True).as_matrix()
    T[:3, 3] = t
    return T


def _moved(points: np.ndarray, T: np.ndarray) -> np.ndarray:
    return (points @ T[:3, :3].T + T[:3, 3]).astype(np.float32)


def _registered(T_pred: np.ndarray, T_gt: np.ndarray, dataset: str) -> bool:
    re, te = pair_errors(T_pred[None], T_gt[None])
    return bool(re[0] < THRESHOLDS[dataset].re_deg and te[0] < THRESHOLDS[dataset].te_m)


@pytest.fixture(scope="module")
def demo_pair():
    d = paths.THREEDMATCH_DEMO_DIR
    return np.load(d / "src.npy"), np.load(d / "ref.npy"), np.load(d / "gt.npy")


@pytest.fixture(scope="module")
def kitti_scan() -> np.ndarray:
    return read_points(paths.KITTI_LOOP_PAIR[0])


class CroppedDrive:
    """A generated sequence: a sensor drives through one real KITTI scan, seeing points within 40 m."""

    name = "cropped_drive"

    def __init__(self, world: np.ndarray, frames: int = 12):
        self.world = world
        self._poses = np.stack([_transform(1.5 * k, [1.2 * k, 0.1 * k, 0.0]) for k in range(frames)])

    def __len__(self) -> int:
        return len(self._poses)

    def __getitem__(self, i: int) -> Scan:
        local = _moved(self.world, np.linalg.inv(self._poses[i]))
        return Scan(stamp=0.1 * i, points=local[np.linalg.norm(local[:, :2], axis=1) < 40.0],
                    pose=self._poses[i], index=i)

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    @property
    def poses(self) -> np.ndarray:
        return self._poses


def test_fpfh_ransac_registers_the_real_3dmatch_demo_pair(demo_pair):
    src, ref, gt = demo_pair
    result = make_method("fpfh_ransac", "indoor").register(src, ref)
    assert result.success
    assert _registered(result.transform, gt, "3dmatch")
    assert set(result.timings) == {"features", "solve"}


def test_fpfh_fgr_recovers_a_known_large_motion_of_a_real_cloud(demo_pair):
    src = demo_pair[0][::2]
    T = _transform(60.0, [0.5, -0.3, 0.2])
    result = make_method("fpfh_fgr", "indoor").register(src, _moved(src, T))
    assert _registered(result.transform, T, "3dmatch")


def test_icp_from_identity_corrects_a_small_offset_of_a_real_kitti_scan(kitti_scan):
    T = _transform(3.0, [0.5, 0.2, 0.0])
    result = make_method("icp", "outdoor").register(kitti_scan, _moved(kitti_scan, T))
    re, te = pair_errors(result.transform[None], T[None])
    assert re[0] < 0.3 and te[0] < 0.05


def test_icp_is_local_and_fails_on_the_148_degree_kitti_loop_pair(kitti_scan):
    T = _transform(148.0, [4.0, 0.0, 0.0])
    scan = kitti_scan[::3]
    result = make_method("icp", "outdoor").register(scan, _moved(scan, T))
    assert not _registered(result.transform, T, "kitti")


@pytest.mark.parametrize("name", ["icp", "kiss_icp"])
def test_odometry_follows_a_generated_drive_through_a_real_scan(name, kitti_scan):
    if name == "kiss_icp":
        pytest.importorskip("kiss_icp")
    seq = CroppedDrive(kitti_scan[::2])
    poses = make_method(name, "outdoor").odometry(seq)
    assert poses.shape == (len(seq), 4, 4)
    assert absolute_trajectory_error(seq.poses, poses)["ate_rmse_m"] < 0.1


@pytest.mark.parametrize("name", ["fpfh_ransac", "fpfh_fgr", "icp"])
def test_bad_clouds_raise_one_clear_error(name):
    method = make_method(name, "outdoor")
    good = np.random.default_rng(0).normal(size=(100, 3))
    with pytest.raises(ValueError, match="source is empty"):
        method.register(np.zeros((0, 3)), good)
    with pytest.raises(ValueError, match="target contains NaN"):
        method.register(good, np.full((10, 3), np.nan))
    with pytest.raises(ValueError, match=r"must be an \(N, 3\) array"):
        method.register(good[:, :2], good)


def test_unknown_method_and_scale_are_named_in_the_error():
    with pytest.raises(ValueError, match="unknown method 'sift'.*fpfh_ransac"):
        make_method("sift")
    with pytest.raises(ValueError, match="unknown scale 'space'"):
        make_method("icp", "space")



def test_s2h_variants_change_config_fields_and_keep_their_name():
    method = make_method("s2h:matcher=mutual_nn+k=4", "indoor")
    assert method.name == "s2h:matcher=mutual_nn+k=4"
    assert (method.config.matcher, method.config.k, method.config.voxel_size) == ("mutual_nn", 4, 0.05)
    with pytest.raises(ValueError, match="only s2h"):
        make_method("icp:k=3")


def test_method_whose_code_is_missing_fails_when_built_not_at_import(monkeypatch):
    monkeypatch.setitem(METHODS, "ghost", MethodSpec("s2h_ros.no_such_module", "Ghost", ("pairs",), "absent"))
    with pytest.raises(MethodUnavailable, match="method 'ghost' cannot be imported"):
        make_method("ghost")
