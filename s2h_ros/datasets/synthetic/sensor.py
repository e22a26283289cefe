"""Range-sensor models: spinning lidars with real elevation tables, a Livox-like rosette, a depth camera.

A model gives the ray directions in its own frame (x forward, y left, z up, as the Velodyne
frame in KITTI), the firing time of every ray relative to the scan stamp (for motion
distortion), and the measurement model that turns exact ray hits into returns: Gaussian range
noise, random dropouts, a weak-echo cut that drops dark or grazing surfaces far away, and a
reflectance value in [0, 1] (KITTI's fourth column). How it is mounted (height above the
ground, downward tilt) is part of the model too; ``None`` leaves the height to the world's
vehicle (1.73 m outdoors, 1.0 m indoors, 1.5 m in an open field).

Presets (``LIDAR_PRESETS``; each preset's docstring line in ``preset`` gives its source numbers):
the original five (``hdl64``, ``vlp32``, ``vlp16``, ``os128``, ``depth_camera``, unchanged), and
``hdl32``, ``vlp32c``, ``os1_32``, ``os1_64``, ``os1_64_gen1``, ``os1_128``, ``os0_128``,
``livox`` and ``xt32m2x`` (Hesai).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from s2h_ros.datasets.synthetic.scene import Hits

LIDAR_PRESETS = ("hdl64", "vlp32", "vlp16", "os128", "depth_camera",
                 "hdl32", "vlp32c", "os1_32", "os1_64", "os1_64_gen1", "os1_128", "os0_128", "livox", "xt32m2x")

# Velodyne VLP-32C factory elevation table (degrees, sorted top to bottom), from its manual: dense
# (1/3 deg) between -4.67 and +2.33 deg around the horizon, sparse towards +15 and -25 deg.
_VLP32C_DEG = (15.0, 10.333, 7.0, 4.667, 3.333, 2.333, 1.667, 1.333, 1.0, 0.667, 0.333, 0.0, -0.333, -0.667,
               -1.0, -1.333, -1.667, -2.0, -2.333, -2.667, -3.0, -3.333, -3.667, -4.0, -4.667, -5.333, -6.148,
               -7.254, -8.843, -11.31, -15.639, -25.0)
# Rosette: two counter-rotating deflections (Risley-prism-like) of equal angle; their
# incommensurate rates make the pattern drift from scan to scan (non-repetitive). ~100 petals
# per 100 ms. These rates are this model's choice, not a Livox figure.
_ROSETTE_HZ = (560.3, -447.1)


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

    ``projection`` is "spinning" (rings x columns, columns fired over one revolution),
    "pinhole" (a depth camera of ``n_columns`` x ``n_rings`` pixels; every pixel at the stamp) or
    "rosette" (one beam, ``n_columns`` shots a scan spread over a circular field of full angle
    ``hfov_deg`` around +x, the pattern drifting from scan to scan).
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
    hfov_deg: float = 0.0  # pinhole: horizontal field; rosette: full angle of the circular field
    depth_noise_coeff: float = 0.0  # pinhole only, 1/m
    echo_threshold: float = 0.02  # weak-echo cut on albedo * cos(incidence) * (ref_range / r)^2
    mount_height: float | None = None  # metres above the ground; None: the world's vehicle height
    tilt_deg: float = 0.0  # downward pitch of the sensor on its mount (nose down > 0)

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
        if name == "hdl32":
            # HDL-32E manual: 32 lasers -30.67 .. +10.67 deg in 1.33 deg steps (41.3 deg), ~700k
            # points/s -> ~2170 columns at 10 Hz, returns 1 (manual: ignore < ~1 m) to 100 m, +-2 cm.
            return cls(name, tuple(np.linspace(10.67, -30.67, 32)), 2170, 100.0)
        if name == "vlp32c":
            # VLP-32C manual: the factory table above (+15 .. -25 deg), 0.2 deg at 10 Hz, 200 m, +-3 cm.
            return cls(name, _VLP32C_DEG, 1800, 200.0, range_noise_std=0.03)
        if name in ("os1_32", "os1_64", "os1_128"):
            # Ouster OS1 (Rev 6 and later): 45 deg vertical field (+-22.5, uniform beams), 1024
            # columns at 10 Hz (2048 for 128 beams), 0.8-120 m, repeatability 1.5-3 cm (1 sigma).
            beams = int(name.split("_")[1])
            return cls(name, tuple(np.linspace(22.5, -22.5, beams)), 2048 if beams == 128 else 1024, 120.0,
                       min_range=0.8, range_noise_std=0.02, dropout=0.01)
        if name == "os1_64_gen1":
            # Ouster OS1-64 Gen 1 (the Newer College dataset's sensor): +-16.6 deg (33.2 deg), 1024 x 10 Hz.
            return cls(name, tuple(np.linspace(16.6, -16.6, 64)), 1024, 120.0, min_range=0.8, range_noise_std=0.02,
                       dropout=0.01)
        if name == "os0_128":
            # Ouster OS0-128: 90 deg vertical field (+-45 deg), 1024 x 10 Hz. Range 0.3-50 m is this
            # model's assumption for the short-range OS0, not a checked datasheet figure.
            return cls(name, tuple(np.linspace(45.0, -45.0, 128)), 1024, 50.0, min_range=0.3, range_noise_std=0.02,
                       dropout=0.01)
        if name == "livox":
            # Livox Mid-70-like: 70.4 deg circular field, 100k points/s (10k per 100 ms scan), 2 cm
            # precision, 0.05 m minimum range; 90 m (the datasheet's range at 10 % reflectivity).
            return cls(name, (), 10000, 90.0, min_range=0.05, range_noise_std=0.02, dropout=0.01,
                       projection="rosette", hfov_deg=70.4)
        if name == "xt32m2x":
            # Hesai XT32M2X user manual, Appendix I (design values): 32 channels +19.5 .. -20.8 deg in
            # 1.3 deg steps (40.3 deg), channel 16 horizontal. Not checked here: 2000 columns (the XT
            # family's 0.18 deg at 10 Hz), 0.5-120 m, 1 cm noise (the XT-16 manual's 120 m instrument range).
            return cls(name, tuple(np.round(np.linspace(19.5, -20.8, 32), 3)), 2000, 120.0, min_range=0.5,
                       range_noise_std=0.01, dropout=0.01)
        if name == "depth_camera":  # RealSense-D435-like stereo depth, 424 x 240, 30 Hz
            return cls(name, (), 424, 10.0, min_range=0.2, range_noise_std=0.0, dropout=0.03, rate_hz=30.0,
                       projection="pinhole", image_height=240, hfov_deg=87.0, depth_noise_coeff=0.002,
                       echo_threshold=0.0)
        raise ValueError(f"unknown sensor preset {name!r}; choose from {LIDAR_PRESETS}")

    @property
    def n_rings(self) -> int:
        """Number of beams (image rows for a depth camera)."""
        if self.projection == "rosette":
            return 1
        return self.image_height if self.projection == "pinhole" else len(self.elevations_deg)

    @property
    def vertical_fov_deg(self) -> float:
        """Vertical extent of the ray pattern in degrees."""
        if self.projection == "spinning":
            return float(max(self.elevations_deg) - min(self.elevations_deg))
        if self.projection == "rosette":
            return self.hfov_deg
        f = (self.n_columns / 2) / np.tan(np.radians(self.hfov_deg) / 2)
        return float(2 * np.degrees(np.arctan(self.image_height / 2 / f)))

    def ray_directions(self, stamp: float = 0.0) -> np.ndarray:
        """(n_rings, n_columns, 3) float64 unit ray directions in the sensor frame.

        Only the rosette depends on ``stamp`` (the scan's time in seconds): its shots follow the
        deflection pattern over [stamp - 0.5 / rate_hz, stamp + 0.5 / rate_hz].
        """
        if self.projection == "rosette":
            t = stamp + self.column_times()
            half = np.radians(self.hfov_deg) / 4  # each deflection reaches a quarter of the full angle
            w1, w2 = 2 * np.pi * np.asarray(_ROSETTE_HZ)
            a = half * (np.exp(1j * w1 * t) + np.exp(1j * w2 * t))  # off-axis angle as a complex vector
            theta = np.abs(a)
            phi = np.angle(a)
            d = np.column_stack([np.cos(theta), np.sin(theta) * np.cos(phi), np.sin(theta) * np.sin(phi)])
            return d[None]
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
