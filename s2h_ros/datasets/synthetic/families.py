"""Scene families: what a world's tiles hold, how it is driven, and its per-seed parameters.

A family is a ``setup`` that draws the world's procedural parameters from the world's seed (tile
pitch, road widths, terrain, speeds, sensor height, ...), a ``build`` that fills tile (i, j),
and a route shape: ``grid`` (a random walk over the tile grid, turning at nodes) or ``line``
(along the world's ``Centerline``, for the tunnel and the highway). ``town`` and ``rooms`` are
the original outdoor and indoor worlds and draw exactly the numbers they always drew.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from s2h_ros.datasets.synthetic import corridors, open_areas, rooms, town
from s2h_ros.datasets.synthetic.terrain import Centerline, random_waves

KINDS = ("outdoor", "indoor")


@dataclass(frozen=True)
class Family:
    """One scene family: its kind, route shape, parameter setup and tile builder."""

    name: str
    kind: str  # "outdoor" or "indoor": what moves in it (cars or people) and the default family
    route: str  # "grid" or "line"
    setup: Callable  # (world, rng) -> None, sets the world's parameters
    build: Callable  # (world, mesh_builder, rng, i, j) -> None, fills one tile
    key: int  # stream key: worlds of different families share no random draws


def _vehicle(w, pitch, road_half_width, lane, turn_radius, speed, accel, sensor_height, horizon=np.inf) -> None:
    w.pitch, w.road_half_width, w.lane_offset, w.turn_radius = pitch, road_half_width, lane, turn_radius
    w.speed_range, w.accel, w.sensor_height, w.horizon = speed, accel, sensor_height, horizon


def _flat(w) -> None:
    w._terrain = w._relief = np.zeros((0, 4))


def _setup_town(w, rng) -> None:
    pitch = float(rng.uniform(70.0, 110.0))  # block + road, metres
    half = float(rng.uniform(5.5, 7.5))
    # Ego lane centre right of the road centre; KITTI's Velodyne is 1.73 m above the road.
    _vehicle(w, pitch, half, 0.4 * half, float(0.9 * half), (5.0, 15.0), 2.0, 1.73)
    # Terrain: a few long-wavelength sinusoids; slopes stay below ~4 %. Relief: short waves of
    # ~2.5 cm RMS on the ground surfaces only (not under the vehicle), so the ground carries
    # world-fixed texture instead of being a perfect plane on which only the sensor's rings show.
    w._terrain = random_waves(rng, 4, (180.0, 700.0), lambda k: rng.uniform(0.2, 0.7, 4) * 0.035 / k)
    w._relief = random_waves(rng, 12, (3.0, 10.0), lambda k: rng.uniform(0.005, 0.015, 12))


def _setup_suburban(w, rng) -> None:
    half = float(rng.uniform(4.0, 5.5))  # narrower streets
    _vehicle(w, float(rng.uniform(60.0, 90.0)), half, 0.45 * half, 0.9 * half, (4.0, 12.0), 2.0, 1.73)
    w._terrain = random_waves(rng, 4, (150.0, 600.0), lambda k: rng.uniform(0.2, 0.7, 4) * 0.05 / k)
    w._relief = random_waves(rng, 12, (3.0, 10.0), lambda k: rng.uniform(0.005, 0.015, 12))
    park = float(rng.uniform(0.1, 0.3))
    w.land_use = (0.0, 1.0 - park, park, 0.0)  # houses with gardens, some parks


def _setup_parking_lot(w, rng) -> None:
    half = float(rng.uniform(3.0, 3.5))  # aisles along the tile borders
    _vehicle(w, float(rng.uniform(32.0, 46.0)), half, 0.4 * half, 3.5, (1.5, 5.0), 1.0, 1.73)
    w._terrain = random_waves(rng, 3, (150.0, 400.0), lambda k: rng.uniform(0.2, 0.7, 3) * 0.012 / k)
    w._relief = random_waves(rng, 8, (2.0, 6.0), lambda k: rng.uniform(0.002, 0.006, 8))
    w.occupancy = (float(rng.uniform(0.2, 0.5)), float(rng.uniform(0.6, 0.95)))  # cars per stall, tile range
    w.building_p = float(rng.uniform(0.05, 0.2))


def _setup_open_field(w, rng) -> None:
    # Tracks along the tile borders, no road; a tractor- or robot-mounted sensor.
    _vehicle(w, float(rng.uniform(60.0, 120.0)), 0.0, 0.0, float(rng.uniform(6.0, 12.0)), (1.5, 6.0), 1.0, 1.5)
    w.stops = False
    # Rolling terrain (slopes up to ~8 %) and grass-clump relief (~3.5 cm RMS, 1-6 m waves).
    w._terrain = random_waves(rng, 5, (80.0, 400.0), lambda k: rng.uniform(0.2, 0.7, 5) * 0.06 / k)
    w._relief = random_waves(rng, 16, (1.0, 6.0), lambda k: rng.uniform(0.005, 0.02, 16))
    w.clutter = float(rng.uniform(0.3, 1.0))  # scales the few bushes, trees and rocks per tile


def _setup_highway(w, rng) -> None:
    lanes, lane_w = int(rng.integers(2, 5)), float(rng.uniform(3.5, 3.75))
    median, shoulder = float(rng.uniform(0.8, 3.0)), float(rng.uniform(2.5, 3.2))
    half = median + lanes * lane_w + shoulder
    lane = median + (int(rng.integers(lanes)) + 0.5) * lane_w
    _vehicle(w, 100.0, half, lane, 200.0, (20.0, 33.0), 1.5, 1.73)
    w.stops = False
    amplitude = float(rng.uniform(5.0, 18.0)) if rng.uniform() < 0.5 else 0.0
    w.centerline = Centerline(50.0, amplitude, float(rng.uniform(1500.0, 4000.0)), float(rng.uniform(0, 2 * np.pi)))
    w.lanes, w.median = lanes, median
    w._terrain = random_waves(rng, 4, (300.0, 1200.0), lambda k: rng.uniform(0.2, 0.7, 4) * 0.025 / k)
    w._relief = random_waves(rng, 12, (3.0, 10.0), lambda k: rng.uniform(0.005, 0.015, 12))
    w.lamp_spacing = float(rng.uniform(40.0, 70.0)) if rng.uniform() < 0.6 else 0.0
    w.gantry_spacing = float(rng.uniform(300.0, 800.0))
    w.noise_wall_p = float(rng.uniform(0.0, 0.5))
    w.building_p = float(rng.uniform(0.05, 0.3))


def _setup_tunnel(w, rng) -> None:
    width = float(rng.uniform(8.0, 11.5))
    walkway = float(rng.uniform(0.8, 1.2))
    half = width / 2 - walkway
    _vehicle(w, 60.0, half, 0.5 * half, 200.0, (8.0, 22.0), 2.0, 1.73)
    w.stops = False
    _flat(w)
    amplitude = float(rng.uniform(5.0, 20.0)) if rng.uniform() < 0.6 else 0.0  # straight or a gentle curve
    w.centerline = Centerline(30.0, amplitude, float(rng.uniform(600.0, 1500.0)), float(rng.uniform(0, 2 * np.pi)))
    w.tube = str(rng.choice(["arch", "box"]))
    w.tube_width, w.walkway = width, (walkway, float(rng.uniform(0.2, 0.35)))
    w.wall_height = float(rng.uniform(2.5, 4.0)) if w.tube == "arch" else float(rng.uniform(5.0, 7.0))
    w.arch_rise = float(rng.uniform(0.6, 1.0)) * width / 2
    w.lamp_spacing = float(rng.uniform(8.0, 25.0))
    w.fan_spacing = float(rng.uniform(150.0, 300.0)) if rng.uniform() < 0.5 else 0.0


def _setup_rooms(w, rng) -> None:
    pitch = float(rng.uniform(6.0, 9.0))  # room side
    # Rooms occlude each other: geometry is built up to ~5 rooms away.
    _vehicle(w, pitch, 0.0, 0.0, 0.8, (0.4, 1.5), 0.5, 1.0, horizon=5.0 * pitch)
    w.room_height = float(rng.uniform(2.6, 3.4))
    _flat(w)


def _setup_office(w, rng) -> None:
    pitch = float(rng.uniform(4.5, 8.0))
    _vehicle(w, pitch, 0.0, 0.0, 0.6, (0.3, 1.2), 0.5, 1.0, horizon=5.0 * pitch)
    w.room_height = float(rng.uniform(2.5, 3.0))
    open_plan = float(rng.uniform(0.1, 0.5))  # share of walls left out (open-plan floors)
    w.door_p = (0.8 * (1 - open_plan), 0.2 * (1 - open_plan), open_plan)
    _flat(w)


def _setup_warehouse(w, rng) -> None:
    _vehicle(w, float(rng.uniform(12.0, 18.0)), 0.0, 0.0, 1.2, (0.5, 2.5), 0.5, 1.0)
    w.room_height = float(rng.uniform(7.0, 12.0))
    ni, nj = int(rng.integers(2, 6)), int(rng.integers(2, 6))
    w.bounds = (-ni, ni, -nj, nj)  # a closed hall of (2 ni + 1) x (2 nj + 1) bays
    w.rack_fill = float(rng.uniform(0.4, 0.95))
    _flat(w)


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("town", "outdoor", "grid", _setup_town, town.build_block, 0),
    Family("suburban", "outdoor", "grid", _setup_suburban, town.build_block, 1),
    Family("parking_lot", "outdoor", "grid", _setup_parking_lot, open_areas.build_parking_lot, 2),
    Family("open_field", "outdoor", "grid", _setup_open_field, open_areas.build_open_field, 3),
    Family("highway", "outdoor", "line", _setup_highway, corridors.build_highway, 4),
    Family("tunnel", "outdoor", "line", _setup_tunnel, corridors.build_tunnel, 5),
    Family("rooms", "indoor", "grid", _setup_rooms, rooms.build_room, 6),
    Family("office", "indoor", "grid", _setup_office, rooms.build_office, 7),
    Family("warehouse", "indoor", "grid", _setup_warehouse, rooms.build_warehouse, 8),
)}
DEFAULT_FAMILY = {"outdoor": "town", "indoor": "rooms"}
