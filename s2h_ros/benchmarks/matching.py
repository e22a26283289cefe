"""``s2h bench matching``: S-step and H-step time and objective, dense versus sparse.

Synthetic unit features ``(N, 32)`` per side: a fraction of the source points has a noisy copy in
the target (shuffled), the rest are random. For each N it times the dense S-step (augmented
Sinkhorn on the full ``N x N`` scores, where that fits), the sparse S-step on the k-NN support, the
dense H-step (the paper's ``(2N)^2`` augmented assignment, where it fits in ``--dense-max``) and the
sparse H-step, and reports the augmented objective of each. ``sparse_on_dense_P`` runs the sparse
H-step on the dense ``P`` restricted to the support, so its objective and time compare directly
with the dense H-step on the same matrix (equal objective = exact on that support).
``--calibrate`` instead measures matching precision/recall and registration recall per
outlier-profit rule (docs/matching.md).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch

from s2h_ros.matching import (
    DEFAULT_OUTLIER_PROFIT,
    OUTLIER_RULES,
    augmented_sinkhorn,
    candidate_support,
    edge_scores,
    outlier_profits,
    partial_permutation,
    partial_permutation_profit,
    sparse_augmented_sinkhorn,
    sparse_outlier_profits,
    sparse_partial_permutation,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 1024, 4096, 16384], help="points per side")
    parser.add_argument("--large", action="store_true", help="sizes 2000 (dense reference), 5000 and 20000 instead")
    parser.add_argument("--ks", type=int, nargs="+", default=[8, 16], help="k of the k-NN candidate support")
    parser.add_argument("--iters", type=int, default=5, help="Sinkhorn iterations")
    parser.add_argument("--temperature", type=float, default=0.1)
    parser.add_argument("--slack-score", type=float, default=-5.0)
    parser.add_argument("--outlier-profit", default=DEFAULT_OUTLIER_PROFIT, help=f"one of {OUTLIER_RULES} or a float")
    parser.add_argument("--inlier-ratio", type=float, default=0.5)
    parser.add_argument("--noise", type=float, default=0.3, help="feature noise (norm) of inlier copies")
    parser.add_argument("--dense-max", type=int, default=2048, help="largest N for the dense (2N)^2 H-step")
    parser.add_argument("--dense-sinkhorn-max", type=int, default=4096, help="largest N for the dense S-step")
    parser.add_argument("--repeats", type=int, default=3, help="timings are the median of this many runs")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: 2 threads on a shared 2-core VM stalled the scatter ops)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--calibrate", action="store_true", help="outlier-profit calibration study instead")


def synthetic_features(
    n: int, inlier_ratio: float, noise: float, dim: int = 32, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """Unit features ``(n, dim)`` for both sides and ``gt (n,)``: target index of each source point, -1 for outliers."""
    g = torch.Generator().manual_seed(seed)
    fx = torch.nn.functional.normalize(torch.randn(n, dim, generator=g), dim=1)
    fy = torch.nn.functional.normalize(torch.randn(n, dim, generator=g), dim=1)
    m = int(round(inlier_ratio * n))
    perm = torch.randperm(n, generator=g)[:m]
    fy[perm] = torch.nn.functional.normalize(fx[:m] + noise * torch.randn(m, dim, generator=g) / dim**0.5, dim=1)
    gt = np.full(n, -1, dtype=np.int64)
    gt[:m] = perm.numpy()
    return fx, fy, gt


def _timed(fn, repeats: int):
    """(result of the last run, median seconds)."""
    times, out = [], None
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return out, float(np.median(times))


def _precision_recall(src: np.ndarray, tgt: np.ndarray, gt: np.ndarray) -> dict:
    correct = int(np.sum(gt[src] == tgt))
    return {
        "matches": int(src.size),
        "precision": correct / max(1, src.size),
        "recall": correct / max(1, int(np.sum(gt >= 0))),
    }


def _one_size(n: int, args, rule) -> dict:
    fx, fy, gt = synthetic_features(n, args.inlier_ratio, args.noise, seed=args.seed + n)
    out: dict = {"n": n}
    dense_P = None
    if n <= args.dense_sinkhorn_max:
        scores = -torch.cdist(fx, fy).square() / args.temperature
        dense_P, t = _timed(lambda: augmented_sinkhorn(scores, args.iters, args.slack_score), args.repeats)
        out["s_step_dense_s"] = t
        del scores
    if dense_P is not None and n <= args.dense_max:
        P = dense_P.double().numpy()
        sx, sy = outlier_profits(P, rule)
        M, t = _timed(lambda: partial_permutation(P, rule), 1)
        r, c = np.nonzero(M)
        out["h_step_dense_s"] = t
        out["h_step_dense_objective"] = partial_permutation_profit(P[r, c], r, c, sx, sy)
        out["h_step_dense"] = _precision_recall(r, c, gt)
    for k in args.ks:
        key = f"k{k}"
        (rows, cols), t_knn = _timed(lambda: candidate_support(fx, fy, k), 1)
        scores = edge_scores(fx, fy, rows, cols, args.temperature)
        p, t_s = _timed(lambda: sparse_augmented_sinkhorn(rows, cols, scores, n, n, args.iters, args.slack_score), args.repeats)
        (sx, sy), t_sig = _timed(lambda: sparse_outlier_profits(rows, cols, p, n, n, rule), args.repeats)
        (src, tgt), t_h = _timed(lambda: sparse_partial_permutation(rows, cols, p, n, n, sx, sy), args.repeats)
        v = p.double().numpy()
        w = v - sx[rows.numpy()] - sy[cols.numpy()]
        p_matched = v[np.searchsorted(rows.numpy() * n + cols.numpy(), src * n + tgt)]
        out[key] = {
            "edges": int(rows.numel()),
            "positive_edges": int(np.sum(w > 0)),
            "knn_s": t_knn,
            "s_step_sparse_s": t_s,
            "sigma_s": t_sig,
            "h_step_sparse_s": t_h,
            "h_step_sparse_objective": partial_permutation_profit(p_matched, src, tgt, sx, sy),
            **_precision_recall(src, tgt, gt),
        }
        if "h_step_dense_s" in out:
            P = dense_P.double().numpy()
            r_np, c_np = rows.numpy(), cols.numpy()
            dsx, dsy = outlier_profits(P, rule)
            (s2, t2), t_h2 = _timed(lambda: sparse_partial_permutation(r_np, c_np, P[r_np, c_np], n, n, dsx, dsy), args.repeats)
            obj = partial_permutation_profit(P[s2, t2], s2, t2, dsx, dsy)
            out[key]["sparse_on_dense_P"] = {
                "h_step_s": t_h2,
                "objective": obj,
                "objective_gap_to_dense": out["h_step_dense_objective"] - obj,
                "speedup_over_dense": out["h_step_dense_s"] / t_h2,
            }
    return out


def run(args) -> dict:
    torch.set_num_threads(args.threads)
    if args.calibrate:
        return calibrate(args)
    rule: str | float = args.outlier_profit
    try:
        rule = float(rule)
    except ValueError:
        pass
    sizes = [2000, 5000, 20000] if args.large else args.sizes
    results = [_one_size(n, args, rule) for n in sizes]
    dense_ns = [r["n"] for r in results if "h_step_dense_s" in r]
    summary = {}
    if dense_ns:
        largest = next(r for r in results if r["n"] == max(dense_ns))
        summary["speedup_sparse_over_dense_h_step"] = {
            "n": largest["n"],
            **{f"k{k}": largest[f"k{k}"]["sparse_on_dense_P"]["speedup_over_dense"] for k in args.ks},
        }
    return {
        "benchmark": "matching",
        "config": {k: v for k, v in vars(args).items() if not k.startswith("_") and k != "json"},
        "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "load_avg_1m": os.getloadavg()[0]},
        "results": results,
        "summary": summary,
    }


# ------------------------------------------------------------------ outlier-profit calibration

CALIBRATION_GRID: list[tuple[str, float]] = [
    ("inverse_variance", 1.0),
    ("scaled_inverse_variance", 1 / 64),
    ("scaled_inverse_variance", 1 / 16),
    ("scaled_inverse_variance", 1 / 4),
    ("slack", 0.25),
    ("slack", 0.5),
    ("slack", 0.75),
    ("constant", 5e-5),
    ("constant", 0.01),
    ("constant", 0.05),
    ("constant", 0.2),
]
VOXEL_3DMATCH = 0.05  # m; pairs are judged with the 3DMatch rule RE < 15 deg, TE < 0.3 m
INLIER_DIST = 2 * VOXEL_3DMATCH  # a match is correct when ||T_gt x - y|| < 10 cm


def _fpfh(xyz: np.ndarray, voxel: float) -> torch.Tensor:
    """L2-normalised Open3D FPFH ``(N, 33)`` (normals from radius 2 voxel, features from 5 voxel)."""
    import open3d as o3d

    pcd = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(xyz.astype(np.float64)))
    pcd.estimate_normals(o3d.geometry.KDTreeSearchParamHybrid(radius=2 * voxel, max_nn=30))
    f = o3d.pipelines.registration.compute_fpfh_feature(pcd, o3d.geometry.KDTreeSearchParamHybrid(radius=5 * voxel, max_nn=100))
    return torch.nn.functional.normalize(torch.tensor(np.asarray(f.data).T, dtype=torch.float32), dim=1)


def _synthetic_feature_pair(cloud: np.ndarray, seed: int) -> dict:
    """Real 3DMatch geometry, planted features: inlier ratio 0.3 or 0.6, feature noise 0.3 or 0.6."""
    from s2h_ros.geometry import apply_transform, make_transform, random_rotation

    rng = np.random.default_rng(seed)
    ratio, noise = (0.3, 0.6)[seed % 2], (0.3, 0.6)[(seed // 2) % 2]
    n = 1500
    idx = rng.permutation(len(cloud))
    m = int(ratio * n)
    src = cloud[idx[:n]]
    T = make_transform(random_rotation(rng, 180.0), rng.uniform(-1, 1, 3))
    tgt_points = np.concatenate([src[:m], cloud[idx[n : 2 * n - m]]])  # shared part + target-only points
    order = rng.permutation(n)
    tgt = apply_transform(T, tgt_points[order]) + rng.normal(scale=0.005, size=(n, 3))
    fx, fy, _ = synthetic_features(n, 0.0, noise, seed=seed)
    inv = np.argsort(order)
    fy[inv[:m]] = torch.nn.functional.normalize(fx[:m] + noise * torch.randn(m, 32, generator=torch.Generator().manual_seed(seed)) / 32**0.5, dim=1)
    return {"name": f"synthetic-r{ratio}-n{noise}-s{seed}", "src": src, "tgt": tgt, "T": T, "fx": fx, "fy": fy,
            "kind": "synthetic", "true_pairs": m}


def _fpfh_crop_pair(cloud: np.ndarray, seed: int) -> dict:
    """Two overlapping slabs of one real 3DMatch fragment, the second moved by a random rigid T,
    voxelised on independently shifted grids (so samples and FPFH differ), FPFH features."""
    from s2h_ros.geometry import apply_transform, make_transform, random_rotation, voxel_downsample

    rng = np.random.default_rng(seed)
    d = rng.normal(size=3)
    d /= np.linalg.norm(d)
    h = (cloud - cloud.mean(0)) @ d
    span = np.ptp(h)
    a, b = cloud[h < 0.2 * span], cloud[h > -0.2 * span]
    a = a[voxel_downsample(a + rng.uniform(0, VOXEL_3DMATCH, 3), VOXEL_3DMATCH)]
    b = b[voxel_downsample(b + rng.uniform(0, VOXEL_3DMATCH, 3), VOXEL_3DMATCH)]
    T = make_transform(random_rotation(rng, 180.0), rng.uniform(-1, 1, 3))
    tgt = apply_transform(T, b) + rng.normal(scale=0.003, size=b.shape)
    return {"name": f"fpfh-crop-s{seed}", "src": a, "tgt": tgt, "T": T, "fx": _fpfh(a, VOXEL_3DMATCH),
            "fy": _fpfh(tgt, VOXEL_3DMATCH), "kind": "fpfh"}


def _fpfh_demo_pair() -> dict:
    """The bundled real 3DMatch pair with its ground truth, 5 cm voxels, FPFH."""
    from s2h_ros import paths
    from s2h_ros.geometry import voxel_downsample

    src, ref = np.load(paths.THREEDMATCH_DEMO_DIR / "src.npy"), np.load(paths.THREEDMATCH_DEMO_DIR / "ref.npy")
    src, ref = src[voxel_downsample(src, VOXEL_3DMATCH)], ref[voxel_downsample(ref, VOXEL_3DMATCH)]
    return {"name": "3dmatch-demo", "src": src, "tgt": ref, "T": np.load(paths.THREEDMATCH_DEMO_DIR / "gt.npy"),
            "fx": _fpfh(src, VOXEL_3DMATCH), "fy": _fpfh(ref, VOXEL_3DMATCH), "kind": "fpfh"}


RANSAC_ITERS = 5000  # per registration; the same for every rule, so success rates compare


def _register(pair: dict, src_idx: np.ndarray, tgt_idx: np.ndarray, seed: int) -> np.ndarray | None:
    """Synthetic features: weighted Procrustes on the PPM. FPFH (about 5 % inliers): RANSAC on the
    PPM correspondences (``s2h_ros.ransac``, the pipeline's, seeded), the fallback a pipeline would
    use for weak features."""
    from s2h_ros.geometry import make_transform, weighted_procrustes
    from s2h_ros.ransac import ransac

    if src_idx.size < 3:
        return None
    if pair["kind"] == "synthetic":
        R, t = weighted_procrustes(torch.tensor(pair["src"][src_idx]), torch.tensor(pair["tgt"][tgt_idx]),
                                   torch.ones(src_idx.size, dtype=torch.float64))
        return make_transform(R.numpy(), t.numpy())
    result = ransac(pair["src"], pair["tgt"], np.stack([src_idx, tgt_idx], 1).astype(np.int64), INLIER_DIST,
                    RANSAC_ITERS, seed)
    return result.transform


def _evaluate_pair(pair: dict, args) -> dict[str, dict]:
    from scipy.spatial import cKDTree

    from s2h_ros.geometry import apply_transform, correspondence_inlier_mask, transform_errors

    fx, fy = pair["fx"], pair["fy"]
    n_x, n_y = len(fx), len(fy)
    rows, cols = candidate_support(fx, fy, 16)
    if pair["kind"] == "fpfh":  # slack at the median squared 1-NN feature distance (scale-free for FPFH)
        nn = torch.cdist(fx, fy).min(1).values.square().median().item()
        slack = -nn / args.temperature
    else:
        slack = args.slack_score
    p = sparse_augmented_sinkhorn(rows, cols, edge_scores(fx, fy, rows, cols, args.temperature), n_x, n_y, args.iters, slack)
    # recall denominator: planted pairs (synthetic), else source points with a target point within reach
    if "true_pairs" in pair:
        matchable = pair["true_pairs"]
    else:
        d, _ = cKDTree(pair["tgt"]).query(apply_transform(pair["T"], pair["src"]))
        matchable = max(1, int(np.sum(d < INLIER_DIST)))
    out = {}
    for rule, scale in CALIBRATION_GRID:
        sx, sy = sparse_outlier_profits(rows, cols, p, n_x, n_y, rule, scale)
        src, tgt = sparse_partial_permutation(rows, cols, p, n_x, n_y, sx, sy)
        correct = int(correspondence_inlier_mask(pair["src"], pair["tgt"], src, tgt, pair["T"], INLIER_DIST).sum())
        T_est = _register(pair, src, tgt, args.seed)
        re, te = transform_errors(T_est, pair["T"]) if T_est is not None else (180.0, 1e9)
        out[f"{rule}:{scale:g}"] = {"matches": int(src.size), "precision": correct / max(1, src.size),
                                    "recall": correct / matchable, "success": bool(re < 15.0 and te < 0.3)}
    return out


def _summarise(per_pair: list[dict[str, dict]]) -> dict[str, dict]:
    summary = {}
    for key in per_pair[0]:
        rows = [p[key] for p in per_pair]
        prec, rec = np.mean([r["precision"] for r in rows]), np.mean([r["recall"] for r in rows])
        summary[key] = {"precision": float(prec), "recall": float(rec), "f1": float(2 * prec * rec / max(1e-12, prec + rec)),
                        "registration_recall": float(np.mean([r["success"] for r in rows])),
                        "matches": float(np.mean([r["matches"] for r in rows]))}
    return summary


def calibrate(args) -> dict:
    """Precision/recall of matches and registration recall per outlier-profit rule, on a tuning
    split (choose) and a held-out split (report); synthetic features on real geometry and FPFH."""
    from s2h_ros import paths
    from s2h_ros.geometry import voxel_downsample

    ref = np.load(paths.THREEDMATCH_DEMO_DIR / "ref.npy")
    cloud = ref[voxel_downsample(ref, VOXEL_3DMATCH)]
    splits = {"tune": range(0, 8), "held_out": range(100, 108)}
    log = lambda *a: print(f"[calibrate {time.perf_counter() - t0:6.1f}s]", *a, file=sys.stderr, flush=True)  # noqa: E731
    t0 = time.perf_counter()
    report: dict = {"benchmark": "matching-calibration", "grid": [f"{r}:{s:g}" for r, s in CALIBRATION_GRID]}
    for split, seeds in splits.items():
        synthetic = [_evaluate_pair(_synthetic_feature_pair(cloud, s), args) for s in seeds]
        log(split, "synthetic done")
        fpfh = [_evaluate_pair(_fpfh_crop_pair(ref, s), args) for s in list(seeds)[:3]]
        if split == "held_out":
            fpfh.append(_evaluate_pair(_fpfh_demo_pair(), args))
        log(split, "fpfh done")
        report[split] = {"synthetic": _summarise(synthetic), "fpfh": _summarise(fpfh),
                         "pairs": {"synthetic": len(synthetic), "fpfh": len(fpfh)}}
    report["chosen_on_tune"] = _choose(report["tune"]["synthetic"])
    report["best_on_tune_for_fpfh_with_ransac"] = _choose(report["tune"]["fpfh"])
    return report


def _choose(summary: dict[str, dict], f1_margin: float = 0.03) -> str:
    """Best registration recall; among those within ``f1_margin`` of the best F1, the one keeping
    the most matches (headroom for features less peaky than the calibration set)."""
    best_rr = max(v["registration_recall"] for v in summary.values())
    top = {k: v for k, v in summary.items() if v["registration_recall"] == best_rr}
    best_f1 = max(v["f1"] for v in top.values())
    return max((k for k, v in top.items() if v["f1"] >= best_f1 - f1_margin), key=lambda k: top[k]["matches"])
