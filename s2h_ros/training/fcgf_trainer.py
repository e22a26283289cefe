"""FCGF training with the hardest-contrastive loss (Choy et al., ICCV 2019) on cached pairs.

Positives: each source voxel and the target voxel nearest to ``T_gt x`` when it lies within
``1.5 x voxel`` (FCGF's KITTI positive radius). Loss, over ``num_pos`` sampled positives (i, j):

    L = mean_ij [ ||f_i - f_j|| - m_pos ]_+^2
        + 1/2 ( mean_i [ m_neg - min_k ||f_i - f_k|| ]_+^2 + mean_j [ m_neg - min_k ||f_j - f_k|| ]_+^2 )

with the hardest negative k searched among ``num_hn`` random voxels of the other cloud, margins
m_pos = 0.1 and m_neg = 1.4 (FCGF's defaults). FCGF drops a candidate k only when (i, k) is
itself a positive pair; here every candidate within the positive radius of the anchor's true
partner is dropped, so neighbouring voxels of the same surface are not pushed apart.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from s2h_ros.config import RegistrationConfig
from s2h_ros.geometry import apply_transform
from s2h_ros.ransac import ransac
from s2h_ros.sparse import SparseTensor
from s2h_ros.sparse.quantize import sparse_quantize
from s2h_ros.training.augment import AugmentConfig, augment_from_args, augment_pair
from s2h_ros.training.data import CachedPair
from s2h_ros.training.loop import unwrap
from s2h_ros.training.validation import (
    correspondence_residuals, ground_truth_partner, nearest_feature, summarize,
)

POSITIVE_RADIUS_VOXELS = 1.5  # FCGF KITTI: positives within 1.5 voxels


@dataclass
class ContrastiveConfig:
    """Hardest-contrastive sampling sizes and margins."""

    num_pos: int = 1024
    num_hn: int = 256
    pos_margin: float = 0.1
    neg_margin: float = 1.4


def feature_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``(A, B)`` Euclidean distances of descriptor rows (the small epsilon keeps sqrt differentiable)."""
    d2 = (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * a @ b.T
    return torch.sqrt(d2.clamp_min(0.0) + 1e-7)


def positive_pairs(src: np.ndarray, tgt: np.ndarray, T_gt: np.ndarray, radius: float) -> np.ndarray:
    """``(P, 2) int64`` (source row, target row): the target point nearest ``T_gt src`` within ``radius``."""
    j = ground_truth_partner(src, tgt, T_gt, radius)
    i = np.flatnonzero(j >= 0)
    return np.stack([i, j[i]], 1).astype(np.int64)


def hardest_contrastive_loss(f0: torch.Tensor, f1: torch.Tensor, xyz0: torch.Tensor, xyz1: torch.Tensor,
                             pos: torch.Tensor, hn0: torch.Tensor, hn1: torch.Tensor, radius: float,
                             cfg: ContrastiveConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """FCGF's loss for positives ``pos (P, 2)`` and negative candidates ``hn0``/``hn1`` (row indices).

    ``xyz0`` must already be mapped into the target frame (``T_gt x``), so spatial closeness of
    candidates to the anchors' partners is a plain distance.
    """
    i, j = pos[:, 0], pos[:, 1]
    d_pos = torch.linalg.vector_norm(f0[i] - f1[j], dim=1)
    loss_pos = torch.relu(d_pos - cfg.pos_margin).pow(2).mean()
    # anchor i (partner at xyz1[j]) against target candidates hn1, anchor j against source candidates hn0
    near1 = torch.cdist(xyz1[j], xyz1[hn1]) < radius
    near0 = torch.cdist(xyz1[j], xyz0[hn0]) < radius
    d01 = feature_distance(f0[i], f1[hn1]).masked_fill(near1, float("inf")).min(1).values
    d10 = feature_distance(f1[j], f0[hn0]).masked_fill(near0, float("inf")).min(1).values
    neg = lambda d: torch.relu(cfg.neg_margin - d[torch.isfinite(d)]).pow(2)  # noqa: E731
    n01, n10 = neg(d01), neg(d10)
    loss_neg = 0.5 * ((n01.mean() if n01.numel() else d_pos.sum() * 0) + (n10.mean() if n10.numel() else d_pos.sum() * 0))
    logs = {"pos": float(loss_pos.detach()), "neg": float(loss_neg.detach()),
            "d_pos": float(d_pos.detach().mean()), "d_neg": float(d01[torch.isfinite(d01)].detach().mean())
            if bool(torch.isfinite(d01).any()) else 0.0}
    return loss_pos + loss_neg, logs


def batched_features(net: torch.nn.Module, clouds: list[np.ndarray], voxel: float,
                     device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Run FCGF once on a batch of clouds; per cloud ``(voxel points (M, 3) float32, feats (M, C))``.

    Rows of the batched sparse tensor are sorted by (batch, voxel) and ``sparse_quantize`` returns
    each cloud's voxels in that same sorted order, so the first-point indices line up with them.
    """
    pts = [torch.as_tensor(c, dtype=torch.float32, device=device) for c in clouds]
    firsts = [sparse_quantize(p, voxel)[1] for p in pts]
    x = SparseTensor.from_points(pts, voxel, device=device)
    feats = net(x).feats
    out, start = [], 0
    for p, first in zip(pts, firsts):
        out.append((p[first], feats[start:start + len(first)]))
        start += len(first)
    if start != feats.shape[0]:
        raise RuntimeError(f"batched FCGF returned {feats.shape[0]} rows for {start} voxels")
    return out


class FCGFTask:
    """The FCGF training task plugged into ``training.loop.train``."""

    def __init__(self, net: torch.nn.Module, voxel: float, device: torch.device,
                 contrastive: ContrastiveConfig | None = None, augment: AugmentConfig | None = AugmentConfig(),
                 preset: str = "compact") -> None:
        self.nets = {"fcgf": net.to(device)}
        self.voxel = voxel
        self.device = device
        self.cfg = contrastive or ContrastiveConfig()
        self.augment = augment
        self.preset = preset
        self.radius = POSITIVE_RADIUS_VOXELS * voxel
        # validation: the rotations trained for (none without augmentation), no thinning or noise
        self.val_augment = replace(augment or AugmentConfig(max_yaw_deg=0.0, max_tilt_deg=0.0),
                                  noise_sigma=0.0, keep_min=1.0, crop_min_range=1e9, crop_max_range=1e9 + 1)

    def param_groups(self, lr: float) -> list[dict]:
        return [{"params": list(self.nets["fcgf"].parameters()), "lr": lr}]

    def loss(self, pair: CachedPair, rng: np.random.Generator) -> tuple[torch.Tensor, dict[str, float]]:
        if self.augment is not None:
            pair = augment_pair(pair, rng, self.augment)
        (xyz0, f0), (xyz1, f1) = batched_features(self.nets["fcgf"], [pair.source, pair.target], self.voxel, self.device)
        T = torch.as_tensor(pair.T_gt, dtype=torch.float32, device=self.device)
        moved0 = apply_transform(T, xyz0)
        pos = positive_pairs(xyz0.cpu().numpy(), xyz1.cpu().numpy(), pair.T_gt, self.radius)
        if len(pos) == 0:  # no overlap after augmentation: a zero loss that still runs through the net
            return f0.sum() * 0.0 + f1.sum() * 0.0, {"pos": 0.0, "neg": 0.0, "d_pos": 0.0, "d_neg": 0.0}
        if len(pos) > self.cfg.num_pos:
            pos = pos[rng.choice(len(pos), self.cfg.num_pos, replace=False)]
        hn0 = rng.choice(len(xyz0), min(self.cfg.num_hn, len(xyz0)), replace=False)
        hn1 = rng.choice(len(xyz1), min(self.cfg.num_hn, len(xyz1)), replace=False)
        as_t = lambda a: torch.as_tensor(a, device=self.device)  # noqa: E731
        return hardest_contrastive_loss(f0, f1, moved0, xyz1, as_t(pos), as_t(hn0), as_t(hn1), self.radius, self.cfg)

    @torch.no_grad()
    def validate(self, pairs: list[CachedPair]) -> dict[str, float]:
        """Mean NN inlier ratio, feature-match recall (ratio > 5 %), and RANSAC (s2h_ros.ransac) recall/RE/TE."""
        ratios, T_preds, T_gts = [], [], []
        for n, pair in enumerate(pairs):
            rng = np.random.default_rng([n, 7])
            pair = augment_pair(pair, rng, self.val_augment)
            (xyz0, f0), (xyz1, f1) = batched_features(unwrap(self.nets["fcgf"]), [pair.source, pair.target],
                                                      self.voxel, self.device)
            j = nearest_feature(f0, f1)
            inlier = correspondence_residuals(xyz0, xyz1[j], pair.T_gt) < 2.0 * self.voxel
            ratios.append(float(inlier.float().mean()))
            matched = np.arange(len(j))
            T_preds.append(ransac(xyz0.cpu().numpy(), xyz1[j].cpu().numpy(), np.stack([matched, matched], 1),
                                  2.0 * self.voxel, RegistrationConfig().ransac_iters, int(rng.integers(2**31)),
                                  self.device).transform)
            T_gts.append(pair.T_gt)
        ratios_a = np.asarray(ratios)
        return {"inlier_ratio": float(ratios_a.mean()), "fmr": float(np.mean(ratios_a > 0.05)),
                **summarize(T_preds, T_gts)}

    def save(self, path: Path, extra: dict) -> None:
        from s2h_ros.models.checkpoint import save_checkpoint

        nets = extra.pop("nets")
        save_checkpoint(path, nets["fcgf"], voxel=self.voxel, preset=self.preset, trainer="fcgf", **extra)

    def load(self, data: dict) -> None:
        from s2h_ros.models.checkpoint import load_weights

        load_weights(self.nets["fcgf"], data["state_dict"])


def train_fcgf(args) -> dict:
    """``s2h train fcgf``: build (or load) FCGF, train it on ``--data``, write ``--out``."""
    from s2h_ros.models import build_fcgf, load_fcgf
    from s2h_ros.training.loop import run

    def make_task(device: torch.device, cache_voxel: float) -> FCGFTask:
        net = load_fcgf(args.init) if args.init else build_fcgf(args.preset)
        contrastive = ContrastiveConfig(args.num_pos, args.num_hn, args.pos_margin, args.neg_margin)
        return FCGFTask(net, args.voxel or cache_voxel, device, contrastive, augment_from_args(args), args.preset)

    return run(args, make_task)
