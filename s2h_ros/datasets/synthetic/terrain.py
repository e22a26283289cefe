"""Ground shapes as sums of random plane waves: smooth terrain, centimetre relief, a road axis.

A wave table holds one wave per row (wavenumber, direction, amplitude, phase); a world keeps one
table for the terrain its vehicle drives on and one for the short relief of its ground surfaces.
``Centerline`` is the axis of the line-shaped families (tunnel, highway): a gentle sinusoidal
curve y(x), or a straight line when its amplitude is 0.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def random_waves(rng: np.random.Generator, n: int, wavelengths: tuple[float, float], amplitude) -> np.ndarray:
    """(n, 4) plane waves: wavenumber, direction, amplitude (``amplitude(k)``), phase."""
    k = 2 * np.pi / rng.uniform(wavelengths[0], wavelengths[1], n)
    direction = rng.uniform(0, 2 * np.pi, n)
    phase = rng.uniform(0, 2 * np.pi, n)
    return np.column_stack([k, direction, amplitude(k), phase])


def wave_sum(waves: np.ndarray, x: np.ndarray, y: np.ndarray, gradient: bool = False) -> np.ndarray:
    """Sum of plane waves a sin(k (cos d x + sin d y) + p) at (x, y): value (...), or gradient (..., 2)."""
    x, y = np.broadcast_arrays(np.asarray(x, np.float64), np.asarray(y, np.float64))
    k, d, a, p = waves.T
    arg = k * (np.cos(d) * x[..., None] + np.sin(d) * y[..., None]) + p
    if not gradient:  # (elementwise sums: BLAS on tiny products stalls against Open3D's threads)
        return (np.sin(arg) * a).sum(-1)
    c = np.cos(arg) * (a * k)
    return np.stack([(c * np.cos(d)).sum(-1), (c * np.sin(d)).sum(-1)], axis=-1)


@dataclass(frozen=True)
class Centerline:
    """Road axis y(x) = offset + amplitude sin(2 pi x / wavelength + phase), running along +x."""

    offset: float
    amplitude: float = 0.0
    wavelength: float = 1000.0
    phase: float = 0.0

    def y(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, np.float64)
        return self.offset + self.amplitude * np.sin(2 * np.pi * x / self.wavelength + self.phase)

    def slope(self, x: np.ndarray) -> np.ndarray:
        """dy/dx along the axis."""
        k = 2 * np.pi / self.wavelength
        return self.amplitude * k * np.cos(k * np.asarray(x, np.float64) + self.phase)

    def frame(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(K, 2) axis points and (K, 2) unit left normals at the (K,) abscissae x."""
        x = np.asarray(x, np.float64)
        slope = self.slope(x)
        norm = np.sqrt(1.0 + slope ** 2)
        return np.column_stack([x, self.y(x)]), np.column_stack([-slope / norm, 1.0 / norm])

    @property
    def min_radius(self) -> float:
        """Tightest curve radius in metres (inf when straight)."""
        curvature = self.amplitude * (2 * np.pi / self.wavelength) ** 2
        return float(np.inf if curvature == 0 else 1.0 / curvature)
