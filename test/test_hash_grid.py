"""s2h_ros.hash_grid: the device's neighbour search against scipy's cKDTree, on random points and on
the real RAW KITTI 00 frame 0; the pipeline's spatial index by device."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.spatial import cKDTree

from s2h_ros import geometry
from s2h_ros.config import RegistrationConfig
from s2h_ros.hash_grid import DeviceIndex, HashGrid
from s2h_ros.pipeline import Registrar

RAW_KITTI = Path(__file__).resolve().parents[2] / "shared" / "data" / "kitti" / "raw_00"


@pytest.fixture(scope="module")
def kitti_voxels() -> np.ndarray:
    raw = np.fromfile(RAW_KITTI / "000000.bin", np.float32).reshape(-1, 3).astype(np.float64)
    return raw[geometry.voxel_downsample(raw, 0.3)]


def test_the_hash_grid_finds_the_exact_nearest_point_within_its_cell(rng):
    target = rng.uniform(-5, 5, (4000, 3)).astype(np.float32)
    query = rng.uniform(-6, 6, (3000, 3)).astype(np.float32)
    cell = 0.6
    d2, idx = HashGrid(torch.from_numpy(target), cell).nearest(torch.from_numpy(query))
    dist, nn = cKDTree(target).query(query, distance_upper_bound=cell)
    found = np.isfinite(dist)
    assert 0.2 < found.mean() < 0.95  # both kinds of query occur
    assert np.array_equal(idx.numpy() >= 0, found)
    assert np.array_equal(idx.numpy()[found], nn[found])
    np.testing.assert_allclose(np.sqrt(d2.numpy()[found]), dist[found], atol=1e-5)


def test_the_k_nearest_within_the_cell_are_ckdtrees_in_the_same_order(rng):
    target = rng.uniform(-4, 4, (6000, 3))
    query = rng.uniform(-5, 5, (2000, 3))
    cell, k = 1.0, 12
    d2, idx = HashGrid(torch.from_numpy(target), cell).knearest(torch.from_numpy(query), k)
    dist, nn = cKDTree(target).query(query, k=k, distance_upper_bound=cell)
    found = np.isfinite(dist)
    assert 0.05 < (~found).mean() < 0.9  # full, partial and empty neighbourhoods occur
    assert np.array_equal(idx.numpy() >= 0, found)
    assert np.array_equal(idx.numpy()[found], nn[found])
    np.testing.assert_allclose(np.sqrt(d2.numpy()[found]), dist[found], atol=1e-9)


def test_a_search_split_into_chunks_finds_what_one_search_finds(rng, monkeypatch):
    from s2h_ros import hash_grid

    target = torch.from_numpy(rng.uniform(-3, 3, (3000, 3)))
    query = torch.from_numpy(rng.uniform(-3, 3, (500, 3)))
    whole = HashGrid(target, 0.8).knearest(query, 5)
    monkeypatch.setattr(hash_grid, "CANDIDATE_BUDGET", 1)  # one query per chunk
    chunked = HashGrid(target, 0.8).knearest(query, 5)
    assert all(torch.equal(a, b) for a, b in zip(whole, chunked))


def test_the_device_index_answers_ckdtrees_query_on_a_real_scan(kitti_voxels, rng):
    """What the pipeline asks of a keyframe on a GPU (here on the CPU): the tracking support's 32
    nearest within 1.5 m and the verification's nearest within 0.6 m, on a real HDL-64E scan's voxels."""
    index, tree = DeviceIndex(kitti_voxels, "cpu"), cKDTree(kitti_voxels)
    query = kitti_voxels[:3000] + rng.normal(0, 0.3, (3000, 3))
    for k, bound in ((32, 1.5), (1, 0.6)):
        dist, idx = index.query(query, k=k, distance_upper_bound=bound, workers=-1)
        ref_dist, ref_idx = tree.query(query, k=k, distance_upper_bound=bound)
        assert dist.shape == ref_dist.shape and idx.dtype.kind == "i"
        assert np.array_equal(idx, ref_idx)  # n (len(kitti_voxels)) where none, as cKDTree says
        assert np.array_equal(np.isinf(dist), np.isinf(ref_dist)) and np.isinf(ref_dist).any() and np.isfinite(ref_dist).any()
        finite = np.isfinite(ref_dist)
        np.testing.assert_allclose(dist[finite], ref_dist[finite], atol=1e-5)  # float32 on the device
    with pytest.raises(ValueError, match="finite positive distance_upper_bound"):
        index.query(query)


def test_a_prepared_cloud_searches_with_ckdtree_on_the_cpu_and_on_the_device_elsewhere(kitti_voxels, monkeypatch):
    from s2h_ros import cloud as prepared_clouds

    cloud = Registrar(RegistrationConfig(features="fpfh")).prepare(kitti_voxels)
    assert isinstance(cloud.spatial_index(), cKDTree)
    monkeypatch.setattr(prepared_clouds, "on_device", lambda device: True)  # what a GPU device takes
    fresh = Registrar(RegistrationConfig(features="fpfh")).prepare(kitti_voxels)
    assert isinstance(fresh.spatial_index(), DeviceIndex) and fresh.spatial_index() is fresh.spatial_index()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (not counted as passing)")
def test_on_cuda_the_device_index_and_the_surface_match_the_cpu(kitti_voxels, rng):
    from s2h_ros import surface

    index, tree = DeviceIndex(kitti_voxels, "cuda"), cKDTree(kitti_voxels)
    query = kitti_voxels[:3000] + rng.normal(0, 0.3, (3000, 3))
    for k, bound in ((32, 1.5), (1, 0.6)):
        assert np.array_equal(index.query(query, k=k, distance_upper_bound=bound)[1],
                              tree.query(query, k=k, distance_upper_bound=bound)[1])
    gpu = surface.estimate_surface(kitti_voxels, 0.3, "cuda")
    cpu = surface.surface_of(surface.local_covariances(kitti_voxels, 1.5, surface.NEIGHBOURS, "cpu")[0])
    assert np.percentile(np.abs(np.sum(gpu[0] * cpu[0], axis=1)), 0.1) > 1 - 1e-9
    np.testing.assert_allclose(gpu[1], cpu[1], atol=1e-5)  # the Open3D comparison's bound (an H200 differed by more than 1e-9)
