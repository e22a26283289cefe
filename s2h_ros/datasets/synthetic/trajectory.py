"""Vehicle trajectories on the world's road (or room) grid, with exact poses at any time.

A route is a random walk over grid intersections (straight on, left or right; inside its walls in
a closed hall), drawn in the right-hand lane with circular arcs at the turns, or, in the line
families (tunnel, highway), a drive either way along the road axis in one lane. A speed profile assigns each stretch a cruise
speed, slows for turns (lateral acceleration limit), stops at some intersections, and respects
acceleration limits (forward/backward pass). Poses follow the terrain: the vehicle's up axis is
the ground normal (pitch and roll from the slopes) plus a small suspension wobble. A carried
sensor (``sway_deg``) also sways slowly in roll, pitch and yaw about the carrier's frame, as a
handheld or backpack lidar does while its carrier walks.
"""
from __future__ import annotations

import numpy as np

from s2h_ros.datasets.synthetic.scene import SyntheticWorld, seeded_rng

_DS = 0.1  # metres between samples of the route


def _route_nodes(world: SyntheticWorld, rng: np.random.Generator, length_m: float) -> np.ndarray:
    """(K, 2) grid intersections (outdoor) or room centres (indoor) visited by a random walk."""
    p = world.pitch
    offset = 0.0 if world.kind == "outdoor" else 0.5 * p
    heading = int(rng.integers(4))
    dirs = np.array([[1, 0], [0, 1], [-1, 0], [0, -1]])
    node = np.zeros(2, np.int64)
    nodes = [node.copy()]
    for _ in range(int(np.ceil(length_m / p)) + 3):
        node = node + dirs[heading]
        nodes.append(node.copy())
        heading = (heading + rng.choice([0, 1, -1], p=[0.5, 0.25, 0.25])) % 4
        while world.bounds is not None and not _inside(node + dirs[heading], world.bounds):
            heading = (heading + rng.choice([1, -1])) % 4  # turn away from the hall's walls
    return np.asarray(nodes, np.float64) * p + offset


def _inside(node: np.ndarray, bounds: tuple[int, int, int, int]) -> bool:
    return bool(bounds[0] <= node[0] <= bounds[1] and bounds[2] <= node[1] <= bounds[3])


def _axis_route(world: SyntheticWorld, rng: np.random.Generator, length_m: float) -> np.ndarray:
    """(K, 2) points every ~``_DS`` m in the right-hand lane along the world's road axis, either way."""
    sign = 1.0 if rng.uniform() < 0.5 else -1.0
    x = sign * np.arange(0.0, length_m + _DS, _DS)
    axis, left = world.centerline.frame(x)
    return axis - sign * world.lane_offset * left


def _lane_polyline(nodes: np.ndarray, offset: float, radius: float) -> tuple[np.ndarray, np.ndarray]:
    """Route through the nodes in a lane ``offset`` to the right, corners rounded with ``radius``.

    Returns (K, 2) points every ``_DS`` metres and a (K,) bool mask of points on turning arcs.
    """
    d = np.diff(nodes, axis=0)
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    right = np.column_stack([d[:, 1], -d[:, 0]])
    # Lane corners: intersections of consecutive offset segments (90 deg turns or straight).
    corners = [nodes[0] + offset * right[0]]
    for k in range(1, len(nodes) - 1):
        corners.append(nodes[k] + offset * right[k - 1] + offset * right[k]
                       if abs(d[k - 1] @ d[k]) < 0.5 else nodes[k] + offset * right[k])
    corners.append(nodes[-1] + offset * right[-1])
    pts, arc = [corners[0][None]], [np.array([False])]
    for k in range(1, len(corners)):
        a, b = pts[-1][-1], corners[k]
        turning = k < len(corners) - 1 and abs(d[k - 1] @ d[k]) < 0.5
        end = b - radius * d[k - 1] if turning else b
        n = max(1, int(np.ceil(np.linalg.norm(end - a) / _DS)))
        pts.append(a + (end - a) * (np.arange(1, n + 1) / n)[:, None])
        arc.append(np.zeros(n, bool))
        if turning:  # quarter circle from end to b + radius * d[k]
            left = d[k - 1][0] * d[k][1] - d[k - 1][1] * d[k][0] > 0
            normal = np.array([-d[k - 1][1], d[k - 1][0]]) * (1 if left else -1)
            centre = end + radius * normal
            a0 = np.arctan2(*(end - centre)[::-1])
            n = max(2, int(np.ceil(radius * np.pi / 2 / _DS)))
            ang = a0 + (np.pi / 2 if left else -np.pi / 2) * np.arange(1, n + 1) / n
            pts.append(centre + radius * np.column_stack([np.cos(ang), np.sin(ang)]))
            arc.append(np.ones(n, bool))
    return np.concatenate(pts), np.concatenate(arc)


def _pass_indices(xy: np.ndarray, nodes: np.ndarray, pitch: float) -> np.ndarray:
    """Index of the route sample closest to each grid node, searched forward (routes may loop)."""
    out, start, window = [], 0, int(1.5 * pitch / _DS)
    for node in nodes[1:]:
        seg = xy[start:start + window]
        if len(seg) == 0:
            break
        k = start + int(np.argmin(np.linalg.norm(seg - node, axis=1)))
        if np.linalg.norm(xy[k] - node) < 0.5 * pitch:
            out.append(k)
            start = k + 1
    return np.asarray(out, np.int64)


class Trajectory:
    """Exact sensor poses of one drive through a world, at any time in [0, duration]."""

    def __init__(self, world: SyntheticWorld, xy: np.ndarray, heading: np.ndarray, s: np.ndarray,
                 t_knots: np.ndarray, s_knots: np.ndarray, wobble: np.ndarray,
                 sway: np.ndarray | None = None) -> None:
        self.world = world
        self.xy, self.heading, self.s = xy, heading, s  # route samples
        self.t_knots, self.s_knots = t_knots, s_knots  # monotone time -> arc length map
        self._wobble = wobble  # (2, 3, 3): roll/pitch x (amplitude, angular frequency, phase)
        self._sway = sway  # (3, 2, 3): roll/pitch/yaw x (amplitude, angular frequency, phase), or None

    @property
    def duration(self) -> float:
        return float(self.t_knots[-1])

    @property
    def length(self) -> float:
        return float(self.s_knots[-1])

    @classmethod
    def generate(cls, world: SyntheticWorld, length_m: float, seed: int, index: int = 0,
                 speed_range: tuple[float, float] | None = None, sway_deg: float = 0.0) -> Trajectory:
        """A random drive of at least ``length_m`` metres; deterministic for (world, seed, index).

        ``speed_range`` (m/s) overrides the world's cruise speeds (outdoor 5-15, indoor 0.4-1.5).
        ``sway_deg`` > 0 sways the sensor by up to that many degrees in roll and pitch (half of it in
        yaw), each the sum of two slow sines (periods 2.5-12 s); drives without it are unchanged.
        """
        if not (np.isfinite(sway_deg) and 0.0 <= sway_deg <= 60.0):
            raise ValueError(f"sway_deg must be within 0-60 degrees, got {sway_deg}")
        rng = seeded_rng(seed, 2, index)
        if world.route == "line":
            xy = _axis_route(world, rng, length_m + world.pitch)
            on_arc = np.zeros(len(xy), bool)
        else:
            nodes = _route_nodes(world, rng, length_m + world.pitch)
            xy, on_arc = _lane_polyline(nodes, world.lane_offset, world.turn_radius)
            # Start in the middle of the first stretch, not in an intersection.
            start = int(0.5 * world.pitch / _DS)
            xy, on_arc = xy[start:], on_arc[start:]
        step = np.linalg.norm(np.diff(xy, axis=0), axis=1)
        s = np.concatenate([[0.0], np.cumsum(step)])
        tangent = np.gradient(xy, axis=0)
        heading = np.unwrap(np.arctan2(tangent[:, 1], tangent[:, 0]))
        speed_range = world.speed_range if speed_range is None else speed_range
        # Line routes change cruise speed every pitch of road; grid routes at every node they pass.
        nodes_passed = (np.arange(1, int(s[-1] / world.pitch) + 1) * int(world.pitch / _DS) if world.route == "line"
                        else _pass_indices(xy, nodes, world.pitch))
        v, stops = cls._speed_profile(world, rng, s, on_arc, nodes_passed, speed_range)
        t_knots, s_knots = cls._time_of_arc(s, v, stops, rng)
        wobble = np.stack([rng.uniform([0.1, 2.0, 0.0], [0.35, 6.0, 2 * np.pi], (3, 3)) for _ in range(2)])
        wobble[:, :, 0] = np.radians(wobble[:, :, 0])
        return cls(world, xy, heading, s, t_knots, s_knots, wobble, cls._sway_terms(sway_deg, seed, index))

    @staticmethod
    def _sway_terms(sway_deg: float, seed: int, index: int) -> np.ndarray | None:
        """(3, 2, 3) roll/pitch/yaw x two sines x (amplitude rad, angular frequency rad/s, phase),
        from their own random stream (so the route and speeds do not change with the sway)."""
        if sway_deg <= 0.0:
            return None
        rng = seeded_rng(seed, 7, index)
        terms = rng.uniform([0.3, 0.5, 0.0], [0.5, 2.5, 2 * np.pi], (3, 2, 3))
        terms[:, :, 0] *= np.radians(sway_deg) * np.array([1.0, 1.0, 0.5])[:, None]
        return terms

    @staticmethod
    def _speed_profile(world, rng, s, on_arc, node_idx, speed_range) -> tuple[np.ndarray, list[int]]:
        """(K,) speed at each route sample and the sample indices where the vehicle stops."""
        lo, hi = speed_range
        if not 0.0 < hi or lo > hi or lo < 0.0:
            raise ValueError(f"speed range must satisfy 0 <= low <= high, high > 0; got {speed_range}")
        # A new cruise speed on every stretch between grid nodes.
        stretch = np.searchsorted(node_idx, np.arange(len(s)))
        v_max = rng.uniform(lo, hi, len(node_idx) + 1)[stretch]
        v_max[on_arc] = np.minimum(v_max[on_arc], np.sqrt(2.5 * world.accel * world.turn_radius))
        # Stops just before some intersections (traffic lights, junctions).
        stops = []
        for k in node_idx:
            k_stop = k - int((world.road_half_width + world.turn_radius + 2.0) / _DS)
            if world.stops and 0 < k_stop < len(s) - 1 and rng.uniform() < 0.2:
                v_max[k_stop] = 0.0
                stops.append(k_stop)
        v = v_max.copy()
        v[0] = min(v_max[0], rng.uniform(0.0, hi))
        ds = np.diff(s)
        for k in range(1, len(s)):  # acceleration limit
            v[k] = min(v[k], np.sqrt(v[k - 1] ** 2 + 2 * world.accel * ds[k - 1]))
        for k in range(len(s) - 2, -1, -1):  # braking limit
            v[k] = min(v[k], np.sqrt(v[k + 1] ** 2 + 2 * world.accel * ds[k]))
        return v, stops

    @staticmethod
    def _time_of_arc(s, v, stops, rng) -> tuple[np.ndarray, np.ndarray]:
        """Monotone (t, s) knots: constant acceleration between samples, dwell time at stops."""
        vs = v[:-1] + v[1:]
        dt = 2 * np.diff(s) / np.maximum(vs, 1e-9)
        t = np.concatenate([[0.0], np.cumsum(dt)])
        stops = np.sort(np.asarray(stops, np.int64))
        dwell = rng.uniform(1.0, 4.0, len(stops))
        # Samples after stop k are delayed by its dwell; a duplicated knot (s_k, t_k + dwell) holds still.
        t = t + np.concatenate([[0.0], np.cumsum(dwell)])[np.searchsorted(stops, np.arange(len(s)), side="right")]
        hold = t[stops] - dwell if len(stops) else t[stops]
        t_knots = np.insert(t, stops, hold)
        s_knots = np.insert(s, stops, s[stops])
        return t_knots, s_knots

    def arc_at(self, t: np.ndarray) -> np.ndarray:
        """(M,) arc length along the route at times (M,) (clamped to the drive)."""
        return np.interp(np.asarray(t, np.float64), self.t_knots, self.s_knots)

    def time_at_arc(self, s: np.ndarray) -> np.ndarray:
        """(M,) first time the vehicle reaches arc length s."""
        return np.interp(np.asarray(s, np.float64), self.s_knots, self.t_knots)

    def ground_pose(self, s: np.ndarray, lateral: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
        """(M, 3) ground point and (M,) heading at arc lengths s, shifted ``lateral`` m to the left."""
        s = np.asarray(s, np.float64)
        x = np.interp(s, self.s, self.xy[:, 0])
        y = np.interp(s, self.s, self.xy[:, 1])
        yaw = np.interp(s, self.s, self.heading)
        x, y = x - lateral * np.sin(yaw), y + lateral * np.cos(yaw)
        return np.column_stack([x, y, self.world.terrain_height(x, y)]), yaw

    def poses(self, t: np.ndarray, height: float | None = None) -> np.ndarray:
        """(M, 4, 4) float64 world poses of the sensor at times (M,), ``height`` m above the ground
        along the vehicle's up axis (default: the world's sensor height)."""
        t = np.atleast_1d(np.asarray(t, np.float64))
        ground, yaw = self.ground_pose(self.arc_at(t))
        R = _frame_on_ground(yaw, self.world.terrain_gradient(ground[:, 0], ground[:, 1]))
        roll = (self._wobble[0, :, 0] * np.sin(self._wobble[0, :, 1] * t[:, None] + self._wobble[0, :, 2])).sum(1)
        pitch = (self._wobble[1, :, 0] * np.sin(self._wobble[1, :, 1] * t[:, None] + self._wobble[1, :, 2])).sum(1)
        R = R @ _rot_x(roll) @ rot_y(pitch)
        T = np.tile(np.eye(4), (len(t), 1, 1))
        T[:, :3, 3] = ground + R[:, :, 2] * (self.world.sensor_height if height is None else height)
        if self._sway is not None:  # the carried sensor turns about its own centre
            sway = (self._sway[:, :, 0] * np.sin(self._sway[:, :, 1] * t[:, None, None] + self._sway[:, :, 2])).sum(2)
            R = R @ _rot_z(sway[:, 2]) @ _rot_x(sway[:, 0]) @ rot_y(sway[:, 1])
        T[:, :3, :3] = R
        return T


def _frame_on_ground(yaw: np.ndarray, grad: np.ndarray) -> np.ndarray:
    """(M, 3, 3) rotation: x along the heading in the ground's tangent plane, z the ground normal."""
    n = np.column_stack([-grad[:, 0], -grad[:, 1], np.ones(len(yaw))])
    n /= np.linalg.norm(n, axis=1, keepdims=True)
    f = np.column_stack([np.cos(yaw), np.sin(yaw), np.zeros(len(yaw))])
    f -= (f * n).sum(1, keepdims=True) * n
    f /= np.linalg.norm(f, axis=1, keepdims=True)
    return np.stack([f, np.cross(n, f), n], axis=2)


def _rot_x(a: np.ndarray) -> np.ndarray:
    c, s = np.cos(a), np.sin(a)
    R = np.zeros((len(a), 3, 3))
    R[:, 0, 0], R[:, 1, 1], R[:, 1, 2], R[:, 2, 1], R[:, 2, 2] = 1, c, -s, s, c
    return R


def _rot_z(a: np.ndarray) -> np.ndarray:
    c, s = np.cos(a), np.sin(a)
    R = np.zeros((len(a), 3, 3))
    R[:, 2, 2], R[:, 0, 0], R[:, 0, 1], R[:, 1, 0], R[:, 1, 1] = 1, c, -s, s, c
    return R


def rot_y(a: np.ndarray) -> np.ndarray:
    """(M, 3, 3) rotations about +y (a > 0 turns +x towards -z)."""
    c, s = np.cos(a), np.sin(a)
    R = np.zeros((len(a), 3, 3))
    R[:, 1, 1], R[:, 0, 0], R[:, 0, 2], R[:, 2, 0], R[:, 2, 2] = 1, c, s, -s, c
    return R
