"""Data readers; every one yields ``PointCloudPair`` / ``Scan`` / ``Sequence`` (see types.py).

Files: ``read_points`` / ``read_point_fields`` / ``write_points`` (KITTI .bin, PLY, PCD, NPY).
KITTI: ``KittiSequence``, the DGR pair protocol ``KittiPairs`` / ``dgr_pairs``, the standard
lists ``read_pair_list`` / ``kitti_benchmark_pairs``, the bundled ``kitti_loop_pair``.
3DMatch: ``ThreeDMatchScene``, ``threedmatch_pairs``, ``read_gt_log``, ``threedmatch_demo_pair``.
rosbag2 (``read_pointcloud_bag``, ``write_pointcloud_bag``, ``list_topics``) and the synthetic
world (``simulate_sequence``, ``synthetic_pairs``, ...) load on first use, since they pull in
rosbags and Open3D ray casting.
"""
from __future__ import annotations

import importlib

from s2h_ros.datasets.icp_refine import IcpResult, refine_with_icp
from s2h_ros.datasets.io import (
    PointCloudFileError,
    PointCloudFileNotFound,
    PointFields,
    read_point_fields,
    read_points,
    write_points,
)
from s2h_ros.datasets.kitti import (
    KittiPairs,
    KittiSequence,
    dgr_pairs,
    kitti_benchmark_pairs,
    kitti_loop_pair,
    read_pair_list,
)
from s2h_ros.datasets.threedmatch import ThreeDMatchScene, read_gt_log, threedmatch_demo_pair, threedmatch_pairs
from s2h_ros.datasets.types import PointCloudPair, Scan, Sequence

_LAZY = {
    "read_pointcloud_bag": "s2h_ros.datasets.rosbag",
    "write_pointcloud_bag": "s2h_ros.datasets.rosbag",
    "list_topics": "s2h_ros.datasets.rosbag",
    "SyntheticWorld": "s2h_ros.datasets.synthetic",
    "simulate_sequence": "s2h_ros.datasets.synthetic",
    "synthetic_pairs": "s2h_ros.datasets.synthetic",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "IcpResult", "KittiPairs", "KittiSequence", "PointCloudFileError", "PointCloudFileNotFound",
    "PointCloudPair", "PointFields", "Scan", "Sequence", "ThreeDMatchScene", "dgr_pairs",
    "kitti_benchmark_pairs", "kitti_loop_pair", "read_gt_log", "read_pair_list", "read_point_fields",
    "read_points", "refine_with_icp", "threedmatch_demo_pair", "threedmatch_pairs", "write_points",
    *_LAZY,
]
