"""Training DGR's 6-D inlier network on FCGF correspondences, three ways (``--loss``):

- ``bce``: DGR's classification: label a correspondence (x, y) inlier when
  ``||T_gt x - y|| < inlier_distance``, class-balanced binary cross-entropy on the logits.
- ``l3``: SHM_DGR as in the paper's supplement: FCGF frozen, S2H correspondences (from
  ``pipeline.s2h_correspondences``, as the pipeline matches: same ``RegistrationConfig``, weak-feature
  safeguard included)
  weighted by the network, weighted Procrustes, and only the motion loss
  ``L3 = ||R_gt^T R - I|| + ||t_gt - t||``.
- ``s2h``: the paper's complete loss ``L1 + L2 + L3`` end to end: FCGF is fine-tuned as well,
  its gradient reaching the descriptors through the S-step (the straight-through PPM).
- ``sstep``: the paper's ablation "S-step only in training, H-step at test time": L1 and L2 score
  the soft ``P``, and L3 pairs each source voxel whose row of ``P`` holds at least half a unit of
  mass with its *virtual point* ``sum_j P_ij y_j / sum_j P_ij`` (weight: inlier weight x row mass).
  The straight-through PPM hands L1/L2 the same gradient as ``P`` does (both are linear in the
  matrix), so the two runs differ through what L3 and the inlier network see: real scan points
  paired one-to-one, or virtual points that lie off the scan (supplement, Theorem 1).

With the sparse S2H of ``s2h_match`` the PPM ``M`` and the soft ``P`` live on a candidate edge
list, so L1 and L2 are evaluated there: with ``M_st = M + P - P.detach()`` (value M, gradient to P)
``L1 = -sum_e M_st,e G_e / |G|`` and ``L2 = -sum_e M_st,e / (Nx + Ny)``, where ``G`` marks the
ground-truth pairs (each source voxel and the target voxel nearest ``T_gt x`` within the inlier
distance) and ``|G|`` counts all of them, also those outside the support. These equal
``matching.matching_loss`` and ``matching.inlier_count_loss`` of the dense matrices, whose entries
off the support are zero.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from scipy.spatial import cKDTree

from s2h_ros.config import RegistrationConfig
from s2h_ros.geometry import make_transform, weighted_procrustes
from s2h_ros.training.augment import AugmentConfig, augment_pair
from s2h_ros.training.data import CachedPair
from s2h_ros.training.fcgf_trainer import batched_features
from s2h_ros.training.loop import unwrap
from s2h_ros.training.validation import nearest_feature, summarize

LOSSES = ("bce", "l3", "s2h", "sstep")


def ground_truth_partner(src: np.ndarray, tgt: np.ndarray, T_gt: np.ndarray, radius: float) -> np.ndarray:
    """``(Ns,) int64``: the target row nearest ``T_gt src_i`` within ``radius``, or -1."""
    moved = src @ T_gt[:3, :3].T + T_gt[:3, 3]
    dist, j = cKDTree(tgt).query(moved, k=1, distance_upper_bound=radius)
    return np.where(np.isfinite(dist), j, -1).astype(np.int64)


def sparse_s2h_losses(p: torch.Tensor, matched: torch.Tensor, is_gt: torch.Tensor, n_gt: int,
                      n_x: int, n_y: int, hard: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """``(L1, L2)`` on a candidate edge list: ``p (E,)`` soft P, ``matched``/``is_gt (E,)`` bool.

    ``hard``: score the straight-through PPM (value M, gradient to P); else the soft P (S-step only).
    """
    m_st = matched.to(p.dtype) + p - p.detach() if hard else p
    l1 = -(m_st * is_gt.to(p.dtype)).sum() / max(n_gt, 1)
    l2 = -m_st.sum() / (n_x + n_y)
    return l1, l2


class InlierTask:
    """The inlier-network training task plugged into ``training.loop.train``."""

    def __init__(self, fcgf: torch.nn.Module, inlier: torch.nn.Module, voxel: float, device: torch.device,
                 loss: str = "l3", matcher: str = "s2h", max_points: int = 8000, inlier_distance: float = 0.6,
                 fcgf_lr: float = 1e-4, augment: AugmentConfig | None = AugmentConfig(),
                 registration: RegistrationConfig | None = None) -> None:
        if loss not in LOSSES:
            raise ValueError(f"unknown loss {loss!r} (choose from {', '.join(LOSSES)})")
        self.end_to_end = loss in ("s2h", "sstep")  # L1 + L2 + L3, FCGF fine-tuned
        if self.end_to_end and matcher != "s2h":
            raise ValueError(f"--loss {loss} needs the s2h matcher (L1 and L2 are losses of its matrices)")
        self.fcgf = fcgf.to(device)
        self.fcgf.requires_grad_(self.end_to_end)
        self.nets: dict[str, torch.nn.Module] = {"inlier": inlier.to(device)}
        if self.end_to_end:
            self.nets["fcgf"] = self.fcgf
        self.voxel, self.device, self.kind, self.matcher = voxel, device, loss, matcher
        self.max_points, self.inlier_distance, self.fcgf_lr = max_points, inlier_distance, fcgf_lr
        self.augment = augment
        self.reg = registration or RegistrationConfig(voxel_size=voxel)

    def param_groups(self, lr: float) -> list[dict]:
        groups = [{"params": list(self.nets["inlier"].parameters()), "lr": lr}]
        if "fcgf" in self.nets:
            groups.append({"params": list(self.nets["fcgf"].parameters()), "lr": self.fcgf_lr})
        return groups

    # ------------------------------------------------------------------ shared steps
    def _subsample(self, xyz: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return xyz if len(xyz) <= self.max_points else xyz[np.sort(rng.choice(len(xyz), self.max_points, replace=False))]

    def _features(self, pair: CachedPair):
        net = self.nets.get("fcgf", self.fcgf)
        if not self.end_to_end:
            self.fcgf.eval()  # frozen: BatchNorm uses its running statistics
        with torch.set_grad_enabled(self.end_to_end and net.training):
            return batched_features(net, [pair.source, pair.target], self.voxel, self.device)

    def _correspondences(self, f0: torch.Tensor, f1: torch.Tensor):
        """``(i, j, p, match)``: paired rows, P on them (ones for nn) and the S2H result (None for nn)."""
        if self.matcher == "nn":
            j = nearest_feature(f0, f1)
            i = torch.arange(len(j), device=j.device)
            return i, j, torch.ones(len(j), device=f0.device), None
        from s2h_ros.pipeline import s2h_correspondences

        return s2h_correspondences(f0, f1, self.reg)

    def _logits(self, src: torch.Tensor, tgt: torch.Tensor, xyz0: torch.Tensor, xyz1: torch.Tensor) -> torch.Tensor:
        """Inlier logits of correspondences ``(src (K, 3), tgt (K, 3))``."""
        net = self.nets["inlier"] if self.nets["inlier"].training else unwrap(self.nets["inlier"])
        if len(src) == 0:  # nothing matched: one dummy row keeps every rank's backward in step
            return net(xyz0[:1], xyz1[:1], self.voxel)[:0]
        return net(src, tgt, self.voxel)

    @staticmethod
    def _virtual_correspondences(xyz1: torch.Tensor, match, n_x: int, min_mass: float = 0.5):
        """``(i (K,), virtual (K, 3), mass (K,))``: source rows of ``P`` with mass >= ``min_mass``
        and their P-weighted mean target point (differentiable in ``P``)."""
        p = match.p
        mass = p.new_zeros(n_x).index_add(0, match.rows, p)
        virtual = p.new_zeros(n_x, 3).index_add(0, match.rows, p[:, None] * xyz1[match.cols])
        i = torch.nonzero(mass.detach() >= min_mass)[:, 0]
        return i, virtual[i] / mass[i, None], mass[i]

    # ------------------------------------------------------------------ loss
    def loss(self, pair: CachedPair, rng: np.random.Generator) -> tuple[torch.Tensor, dict[str, float]]:
        if self.augment is not None:
            pair = augment_pair(pair, rng, self.augment)
        pair = CachedPair(self._subsample(pair.source, rng), self._subsample(pair.target, rng), pair.T_gt, pair.name)
        (xyz0, f0), (xyz1, f1) = self._features(pair)
        i, j, p, match = self._correspondences(f0, f1)
        if self.kind == "sstep":  # soft correspondences: virtual target points, weighted by row mass
            i_soft, tgt, mass = self._virtual_correspondences(xyz1, match, len(xyz0))
            src = xyz0[i_soft]
        else:
            src, tgt = xyz0[i], xyz1[j]
        logits = self._logits(src, tgt.detach(), xyz0, xyz1)
        T = torch.as_tensor(pair.T_gt, dtype=torch.float32, device=self.device)
        resid = torch.linalg.vector_norm(src @ T[:3, :3].T + T[:3, 3] - tgt.detach(), dim=1)
        labels = (resid < self.inlier_distance).float()
        logs = {"inlier_ratio": float(labels.mean()) if len(labels) else 0.0, "matches": float(len(labels))}
        zero = logits.sum() * 0.0
        if self.kind == "bce":
            n_pos = labels.sum()
            pos_weight = (len(labels) - n_pos) / n_pos.clamp_min(1.0)  # class balance (DGR's balanced BCE)
            loss = F.binary_cross_entropy_with_logits(logits, labels, pos_weight=pos_weight) if len(labels) else zero
            with torch.no_grad():
                pred = logits > 0
                logs["precision"] = float((pred & (labels > 0)).sum() / pred.sum().clamp_min(1))
                logs["recall"] = float((pred & (labels > 0)).sum() / n_pos.clamp_min(1))
            return loss, logs
        # l3 / s2h: learned weights (times the straight-through PPM entries) into weighted Procrustes
        w = torch.sigmoid(logits)
        if self.kind == "s2h":
            w = w * (1.0 + p - p.detach())
        elif self.kind == "sstep":
            w = w * mass
        l3 = zero
        if len(w) >= 3:
            R, t = weighted_procrustes(src, tgt, w)
            l3 = _motion_loss(R, t, T)
        loss = l3
        logs["l3"] = float(l3.detach())
        if self.end_to_end:
            gt = torch.as_tensor(ground_truth_partner(xyz0.detach().cpu().numpy(), xyz1.detach().cpu().numpy(),
                                                      pair.T_gt, self.inlier_distance), device=self.device)
            matched = torch.zeros(match.rows.numel(), dtype=torch.bool, device=self.device)
            keys = match.rows * len(xyz1) + match.cols
            matched[torch.searchsorted(keys, i * len(xyz1) + j)] = True
            l1, l2 = sparse_s2h_losses(match.p, matched, gt[match.rows] == match.cols, int((gt >= 0).sum()),
                                       len(xyz0), len(xyz1), hard=self.kind == "s2h")
            loss = l1 + l2 + l3
            logs.update(l1=float(l1.detach()), l2=float(l2.detach()))
        return loss, logs

    # ------------------------------------------------------------------ validation, checkpoints
    @torch.no_grad()
    def validate(self, pairs: list[CachedPair]) -> dict[str, float]:
        """Recall / RE / TE of weighted Procrustes on the learned weights, and the weights' precision."""
        T_preds, T_gts, precision, ratio = [], [], [], []
        for n, pair in enumerate(pairs):
            rng = np.random.default_rng([n, 7])
            pair = CachedPair(self._subsample(pair.source, rng), self._subsample(pair.target, rng), pair.T_gt, pair.name)
            (xyz0, f0), (xyz1, f1) = batched_features(self.fcgf, [pair.source, pair.target], self.voxel, self.device)
            i, j, _, _ = self._correspondences(f0, f1)
            w = torch.sigmoid(self._logits(xyz0[i], xyz1[j], xyz0, xyz1))
            w = torch.where(w < self.reg.weight_floor, torch.zeros_like(w), w)
            T = torch.as_tensor(pair.T_gt, dtype=torch.float32, device=self.device)
            good = torch.linalg.vector_norm(xyz0[i] @ T[:3, :3].T + T[:3, 3] - xyz1[j], dim=1) < self.inlier_distance
            ratio.append(float(good.float().mean()) if len(good) else 0.0)
            precision.append(float((w * good).sum() / w.sum().clamp_min(1e-9)))
            T_pred = np.eye(4)
            if len(w) >= 3 and float(w.sum()) > 0:
                R, t = weighted_procrustes(xyz0[i].double(), xyz1[j].double(), w.double())
                T_pred = make_transform(R.cpu().numpy(), t.cpu().numpy())
            T_preds.append(T_pred)
            T_gts.append(pair.T_gt)
        return {"match_inlier_ratio": float(np.mean(ratio)), "weighted_precision": float(np.mean(precision)),
                **summarize(T_preds, T_gts)}

    def save(self, path: Path, extra: dict) -> None:
        """DGR's layout: ``state_dict`` (FCGF) and ``state_dict_inlier``, loadable by ``models.load_dgr``."""
        nets = extra.pop("nets")
        fcgf = nets.get("fcgf", self.fcgf)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        torch.save({"state_dict": fcgf.state_dict(), "state_dict_inlier": nets["inlier"].state_dict(),
                    "fcgf_config": fcgf.config.to_dict(), "inlier_config": nets["inlier"].config.to_dict(),
                    "voxel": self.voxel, "trainer": f"inlier/{self.kind}", "matcher": self.matcher, **extra}, tmp)
        tmp.replace(path)

    def load(self, data: dict) -> None:
        from s2h_ros.models.checkpoint import load_weights

        load_weights(self.nets["inlier"], data["state_dict_inlier"])
        load_weights(self.fcgf, data["state_dict"])


def _motion_loss(R: torch.Tensor, t: torch.Tensor, T_gt: torch.Tensor) -> torch.Tensor:
    from s2h_ros.matching import motion_loss

    return motion_loss(R, t, T_gt[:3, :3], T_gt[:3, 3])


def train_inlier(args) -> dict:
    """``s2h train inlier``: load FCGF, train the inlier network on ``--data``, write ``--out`` (DGR layout)."""
    from s2h_ros.models import load_fcgf
    from s2h_ros.models.inlier import InlierNetwork
    from s2h_ros.training.loop import init_distributed, load_splits, loop_config, train

    info = init_distributed(args.device)
    train_pairs, val_pairs, voxel = load_splits(args, info)
    torch.manual_seed(args.seed)
    fcgf = load_fcgf(args.fcgf)
    inlier = InlierNetwork(args.preset)
    task = InlierTask(fcgf, inlier, voxel, info.device, args.loss, args.matcher, args.max_points,
                      args.inlier_distance, args.fcgf_lr, None if args.no_augment else AugmentConfig(max_yaw_deg=args.max_yaw))
    return train(task, train_pairs, val_pairs, loop_config(args), info)
