"""What several benchmarks share: waiting for a device, and KISS-ICP on the scans they timed."""
from __future__ import annotations

import time

import numpy as np


def synchronize(device) -> None:
    """Wait for the GPU work queued on ``device`` (a name or ``torch.device``) so a clock read
    after it counts that work; nothing to wait for on a CPU."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def kiss_icp_baseline(sequence, first: int = 0, count: int | None = None) -> dict:
    """KISS-ICP's odometry (offline, every scan) on frames ``first .. first + count`` of
    ``sequence``: scans per second, ms per scan and the sequence metrics against the truth; where
    kiss-icp cannot run (not installed, e.g. on a GPU machine) ``{"unavailable": why}``, not hidden."""
    try:
        from s2h_ros.evaluation.methods import make_method

        kiss = make_method("kiss_icp", scale="outdoor")
    except Exception as error:
        return {"unavailable": f"{type(error).__name__}: {error}"}
    from s2h_ros.datasets.types import SubSequence
    from s2h_ros.evaluation.metrics import sequence_metrics

    count = len(sequence) - first if count is None else count
    scans = SubSequence(sequence, list(range(first, first + count)))  # read on demand, as KISS-ICP goes
    t0 = time.perf_counter()
    est = kiss.odometry(scans)
    seconds = time.perf_counter() - t0
    gt = scans.poses
    gt = np.einsum("ij,njk->nik", np.linalg.inv(gt[0]), gt)
    return {"fps": count / seconds, "ms_per_scan": 1e3 * seconds / count, "metrics": sequence_metrics(gt, est)}
