"""The axis a cloud's scan pattern is drawn about, read from the cloud itself.

A spinning lidar's rings are cones about its spin axis: every point of one laser has the same
elevation about that axis, so the elevations' histogram is a comb of sharp peaks there and is
smeared anywhere else. The axis matters where the pipeline asks whether two scans sit at *zero
motion* (``hypotheses.at_zero_motion``): there each ring lies on its twin whatever the scene, but
only if the two spin axes agree; a turn about the axis keeps the rings, a tilt moves them. A
cloud in its sensor's frame (or any frame fixed to the sensor) has its rings about z even when the
sensor leans (handheld rigs); a level scan turned afterwards (the evaluation's synthetic
``--tilt``) has them about its ground's up. Written here because no maintained library reads a
spin axis from a cloud; numpy's bincount is the whole of it.
"""
from __future__ import annotations

import numpy as np

# Elevation histogram bins (deg): rings of 16-128-beam lidars lie 0.1-2 deg apart. Deskewing
# smears them (real Newer College OS1-64 scans about z: 0.012 raw, 0.0035 deskewed), yet they
# stay sharper about z than about any other axis.
BIN_DEG = 0.1
# Points nearer than this (m) are left out: a voxel there spans several bins of elevation.
MIN_RANGE_M = 2.0
# A tilted cloud's pattern is about z only when its elevations about z are at least this much
# sharper than about the ground's up (real handheld Newer College OS1-64 scans, deskewed: 1.5-1.6;
# level simulated scans tilted afterwards: about the up 3-23x sharper; no rings, a Livox: 1.0).
Z_MARGIN = 1.25


def ring_sharpness(xyz: np.ndarray, axis: np.ndarray) -> float:
    """How ring-like ``xyz (N, 3)`` (sensor at the origin, metres) is about the unit ``axis (3,)``:
    the collision probability of its points' elevation histogram (``BIN_DEG`` bins), about 1 / rings
    for a spinning lidar about its spin axis, 1 / bins spanned when smeared; 0 without points."""
    xyz = np.asarray(xyz, np.float64)
    r = np.linalg.norm(xyz, axis=1)
    far = r > MIN_RANGE_M
    if not far.any():
        return 0.0
    elevation = np.degrees(np.arcsin(np.clip(xyz[far] @ axis / r[far], -1.0, 1.0)))
    counts = np.bincount(np.floor((elevation + 90.0) / BIN_DEG).astype(np.int64)).astype(np.float64)
    p = counts / counts.sum()
    return float(p @ p)


def pattern_axis(xyz: np.ndarray, up: np.ndarray) -> np.ndarray:
    """``(3,)`` the axis ``xyz (N, 3)``'s scan pattern is drawn about: z when ``up`` (its ground's,
    unit) is z or the rings are ``Z_MARGIN`` sharper about z, else ``up`` (also where neither shows
    rings: the pattern is then judged as a level scan's, the cautious reading at zero motion)."""
    z = np.array([0.0, 0.0, 1.0])
    up = np.asarray(up, np.float64)
    if np.allclose(up, z):
        return z
    return z if ring_sharpness(xyz, z) >= Z_MARGIN * ring_sharpness(xyz, up) else up
