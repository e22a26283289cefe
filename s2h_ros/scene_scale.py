"""How far a cloud reaches from its sensor, and whether the voxel size suits that scale (no ROS).

The settings come at two scales: outdoor lidar at 0.3 m voxels (``config/register.yaml``) and rooms
seen by depth cameras or indoor lidars at 0.05 m (``config/depth_camera.yaml``). At the wrong one
registration still answers, and not always safely: of held-out indoor pairs at 0.3 m (matrix base
seed 1148, docs/reliability.md) 2 of 25 wrong results were reported as trusted (a room spans a few
inlier distances, and a turn of 10-20 deg moves few of its voxels by more than one); at 0.05 m none
of 20 (base seed 1143). The other way round, outdoor scans at 0.05 m voxels are slow and meet the
indoor model. Nothing here changes a result: the node and ``s2h register`` say so, and the user
picks the settings.

The scale is the cloud's *reach*: the 90th percentile of its points' distances from the sensor (the
frame's origin). Measured on held-out simulated clouds (matrix base seed 1152, two pairs per cell,
both clouds; docs/reliability.md): eight outdoor presets (VLP-16, HDL-32, VLP-32C, OS1-32, OS1-64,
OS1-128, OS0-128 with its 90 deg field, Livox) in towns, suburbs, highways, parking lots, open
fields and tunnels reach 10.9-104 m, but for one scan blocked by something within 2 m (2.0 m);
depth cameras in rooms, offices and warehouses 4.0-10.0 m; an OS1-64 in rooms and offices 7.0-9.7 m
and in a warehouse hall 26.7-28.8 m (where the outdoor settings suit it: 4 of 4 pairs right at 0.3
m, base seed 1148). Real scans: RAW KITTI 26 m, the KITTI loop pair 42 m, Newer College OS1-64
43-47 m, the 3DMatch demo fragments 3.0-3.2 m. Hence the bounds, in voxels so that they follow the
setting: under ``MIN_REACH_VOXELS`` (10.5 m at 0.3 m) is a room's scale, over ``MAX_REACH_VOXELS``
(15 m at 0.05 m) a street's or a hall's. A stream is judged on the median reach of its first
``FIRST_SCANS`` scans, so that one scan facing a wall does not decide. A wrong hint costs a log
line; the margin to the nearest outdoor clouds (OS0-128 in parking lots and open fields, 10.9-11.7
m) is small, so the words say what the scale suggests, not what the sensor is.
"""
from __future__ import annotations

import numpy as np

REACH_PERCENTILE = 90.0
MIN_REACH_VOXELS = 35.0
MAX_REACH_VOXELS = 300.0
FIRST_SCANS = 5


def reach_m(points: np.ndarray) -> float:
    """Metres within which ``REACH_PERCENTILE`` % of the finite ``(N, >=3)`` points lie from the
    sensor (the frame's origin); 0.0 for a cloud without a finite point."""
    xyz = np.asarray(points, dtype=np.float64)[:, :3]
    distances = np.linalg.norm(xyz, axis=1)
    distances = distances[np.isfinite(distances)]
    return float(np.percentile(distances, REACH_PERCENTILE)) if len(distances) else 0.0


def voxel_hint(reach: float, voxel_size: float) -> str:
    """Advice when ``voxel_size`` (metres) does not suit a cloud that reaches ``reach`` metres
    (``reach_m``), else ""."""
    voxels = reach / voxel_size
    where = (f"{REACH_PERCENTILE:g} % of the points lie within {reach:.1f} m of the sensor, {voxels:.0f} voxels "
             f"of {voxel_size:g} m")
    if 0 < voxels < MIN_REACH_VOXELS:
        return (f"{where}: a room's scale. There a turn of 10-20 deg moves few voxels by more than the inlier "
                f"distance, and wrong results can verify; for a depth camera or an indoor lidar use "
                f"config/depth_camera.yaml (0.05 m voxels)")
    if voxels > MAX_REACH_VOXELS:
        return (f"{where}: a street's or a hall's scale for indoor settings (slow, and the indoor "
                f"features); for outdoor lidar or a large hall use config/register.yaml (0.3 m voxels)")
    return ""


class ScaleCheck:
    """The hint for a stream: ``add`` each scan; after the first ``scans`` the median reach is judged
    once, and ``add`` returns the hint then (None before and after, and "" when the voxel suits)."""

    def __init__(self, voxel_size: float, scans: int = FIRST_SCANS) -> None:
        self.voxel_size, self.scans = float(voxel_size), int(scans)
        self.reaches: list[float] = []

    def add(self, points: np.ndarray) -> str | None:
        if len(self.reaches) >= self.scans:
            return None
        reach = reach_m(points)
        if reach > 0:
            self.reaches.append(reach)
        if len(self.reaches) < self.scans:
            return None
        return voxel_hint(float(np.median(self.reaches)), self.voxel_size)
