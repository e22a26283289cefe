"""Range-sensor models: spinning lidars (HDL-64E-like by default) and a depth camera.

A model gives the ray directions in its own frame (x forward, y left, z up, as the Velodyne
frame in KITTI), the firing time of every ray relative to the scan stamp (for motion
distortion), and the measurement model that turns exact ray hits into returns: Gaussian range
noise, random dropouts, a weak-echo cut that drops dark or grazing surfaces far away, and a
reflectance value in [0, 1] (KITTI's fourth column).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from s2h_ros.datasets.synthetic.scene import Hits

LIDAR_PRESETS = ("hdl64", "vlp32", "vlp16", "os128", "depth_camera")


def _hdl64_elevations() -> np.ndarray:
    """HDL-64E vertical pattern: upper block of 32 lasers +2 .. -8.33 deg, lower block -8.83 .. -24.9 deg."""
    return np.concatenate([np.linspace(2.0, -8.33, 32), np.linspace(-8.83, -24.9, 32)])


def _vlp32_elevations() -> np.ndarray:
    """VLP-32C-like pattern: +15 .. -25 deg, densest (~0.33 deg) around the horizon."""
    u = np.linspace(-1.0, 1.0, 32)
    return np.sort(-5.0 + 20.0 * np.sign(u) * np.abs(u) ** 1.8)[::-1]


@dataclass(frozen=True)
class LidarModel:
    """A range sensor: its ray pattern, range limits and noise.

    ``projection`` is "spinning" (rings x columns, columns fired over one revolution) or
    "pinhole" (a depth camera of ``n_columns`` x ``n_rings`` pixels; every pixel at the stamp).
    """

    name: str
    elevations_deg: tuple[float, ...]  # one per ring, top to bottom ("pinhole": unused)
    n_columns: int  # azimuth steps per revolution, or image width
    max_range: float  # metres
    min_range: float = 1.0
    range_noise_std: float = 0.02  # metres, 1 sigma (pinhole: sigma = depth_noise_coeff * z^2)
    dropout: float = 0.02  # fraction of valid returns randomly lost
    rate_hz: float = 10.0
    projection: str = "spinning"
    image_height: int = 0  # pinhole only
    hfov_deg: float = 0.0  # pinhole only
    depth_noise_coeff: float = 0.0  # pinhole only, 1/m
    echo_threshold: float = 0.02  # weak-echo cut on albedo * cos(incidence) * (ref_range / r)^2

    @classmethod
    def preset(cls, name: str) -> LidarModel:
        """One of LIDAR_PRESETS ("hdl64" is the KITTI sensor)."""
        if name == "hdl64":
            # HDL-64E fires ~1.33 M points/s: at KITTI's 10 Hz that is 2083 columns (0.173 deg; the
            # datasheet's 0.09 deg holds at 5 Hz) and ~120k returns a scan. 120 m spec range, < 2 cm noise.
            return cls(name, tuple(_hdl64_elevations()), 2083, 120.0)
        if name == "vlp32":  # VLP-32C: 0.2 deg at 10 Hz
            return cls(name, tuple(_vlp32_elevations()), 1800, 120.0, range_noise_std=0.03)
        if name == "vlp16":  # VLP-16: +-15 deg in 2 deg steps, 0.2 deg at 10 Hz, 100 m
            return cls(name, tuple(np.linspace(15.0, -15.0, 16)), 1800, 100.0, range_noise_std=0.03)
        if name == "os128":  # Ouster OS1-128: 45 deg vertical field, 2048 columns
            return cls(name, tuple(np.linspace(22.5, -22.5, 128)), 2048, 120.0, min_range=0.5,
                       range_noise_std=0.03)
        if name == "depth_camera":  # RealSense-D435-like stereo depth, 424 x 240, 30 Hz
            return cls(name, (), 424, 10.0, min_range=0.2, range_noise_std=0.0, dropout=0.03, rate_hz=30.0,
                       projection="pinhole", image_height=240, hfov_deg=87.0, depth_noise_coeff=0.002,
                       echo_threshold=0.0)
        raise ValueError(f"unknown sensor preset {name!r}; choose from {LIDAR_PRESETS}")

    @property
    def n_rings(self) -> int:
        """Number of beams (image rows for a depth camera)."""
        return self.image_height if self.projection == "pinhole" else len(self.elevations_deg)

    def ray_directions(self) -> np.ndarray:
        """(n_rings, n_columns, 3) float64 unit ray directions in the sensor frame."""
        if self.projection == "pinhole":
            f = (self.n_columns / 2) / np.tan(np.radians(self.hfov_deg) / 2)
            u = (np.arange(self.n_columns) + 0.5 - self.n_columns / 2) / f
            v = (np.arange(self.image_height) + 0.5 - self.image_height / 2) / f
            V, U = np.meshgrid(v, u, indexing="ij")
            d = np.stack([np.ones_like(U), -U, -V], axis=-1)  # x forward, y left, z up
            return d / np.linalg.norm(d, axis=-1, keepdims=True)
        el = np.radians(np.asarray(self.elevations_deg))[:, None]
        # Velodyne spins clockwise seen from above, starting at the back: az = pi -> 0 (front) -> -pi.
        az = np.pi - 2 * np.pi * (np.arange(self.n_columns) + 0.5) / self.n_columns
        return np.stack([np.cos(el) * np.cos(az), np.cos(el) * np.sin(az), np.sin(el) * np.ones_like(az)],
                        axis=-1)

    def column_times(self) -> np.ndarray:
        """(n_columns,) firing time of each column relative to the stamp (the front-facing column)."""
        if self.projection == "pinhole":
            return np.zeros(self.n_columns)
        return ((np.arange(self.n_columns) + 0.5) / self.n_columns - 0.5) / self.rate_hz

    def measure(self, hits: Hits, directions: np.ndarray, rng: np.random.Generator,
                noise: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Exact hits -> (N,) noisy ranges along each ray (NaN: no return) and (N,) reflectance.

        Random draws are made for the N rays in order, so a seed fixes the result.
        """
        t = hits.t
        if self.projection == "pinhole":
            depth = t * directions[:, 0]  # distance along the optical axis
            valid = np.isfinite(t) & (depth >= self.min_range) & (depth <= self.max_range)
            sigma = self.depth_noise_coeff * np.where(valid, depth, 0.0) ** 2
        else:
            valid = np.isfinite(t) & (t >= self.min_range) & (t <= self.max_range)
            sigma = np.float32(self.range_noise_std)
            ref_range = 0.6 * self.max_range
            echo = hits.albedo * hits.cos_incidence * (ref_range / np.maximum(t, 1e-3)) ** 2
            thr = self.echo_threshold * (rng.uniform(0.5, 1.5, len(t)).astype(np.float32) if noise else 1.0)
            valid &= echo > thr
        reflectance = np.clip(hits.albedo * np.sqrt(hits.cos_incidence), 0.0, 1.0)
        if noise:
            valid &= rng.uniform(size=len(t)) >= self.dropout
            if self.projection == "pinhole":
                sigma = sigma / np.abs(directions[:, 0])  # depth noise -> noise along the ray
            t = t + rng.standard_normal(len(t), dtype=np.float32) * sigma.astype(np.float32)
            reflectance = np.clip(reflectance + 0.02 * rng.standard_normal(len(t), dtype=np.float32), 0.0, 1.0)
        return np.where(valid, t, np.nan), reflectance.astype(np.float32)
