"""s2h_ros.surface (normals and planarity, two ways) and geometry.voxel_mean, against Open3D on the
real RAW KITTI 00 frame 0; the odometry's helper threads (keyframe warm-up, local map) against the
same work in line."""
from __future__ import annotations

import subprocess
import sys
import threading
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import open3d as o3d
import pytest
import torch
from scipy.spatial.transform import Rotation

from s2h_ros import geometry, local_map, surface
from s2h_ros.handover import in_background
from s2h_ros.surface import NEIGHBOURS, NORMAL_RADIUS_VOXELS, local_covariances, surface_of

RAW_KITTI = Path(__file__).resolve().parents[2] / "shared" / "data" / "kitti" / "raw_00"
VOXEL = 0.3
Z = np.array([0.0, 0.0, 1.0])


@pytest.fixture(scope="module")
def raw_scan() -> np.ndarray:
    return np.fromfile(RAW_KITTI / "000000.bin", np.float32).reshape(-1, 3).astype(np.float64)


@pytest.fixture(scope="module")
def voxels(raw_scan) -> np.ndarray:
    return raw_scan[geometry.voxel_downsample(raw_scan, VOXEL)]


def _sorted(xyz: np.ndarray) -> np.ndarray:
    return xyz[np.lexsort(xyz.T)]


@pytest.mark.parametrize("offset", [0.0, 2e5])  # and 200 km from the origin, where odometry maps go
def test_voxel_mean_gives_open3d_voxel_down_sample_points_bit_for_bit(raw_scan, offset):
    points = raw_scan + offset
    ours = geometry.voxel_mean(points, 0.15)
    theirs = np.asarray(o3d.geometry.PointCloud(o3d.utility.Vector3dVector(points)).voxel_down_sample(0.15).points)
    assert len(ours) == len(theirs) > 30_000
    np.testing.assert_array_equal(_sorted(ours), _sorted(theirs))


def test_the_device_path_gives_open3d_normals_and_planarity(voxels):
    """The torch way (what a GPU device runs, here on the CPU) against the CPU's Open3D way, on the
    20k voxels of a real HDL-64E scan, including the neighbourhoods of fewer than 3 voxels."""
    covariances, counts = local_covariances(voxels, NORMAL_RADIUS_VOXELS * VOXEL, NEIGHBOURS, "cpu")
    normals, planarity, _ = surface_of(covariances)
    reference, reference_planarity, _ = surface.estimate_surface(voxels, VOXEL, "cpu")
    assert (counts.numpy() < 3).sum() > 10  # isolated voxels occur and are compared too
    np.testing.assert_allclose(np.linalg.norm(normals, axis=1), 1.0, atol=1e-9)
    angle = np.degrees(np.arccos(np.clip(np.abs(np.sum(normals * reference, axis=1)), 0.0, 1.0)))
    assert np.percentile(angle, 99.9) < 1e-3, np.percentile(angle, [50, 99, 99.9, 100])
    # Where the two smallest eigenvalues (nearly) tie the normal is any direction in their plane:
    # the two ways may then pick different ones. Everywhere else they agree.
    assert (angle > 0.01).mean() < 1e-3
    np.testing.assert_allclose(planarity, reference_planarity, atol=1e-5)  # Open3D sums in absolute coordinates


def test_in_background_hands_back_the_result_or_the_exception():
    assert in_background(sum, [1, 2, 3]).result(timeout=10) == 6
    with pytest.raises(ZeroDivisionError):
        in_background(lambda: 1 / 0).result(timeout=10)


def test_a_process_that_ends_while_a_local_map_is_built_ends_cleanly():
    """Three keyframes added and the process ends at once, the last map still being built in
    Open3D on its helper thread: the process waits for it and exits 0 (on a daemon thread it
    aborted in C++ with exit status 134, as the 10 Hz stream bench's process did at its end)."""
    script = (
        "import numpy as np\n"
        "from s2h_ros.local_map import LocalMap\n"
        f"raw = np.fromfile({str(RAW_KITTI / '000000.bin')!r}, np.float32).reshape(-1, 3)\n"
        "lm = LocalMap(voxel=0.3, keyframes=3)\n"
        "scan = lm.scan(raw)\n"
        "for k in range(3):\n"
        "    lm.add(scan, np.eye(4))\n"
        "print('added', flush=True)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "added" in done.stdout, (done.returncode, done.stderr[-2000:])
    assert "terminate called" not in done.stderr


def _in_line(fn, *args, name: str = "") -> Future:
    """``handover.in_background`` done in the caller's thread: the result, already there."""
    done: Future = Future()
    try:
        done.set_result(fn(*args))
    except Exception as exc:  # noqa: BLE001 - handed over as in_background hands it
        done.set_exception(exc)
    return done


def _started_threads(monkeypatch) -> list[str]:
    """The names of the threads started from now on (until the test ends)."""
    started: list[str] = []
    real_start = threading.Thread.start

    def start(thread):
        started.append(thread.name)
        return real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    return started


def test_the_local_map_built_on_a_helper_thread_is_the_one_built_in_line(raw_scan, monkeypatch):
    """The map of a new keyframe is built on a helper thread from ``add`` on; the refinement waits
    for it and gets the map that the same keyframes give built in line, bit for bit. The GPU
    path's surface (torch, forced here on the CPU) gives the same points and normals."""
    second = np.fromfile(RAW_KITTI / "000001.bin", np.float32).reshape(-1, 3)
    pose = geometry.make_transform(np.eye(3), np.array([0.8, 0.0, 0.0]))

    def built():
        lm = local_map.LocalMap(voxel=0.3, keyframes=3, background=False)  # the thread (test_local_map: the process)
        lm.add(lm.scan(raw_scan), np.eye(4))
        lm.add(lm.scan(second), pose)
        return lm.points()

    started = _started_threads(monkeypatch)
    xyz_thread, normals_thread = built()
    assert started.count("local map") == 2
    monkeypatch.setattr(local_map, "in_background", _in_line)
    xyz_line, normals_line = built()
    assert started.count("local map") == 2  # none more
    np.testing.assert_array_equal(xyz_thread, xyz_line)
    np.testing.assert_array_equal(normals_thread, normals_line)
    monkeypatch.setattr(surface, "on_device", lambda device: True)  # the torch path
    xyz_device, normals_device = built()
    np.testing.assert_array_equal(_sorted(xyz_device), _sorted(xyz_line))
    order_device, order_line = np.lexsort(xyz_device.T), np.lexsort(xyz_line.T)
    dots = np.abs(np.sum(normals_device[order_device] * normals_line[order_line], axis=1))
    assert np.percentile(dots, 0.1) > 1 - 1e-6


def test_a_keyframes_spatial_index_is_handed_out_while_its_surface_is_still_being_computed(voxels):
    """The worker's tracking support asks a new keyframe for its spatial index while the keyframe's
    warm-up computes its surface on a helper thread: it must not wait for the surface (held here
    by taking the surface caches' lock, as ``PreparedCloud.surface`` does while it runs)."""
    from s2h_ros.cloud import PreparedCloud

    cloud = PreparedCloud(voxels.astype(np.float32), torch.zeros(len(voxels), 1), len(voxels), "fpfh")
    with cloud._lock:  # the surface under way
        asked = in_background(cloud.spatial_index, name="worker")
        tree = asked.result(timeout=30)
    assert tree.n == len(voxels) and cloud.spatial_index() is tree


def test_the_odometry_with_keyframes_prepared_on_helper_threads_gives_the_poses_it_gives_in_line(vlp16_drive, monkeypatch):
    """A new keyframe's k-d tree, normals and planarity and the local map with it, prepared on
    helper threads, against the same work done in line when asked, on the 8-scan VLP-16 drive:
    the same verdicts and the same poses (which of a keyframe's normals and its surface is asked
    first may differ, and the two agree to the last digits)."""
    from s2h_ros import odometry
    from s2h_ros.config import OdometryConfig, RegistrationConfig

    def drive():
        odo = odometry.KeyframeOdometry(RegistrationConfig(), OdometryConfig(  # 3 new ones (it starts slowly)
            keyframe_distance=0.25, map_in_background=False))  # the map on a thread, not the helper process
        return [odo.step(vlp16_drive[i].points, float(vlp16_drive[i].stamp)) for i in range(len(vlp16_drive))]

    started = _started_threads(monkeypatch)
    threaded = drive()
    helpers = list(started)
    for module in (local_map, odometry):
        monkeypatch.setattr(module, "in_background", _in_line)
    in_line = drive()
    assert {"keyframe", "local map"} <= set(helpers) and not {"keyframe", "local map"} & set(started[len(helpers):])
    assert sum(s.new_keyframe for s in threaded) >= 2  # keyframes after the first were prepared ahead
    assert [s.success for s in threaded] == [s.success for s in in_line] and all(s.success for s in in_line)
    for a, b in zip(threaded, in_line):
        rotation, translation = geometry.transform_errors(a.pose, b.pose)
        # ICP from normals equal to the last digits stops within its tolerance of the same pose
        # (measured: at most 1.6 mm and 0.0004 deg apart over the drive).
        assert translation < 5e-3 and rotation < 0.05, (a.index, translation, rotation)


def test_the_closed_form_eigen_solver_gives_torchs_eigenvalues_and_a_smallest_eigenvector(rng):
    """Random symmetric matrices at scales from 1e-6 to 1e3, thin planes (a tiny smallest
    eigenvalue), lines and blobs (ties), and the zero matrix."""
    a = rng.normal(size=(2000, 3, 3))
    general = (a @ a.transpose(0, 2, 1)) * np.exp(rng.uniform(np.log(1e-6), np.log(1e3), 2000))[:, None, None]
    basis = np.linalg.qr(rng.normal(size=(3, 3, 3)))[0]
    shaped = np.stack([q @ np.diag(d) @ q.T for q in basis for d in ((1e-9, 0.5, 1.0), (0.0, 0.0, 2.0),
                                                                      (0.0, 1.0, 1.0), (0.3, 0.3, 0.3))])
    matrices = torch.as_tensor(np.concatenate([general, shaped, np.zeros((1, 3, 3))]))
    values, vector = surface.symmetric_eigen3(matrices)
    reference = torch.linalg.eigh(matrices)[0]
    scale = reference.abs().amax(1, keepdim=True).clamp_min(1e-300)
    # Where two eigenvalues tie the cubic's angle sits at acos(+-1), which keeps half the digits.
    assert float(((values - reference).abs() / scale).max()) < 1e-7
    np.testing.assert_allclose(vector.norm(dim=1).numpy(), 1.0, atol=1e-12)
    residual = (matrices @ vector[:, :, None])[:, :, 0] - values[:, :1] * vector  # A v = l_min v
    assert float((residual.norm(dim=1) / scale[:, 0]).max()) < 1e-7


def test_icp_targets_give_a_sparse_lidars_ground_rings_the_grounds_normal():
    """Development world 873, a VLP-16 on a car in a town: within the normal's radius a ground ring
    is a line whose "normal" may lie anywhere across it (27 % of the voxels near the ground's height
    tilted more than 8 deg, measured); over the wider neighbourhood the next rings make it the
    ground, and what stays a line across the axis is left out (10 % left, at the feet of walls,
    kerbs and poles). 0 keeps every voxel as it is."""
    from s2h_ros.datasets.synthetic import simulate_sequence

    xyz = simulate_sequence(n_frames=1, seed=873, sensor="vlp16", family="town")[0].points[:, :3].astype(np.float64)
    xyz = xyz[geometry.voxel_downsample(xyz, VOXEL)]
    ground = np.abs(xyz[:, 2] - np.percentile(xyz[:, 2], 5)) < 0.15
    found = surface.estimate_surface(xyz, VOXEL)
    normals, planarity = found.normals, found.planarity
    tilted = lambda n: np.mean(np.abs(n[:, 2]) < np.cos(np.radians(8.0)))  # noqa: E731
    before = tilted(normals[ground])
    assert before > 0.2
    keep, planes = surface.planar_surface(xyz, found, VOXEL, 0.6, Z)
    kept = np.zeros(len(xyz), bool)
    kept[keep] = True
    assert tilted(planes[ground[keep]]) < 0.5 * before and kept[ground].mean() > 0.25 and 0.2 < kept.mean() < 0.9
    own = planarity[keep] >= 0.6
    assert np.array_equal(planes[own], normals[keep][own])
    every, same = surface.planar_surface(xyz, found, VOXEL, 0.0, Z)
    assert np.array_equal(every, np.arange(len(xyz))) and np.array_equal(same, normals)


def test_icp_targets_keep_lines_along_the_rings_axis_and_leave_lines_across_it_out():
    """A pole (along the axis: no ring draws it) keeps its own normal; a rail across the axis, as
    a ring is, is left out; the walls and floor of a room keep their own normals. Tilted with the
    sensor, the same."""
    spacing = np.arange(0.0, 3.0, VOXEL)
    pole = np.c_[np.zeros_like(spacing), np.zeros_like(spacing), spacing]
    rail = np.c_[spacing + 5.0, np.zeros_like(spacing), np.ones_like(spacing)]
    u, v = (g.ravel() for g in np.meshgrid(np.arange(0, 6, VOXEL), np.arange(0, 6, VOXEL)))
    wall = np.concatenate([np.c_[np.full(u.size, 15.0), u - 3, v - 1],  # a corner of a room 15 m off
                           np.c_[u + 15, np.full(u.size, -3.0), v - 1], np.c_[u + 15, v - 3, np.full(u.size, -1.0)]])
    for tilt in (0.0, 25.0):
        turn = geometry.make_transform(Rotation.from_euler("x", tilt, degrees=True).as_matrix(), np.zeros(3))
        xyz = geometry.apply_transform(turn, np.concatenate([pole, rail, wall]))
        found = surface.estimate_surface(xyz, VOXEL)
        normals = found.normals
        keep, planes = surface.planar_surface(xyz, found, VOXEL, 0.6, turn[:3, 2])
        kept = np.zeros(len(xyz), bool)
        kept[keep] = True
        assert kept[:len(pole)].all() and not kept[len(pole):len(pole) + len(rail)].any()
        assert kept[-len(wall):].mean() > 0.8 and np.array_equal(planes, normals[keep])  # its edges are elongated


def test_icp_targets_keep_every_voxel_when_almost_nothing_is_planar():
    xyz = np.c_[np.arange(0, 30, VOXEL), np.zeros(100), np.zeros(100)]  # one straight line
    found = surface.estimate_surface(xyz, VOXEL)
    normals = found.normals
    keep, planes = surface.planar_surface(xyz, found, VOXEL, 0.6, Z)
    assert np.array_equal(keep, np.arange(len(xyz))) and np.array_equal(planes, normals)


def test_icp_targets_keep_every_voxel_where_the_planes_alone_would_let_the_scan_slide():
    """A corridor of two walls and a floor: the planes hold nothing along it (``facing_area`` 0),
    so the rails across the axis, the only hold along it, are kept, and every normal with them."""
    along, up = (g.ravel() for g in np.meshgrid(np.arange(0, 30, VOXEL), np.arange(0, 3, VOXEL)))
    walls = np.concatenate([np.c_[along, np.full(along.size, side), up] for side in (-2.0, 2.0)])
    fx, fy = (g.ravel() for g in np.meshgrid(np.arange(0, 30, VOXEL), np.arange(-1.8, 2, VOXEL)))
    floor = np.c_[fx, fy, np.zeros_like(fx)]
    rails = np.c_[np.full(14, 10.0), np.arange(-2, 2, VOXEL), np.full(14, 2.5)]
    xyz = np.concatenate([walls, floor, rails])
    found = surface.estimate_surface(xyz, VOXEL)
    normals, planarity = found.normals, found.planarity
    planar = planarity >= 0.6
    assert surface.facing_area(xyz[planar], normals[planar], VOXEL) < 0.1 < surface.facing_area(xyz, normals, VOXEL)
    keep, planes = surface.planar_surface(xyz, found, VOXEL, 0.6, Z)
    assert np.array_equal(keep, np.arange(len(xyz))) and np.array_equal(planes, normals)


def test_a_clouds_icp_target_reads_the_covariances_of_its_normals_and_keeps_them_no_longer(voxels):
    """``PreparedCloud``: normals, planarity and the ICP target of the real KITTI scan come from one
    surface whose covariances ``planar_surface`` reads again instead of searching the neighbourhoods
    twice; they are dropped with the target made (72 bytes a voxel on every keyframe), and a target
    for another ``icp_min_planarity`` searches them again, to the same voxels as from scratch."""
    from s2h_ros.cloud import PreparedCloud
    from s2h_ros.config import RegistrationConfig

    xyz = voxels.astype(np.float32)
    cloud = PreparedCloud(xyz=xyz, features=None, num_input_points=len(xyz), feature_kind="fpfh")
    found = cloud.surface(VOXEL)
    assert found.covariances.shape == (len(xyz), 3, 3) and cloud.planarity(VOXEL) is found.planarity
    assert cloud.normals(VOXEL) is found.normals
    target = cloud.icp_target(RegistrationConfig(icp_min_planarity=0.6))
    assert cloud.surface(VOXEL).covariances is None and cloud.surface(VOXEL).normals is found.normals
    keep, planes = surface.planar_surface(xyz, found, VOXEL, 0.6, cloud.pattern_axis())
    assert 0.2 < len(keep) / len(xyz) < 0.9 and np.array_equal(target.xyz, xyz[keep])
    again = cloud.icp_target(RegistrationConfig(icp_min_planarity=0.5))
    keep_again, _ = surface.planar_surface(xyz, found._replace(covariances=None), VOXEL, 0.5, cloud.pattern_axis())
    assert np.array_equal(again.xyz, xyz[keep_again]) and len(keep_again) > len(keep)
