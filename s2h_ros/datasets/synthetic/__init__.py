"""Synthetic lidar world with exact ground truth: the project's training and test data.

Procedural worlds of several scene families (``scene``, ``families``: towns, suburbs, parking
lots, open fields, highways, tunnels, rooms, offices, warehouses), vehicle drives with exact poses
(``trajectory``), lidar / depth-camera models (``sensor``) ray-cast with Open3D, sequences and
>= 10 m registration pairs written in the KITTI odometry layout (``sequence``), and the check
of simulated scans against the bundled real KITTI scans (``realism``).
"""
from __future__ import annotations

from s2h_ros.datasets.synthetic.families import FAMILIES
from s2h_ros.datasets.synthetic.scene import SyntheticWorld
from s2h_ros.datasets.synthetic.sensor import LIDAR_PRESETS, LidarModel
from s2h_ros.datasets.synthetic.sequence import (
    CARRIERS,
    SyntheticScan,
    KITTI_CALIB,
    SyntheticSequence,
    simulate_sequence,
    synthetic_pairs,
    write_kitti_layout,
)
from s2h_ros.datasets.synthetic.trajectory import Trajectory

__all__ = [
    "CARRIERS",
    "FAMILIES",
    "KITTI_CALIB",
    "LIDAR_PRESETS",
    "LidarModel",
    "SyntheticScan",
    "SyntheticSequence",
    "SyntheticWorld",
    "Trajectory",
    "simulate_sequence",
    "synthetic_pairs",
    "write_kitti_layout",
]
