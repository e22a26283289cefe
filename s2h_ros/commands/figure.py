"""``s2h figure ambiguity --out fig.png``: the paper's ambiguity argument, drawn on the real 3DMatch demo pair.

Top row (supplementary Theorem 1): for a consistent subset ``X`` (real source points) and
``Y = R X + t``, every soft matrix ``P = X^+ U* D V*^T (Y^T)^+`` yields virtual points
``Y P^T = V* D U*^T (X X^T)^-1 X`` (centred) from which Procrustes recovers exactly ``R``, whatever the
positive diagonal ``D``; only ``D = D*`` gives the true points, the others deform the cloud.
Bottom row: on the real (not consistent) pair, an augmented-Sinkhorn ``P`` from ground-truth
geometric scores gives virtual points ``Y P^T`` that are not scan points (they cut corners and
shrink toward local means), while the PPM of the H-step picks real target points.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("which", choices=["ambiguity"], help="which figure")
    parser.add_argument("--out", type=Path, required=True, help="PNG file to write")
    parser.add_argument("--points", type=int, default=1200, help="source points drawn (random subset)")
    parser.add_argument("--voxel", type=float, default=0.05, help="voxel size (m) before sampling")
    parser.add_argument("--seed", type=int, default=0)


def ambiguity_virtual_points(X: np.ndarray, R: np.ndarray, D: np.ndarray) -> np.ndarray:
    """Virtual points ``(N, 3)`` of the soft matrix built from diagonal ``D`` (3,) in Theorem 1.

    ``X`` is ``(N, 3)`` and centred; ``Y = X R^T``. Returns ``(V* diag(D) U*^T (X^T X)^-1 X^T)^T``.
    """
    H = X.T @ (X @ R.T)  # sum_i x_i y_i^T  (3, 3)
    U, _, Vt = np.linalg.svd(H)
    return (Vt.T @ np.diag(D) @ U.T @ np.linalg.inv(X.T @ X) @ X.T).T


def _procrustes_R(X: np.ndarray, Y: np.ndarray) -> np.ndarray:
    import torch

    from s2h_ros.geometry import weighted_procrustes

    R, _ = weighted_procrustes(torch.tensor(X), torch.tensor(Y), torch.ones(len(X), dtype=torch.float64))
    return R.numpy()


def run(args) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch
    from scipy.spatial import cKDTree

    from s2h_ros import paths
    from s2h_ros.geometry import apply_transform, rotation_error_deg, voxel_downsample
    from s2h_ros.matching import augmented_sinkhorn, partial_permutation

    rng = np.random.default_rng(args.seed)
    src = np.load(paths.THREEDMATCH_DEMO_DIR / "src.npy")
    ref = np.load(paths.THREEDMATCH_DEMO_DIR / "ref.npy")
    T_gt = np.load(paths.THREEDMATCH_DEMO_DIR / "gt.npy")
    src = src[voxel_downsample(src, args.voxel)]
    ref = ref[voxel_downsample(ref, args.voxel)]
    src = src[rng.choice(len(src), min(args.points, len(src)), replace=False)]
    U, _, Vt = np.linalg.svd(T_gt[:3, :3])  # the stored ground truth is orthonormal only to 1e-4
    R_gt = U @ Vt

    # Top row: Theorem 1 on the consistent subset.
    X = src - src.mean(0)
    Y = X @ R_gt.T
    _, D_star, _ = np.linalg.svd(X.T @ Y)
    variants = {
        "D = D* (correct)": D_star,
        "D = s1 * (1, 1, 1)": np.full(3, D_star[0]),
        "D = reversed D*": D_star[::-1].copy(),
        "D = D* * (1, 0.1, 0.1)": D_star * np.array([1.0, 0.1, 0.1]),
    }
    # Bottom row: soft virtual points versus PPM real points on the real pair.
    src_in_ref = apply_transform(T_gt, src)
    near = cKDTree(src_in_ref).query(ref)[0] < 0.3  # target points near the overlap
    tgt = ref[near]
    d2 = ((src_in_ref[:, None, :] - tgt[None, :, :]) ** 2).sum(-1)
    scores = torch.tensor(-d2 / (args.voxel / 2) ** 2)
    P = augmented_sinkhorn(scores, iters=20, slack_score=-2.0)
    mass = P.sum(1, keepdim=True)
    virtual = ((P @ torch.tensor(tgt)) / mass.clamp(min=1e-12)).numpy()
    has_mass = mass[:, 0].numpy() > 0.5
    M = partial_permutation(P.numpy())
    s_idx, t_idx = np.nonzero(M)
    off_scan_virtual = cKDTree(tgt).query(virtual[has_mass])[0]

    # Draw: project on the two main axes of the target cloud (top view of the fragment).
    _, _, axes = np.linalg.svd(tgt - tgt.mean(0), full_matrices=False)
    proj = lambda a: (a - tgt.mean(0)) @ axes[:2].T  # noqa: E731
    fig, ax = plt.subplots(2, 4, figsize=(18, 9))
    for a, (name, D) in zip(ax[0], variants.items()):
        V = ambiguity_virtual_points(X, R_gt, D)
        re = rotation_error_deg(_procrustes_R(X, V), R_gt)
        err = np.linalg.norm(V - Y, axis=1).mean()
        a.scatter(*proj(Y + tgt.mean(0)).T, s=2, c="tab:blue", label="target Y = R X")
        a.scatter(*proj(V + tgt.mean(0)).T, s=2, c="magenta", label="virtual Y P^T")
        a.set_title(f"{name}\nProcrustes RE {re:.1e} deg, mean shift {err:.2f} m", fontsize=9)
    for a, (pts, title, color) in zip(
        ax[1, :2],
        [
            (virtual[has_mass], f"soft (S-step) virtual points Y P^T\nmedian distance to nearest scan point "
             f"{100 * np.median(off_scan_virtual):.1f} cm, max {100 * off_scan_virtual.max():.1f} cm", "magenta"),
            (tgt[t_idx], f"S2H (PPM) real points: {len(t_idx)} matches\nmean error to true position "
             f"{100 * np.linalg.norm(tgt[t_idx] - src_in_ref[s_idx], axis=1).mean():.1f} cm", "green"),
        ],
    ):
        a.scatter(*proj(tgt).T, s=2, c="lightgray", label="real target scan")
        a.scatter(*proj(pts).T, s=2, c=color)
        a.set_title(title, fontsize=9)
    zoom_c = proj(src_in_ref).mean(0)
    for a, (pts, color, title) in zip(
        ax[1, 2:], [(virtual[has_mass], "magenta", "zoom: soft virtual points"), (tgt[t_idx], "green", "zoom: PPM points")]
    ):
        a.scatter(*proj(tgt).T, s=8, c="lightgray")
        a.scatter(*proj(pts).T, s=8, c=color)
        a.set_xlim(zoom_c[0] - 0.4, zoom_c[0] + 0.4)
        a.set_ylim(zoom_c[1] - 0.4, zoom_c[1] + 0.4)
        a.set_title(title, fontsize=9)
    for a in ax.ravel():
        a.set_aspect("equal")
        a.set_xticks([])
        a.set_yticks([])
    ax[0, 0].legend(loc="lower left", fontsize=8, markerscale=4)
    fig.suptitle("Ambiguity of soft matching on the real 3DMatch demo pair: same rotation, deformed virtual points "
                 "(top); soft virtual points versus S2H real points (bottom)", fontsize=11)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0
