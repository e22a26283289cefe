"""Run registration methods side by side on pairs or sequences and measure them.

Every method sees the same data in the same run, interleaved pair by pair, so timings share
the machine's load. Per call the harness records wall time, the method's own stage timings,
peak resident-memory growth and, on CUDA, torch's peak allocation.

Peak memory: ``tracemalloc`` misses native allocations (Open3D, KISS-ICP, torch), so the
harness reads the kernel's resident-set high-water mark instead. Before each call it writes
``5`` to ``/proc/self/clear_refs`` (Linux >= 4.0), which resets ``VmHWM`` to the current RSS;
``VmHWM`` after the call minus ``VmRSS`` before is the call's peak growth. Where that file is
not writable it falls back to the ``ru_maxrss`` delta, which only sees growth beyond the
process's earlier peak (a lower bound); the record says which was used.
"""
from __future__ import annotations

import resource
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

import numpy as np
from tqdm import tqdm

from s2h_ros.datasets.types import PointCloudPair, Scan, Sequence
from s2h_ros.evaluation.metrics import RecallThreshold, pair_errors, sequence_metrics, summarize_pairs
from s2h_ros.geometry import apply_transform, invert_transform

# ------------------------------------------------------------------------------- memory


def proc_status_kb(key: str, pid: int | str = "self") -> int | None:
    """A ``kB`` field (``VmRSS``, ``VmHWM``) of Linux's /proc/PID/status; None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_rss_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _torch_cuda():
    """torch if it is already imported and sees a GPU (never imports torch for a baseline)."""
    torch = sys.modules.get("torch")
    return torch if torch is not None and torch.cuda.is_available() else None


@dataclass
class Measurement:
    wall_s: float = 0.0
    peak_rss_mb: float = 0.0
    rss_method: str = ""  # "vmhwm" (exact peak growth) or "ru_maxrss" (lower bound)
    cuda_peak_mb: float | None = None


@contextmanager
def measure() -> Iterator[Measurement]:
    """Fill a :class:`Measurement` for the code inside ``with measure() as m:``."""
    m = Measurement()
    cuda = _torch_cuda()
    cuda_base = 0
    if cuda is not None:
        cuda.cuda.synchronize()
        cuda.cuda.reset_peak_memory_stats()
        cuda_base = cuda.cuda.memory_allocated()
    exact = _reset_rss_peak()
    rss0 = proc_status_kb("VmRSS") if exact else None
    maxrss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    try:
        yield m
    finally:
        if cuda is not None:
            cuda.cuda.synchronize()
        m.wall_s = time.perf_counter() - t0
        hwm = proc_status_kb("VmHWM") if exact else None
        if hwm is not None and rss0 is not None:
            m.peak_rss_mb, m.rss_method = max(0, hwm - rss0) / 1024, "vmhwm"
        else:  # ru_maxrss is KiB on Linux
            grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - maxrss0
            m.peak_rss_mb, m.rss_method = max(0, grown) / 1024, "ru_maxrss"
        if cuda is not None:
            m.cuda_peak_mb = (cuda.cuda.max_memory_allocated() - cuda_base) / 2**20


# -------------------------------------------------------------------------------- pairs


@dataclass
class PairEvaluation:
    """Per-pair records (one per method and pair) and the per-method summary."""

    threshold: RecallThreshold
    records: list[dict] = field(default_factory=list)
    summary: dict[str, dict] = field(default_factory=dict)


def _stage_means(records: list[dict]) -> dict[str, float]:
    stages: dict[str, list[float]] = {}
    for r in records:
        for k, v in r["timings"].items():
            stages.setdefault(k, []).append(float(v))
    return {k: float(np.mean(v)) for k, v in stages.items()}


def summarize_method(records: list[dict], threshold: RecallThreshold) -> dict:
    """Recall/RE/TE (DGR style) plus time and memory statistics of one method's records."""
    wall = np.array([r["wall_s"] for r in records])
    rss = np.array([r["peak_rss_mb"] for r in records])
    cuda = [r["cuda_peak_mb"] for r in records if r["cuda_peak_mb"] is not None]
    return {
        **summarize_pairs([r["re_deg"] for r in records], [r["te_m"] for r in records], threshold),
        "reported_success": float(np.mean([r["success"] for r in records])),
        **trust_counts(records),
        "exceptions": int(sum(r["error"] is not None for r in records)),
        "time_mean_s": float(wall.mean()),
        "time_median_s": float(np.median(wall)),
        "stage_time_mean_s": _stage_means(records),
        "peak_rss_mb_max": float(rss.max()),
        "peak_rss_mb_mean": float(rss.mean()),
        "cuda_peak_mb_max": float(max(cuda)) if cuda else None,
        "info_mean": _info_means(records),
    }


def trust_counts(records: list[dict]) -> dict[str, int | None]:
    """Of ``records`` (each with ``success`` and ``registered``): ``trusted``; ``wrong_trusted``,
    trusted but beyond the recall thresholds, what a user must never be handed; ``fallbacks``,
    the pairs whose transform came from DGR's RANSAC safeguard instead of learned weights, and
    ``trusted_fallbacks``, those of them reported as trusted (the safeguard's answer is what the
    user is handed); both None for a method that does not report the safeguard."""
    return {"wrong_trusted": int(sum(bool(r["success"]) and not r["registered"] for r in records)),
            "trusted": int(sum(bool(r["success"]) for r in records)),
            "fallbacks": _fallbacks(records, trusted_only=False),
            "trusted_fallbacks": _fallbacks(records, trusted_only=True)}


def _fallbacks(records: list[dict], trusted_only: bool) -> int | None:
    """How many ``records`` took DGR's RANSAC safeguard (of them trusted only: ``trusted_only``);
    None for a method that does not report it."""
    if not all("used_fallback" in r.get("info", {}) for r in records):
        return None
    return int(sum(bool(r["info"]["used_fallback"]) and (bool(r["success"]) or not trusted_only) for r in records))


def _info_means(records: list[dict]) -> dict[str, float]:
    """Mean of every numeric ``info`` entry (e.g. the pipeline's correspondence and inlier counts)."""
    values: dict[str, list[float]] = {}
    for r in records:
        for k, v in r.get("info", {}).items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                values.setdefault(k, []).append(float(v))
    return {k: float(np.mean(v)) for k, v in values.items()}


def run_pair(method: Any, pair: PointCloudPair) -> tuple[np.ndarray, dict]:
    """One measured ``method.register`` call -> (``(4, 4)`` estimate or NaNs, record fields)."""
    error = None
    result = None
    with measure() as m:
        try:
            result = method.register(pair.source, pair.target)
        except Exception as err:  # a crash is a failed pair, recorded with its message
            error = f"{type(err).__name__}: {err}"
    T = np.full((4, 4), np.nan) if result is None else np.asarray(result.transform, dtype=np.float64)
    record = {
        "success": bool(result is not None and result.success),
        "timings": {k: float(v) for k, v in (getattr(result, "timings", None) or {}).items()},
        "error": error,
        "wall_s": m.wall_s,
        "peak_rss_mb": m.peak_rss_mb,
        "rss_method": m.rss_method,
        "cuda_peak_mb": m.cuda_peak_mb,
        "info": {k: v for k, v in (getattr(result, "info", None) or {}).items()
                 if isinstance(v, (int, float, str, bool))},
    }
    record["info"].update(truth_inliers(result, pair.T_gt))
    return T, record


def truth_inliers(result: Any, T_gt: np.ndarray) -> dict[str, float]:
    """``gt_inliers`` / ``gt_inlier_ratio``: the result's matches (``matches`` (K, 2, 3), e.g. the
    S2H correspondences) whose source point lands within ``match_inlier_distance`` of its target
    point under the true transform; nothing for a result without matches."""
    matches = getattr(result, "matches", None)
    distance = getattr(result, "match_inlier_distance", None)
    if matches is None or distance is None or len(matches) == 0:
        return {}
    matches = np.asarray(matches, dtype=np.float64)
    moved = apply_transform(np.asarray(T_gt, dtype=np.float64), matches[:, 0])
    inliers = int(np.count_nonzero(np.linalg.norm(moved - matches[:, 1], axis=1) < distance))
    return {"gt_inliers": inliers, "gt_inlier_ratio": inliers / len(matches)}


def evaluate_pairs(methods: dict[str, Any], pairs: Iterable[PointCloudPair], threshold: RecallThreshold,
                   progress: bool = True, total: int | None = None,
                   on_record: Callable[[dict], None] | None = None) -> PairEvaluation:
    """Register every pair with every method (interleaved) and score them against ``T_gt``.

    ``on_record`` sees each record as soon as it exists (e.g. to stream JSON lines, so a long
    run that is stopped still leaves its results).
    """
    if not methods:
        raise ValueError("no methods to evaluate")
    for name, method in methods.items():
        if not callable(getattr(method, "register", None)):
            raise ValueError(f"method {name!r} has no register(source, target): it evaluates sequences only")
    out = PairEvaluation(threshold=threshold)
    if total is None and hasattr(pairs, "__len__"):
        total = len(pairs)  # type: ignore[arg-type]
    for k, pair in enumerate(tqdm(pairs, total=total, desc="pairs", unit="pair", disable=not progress)):
        for name, method in methods.items():
            T, record = run_pair(method, pair)
            re, te = pair_errors(T[None], np.asarray(pair.T_gt, dtype=np.float64)[None])
            ok = bool(re[0] < threshold.re_deg and te[0] < threshold.te_m)
            out.records.append({"method": name, "pair": pair.name or str(k), "re_deg": float(re[0]),
                                "te_m": float(te[0]), "registered": ok, **record})
            if on_record is not None:
                on_record(out.records[-1])
    if not out.records:
        raise ValueError("no pairs to evaluate")
    out.summary = summarize_records(out.records, threshold)
    return out


def summarize_records(records: list[dict], threshold: RecallThreshold) -> dict[str, dict]:
    """:func:`summarize_method` of each method's records, methods in the order they first appear
    (also for the records of a run stopped part way)."""
    by_method: dict[str, list[dict]] = {}
    for r in records:
        by_method.setdefault(r["method"], []).append(r)
    return {name: summarize_method(recs, threshold) for name, recs in by_method.items()}


# ----------------------------------------------------------------------------- sequences


class _Progress:
    """A sequence seen through a tqdm bar that also times scan loading (same scans, same poses).

    Loading (file reads, simulator rendering) happens inside a method's ``odometry`` call; its
    time is kept in ``load_s`` so that the method's own time per frame can exclude it.
    """

    def __init__(self, sequence: Sequence, desc: str, enabled: bool):
        self._seq, self._desc, self._enabled = sequence, desc, enabled
        self.name = sequence.name
        self.load_s = 0.0

    def __len__(self) -> int:
        return len(self._seq)

    def __getitem__(self, i: int) -> Scan:
        t0 = time.perf_counter()
        scan = self._seq[i]
        self.load_s += time.perf_counter() - t0
        return scan

    def __iter__(self) -> Iterator[Scan]:
        scans = iter(self._seq)
        with tqdm(total=len(self._seq), desc=self._desc, unit="scan", disable=not self._enabled, leave=False) as bar:
            while True:
                t0 = time.perf_counter()
                scan = next(scans, None)
                self.load_s += time.perf_counter() - t0
                if scan is None:
                    return
                bar.update()
                yield scan

    @property
    def poses(self) -> np.ndarray | None:
        return self._seq.poses


def chain_odometry(method: Any, sequence: Sequence) -> np.ndarray:
    """Odometry from a pair method: register scan k to scan k-1 and compose, ``P_k = P_{k-1} T``.

    A failed registration (``success`` false) keeps the previous relative motion (constant
    velocity), as an odometry front end would.
    """
    poses = [np.eye(4)]
    delta = np.eye(4)
    previous = None
    for scan in sequence:
        if previous is not None:
            result = method.register(scan.points, previous)
            if result.success:
                delta = np.asarray(result.transform, dtype=np.float64)
            poses.append(poses[-1] @ delta)
        previous = scan.points
    return np.stack(poses)


@dataclass
class SequenceEvaluation:
    """Estimated trajectories (first pose = identity), the truth, and metrics per method."""

    name: str
    gt: np.ndarray  # (N, 4, 4) in the first scan's frame
    poses: dict[str, np.ndarray] = field(default_factory=dict)
    summary: dict[str, dict] = field(default_factory=dict)


def evaluate_sequence(methods: dict[str, Any], sequence: Sequence, progress: bool = True) -> SequenceEvaluation:
    """Run each method's odometry over ``sequence`` (chained pairs if it has none) and score it;
    a method's ``odometry_info`` (counts of trusted scans, events) joins its summary.

    ``time_per_frame_ms`` is the method's own time: scan loading is timed apart (``load_time_s``);
    peak RSS covers the whole call, loading included.
    """
    if not methods:
        raise ValueError("no methods to evaluate")
    if len(sequence) < 2:
        raise ValueError(f"sequence {sequence.name!r} has {len(sequence)} scans; odometry needs at least 2")
    gt = sequence.poses
    if gt is None:
        raise ValueError(f"sequence {sequence.name!r} has no ground-truth poses to evaluate against")
    gt = np.asarray(gt, dtype=np.float64)
    gt = invert_transform(gt[0]) @ gt
    out = SequenceEvaluation(name=sequence.name, gt=gt)
    for name, method in methods.items():
        seq = _Progress(sequence, name, progress)
        with measure() as m:
            odometry = getattr(method, "odometry", None)
            poses = odometry(seq) if callable(odometry) else chain_odometry(method, seq)
        poses = np.asarray(poses, dtype=np.float64)
        poses = invert_transform(poses[0]) @ poses
        out.poses[name] = poses
        out.summary[name] = {**sequence_metrics(gt, poses), "time_total_s": m.wall_s,
                             "load_time_s": seq.load_s,
                             "time_per_frame_ms": 1e3 * (m.wall_s - seq.load_s) / len(poses),
                             "peak_rss_mb": m.peak_rss_mb, "rss_method": m.rss_method,
                             "cuda_peak_mb": m.cuda_peak_mb, **getattr(method, "odometry_info", {})}
    return out
