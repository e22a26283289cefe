"""Training an inlier network on FCGF correspondences (DGR's 6-D network, or the shipped context
network of ``models.context_inlier`` with ``--preset context`` / ``--inlier-init``), four ways (``--loss``):

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

Every equation is ``s2h_ros.matching``'s: S2H runs as the pipeline runs it, L1 and L2 are
``matching.sparse_matching_loss`` / ``sparse_inlier_count_loss`` of the straight-through PPM on the
candidate edges (``MatchResult.hard_edges``: value M, gradient to P; equal to the dense
``matching_loss`` / ``inlier_count_loss``, whose entries off the support are zero), where the
ground truth ``G`` pairs each source voxel with the target voxel nearest ``T_gt x`` within the inlier
distance and ``|G|`` counts all of them, also those outside the support; L3 is ``matching.motion_loss``
of ``geometry.weighted_procrustes``, and the total ``matching.total_loss``.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from s2h_ros.config import RegistrationConfig
from s2h_ros.geometry import weighted_procrustes
from s2h_ros.matching import balanced_bce, motion_loss, sparse_inlier_count_loss, sparse_matching_loss, straight_through, total_loss
from s2h_ros.models.context_inlier import ContextInlierNetwork
from s2h_ros.training.augment import AugmentConfig, augment_from_args, augment_pair
from s2h_ros.training.data import CachedPair
from s2h_ros.training.fcgf_trainer import batched_features
from s2h_ros.training.loop import unwrap
from s2h_ros.training.validation import (correspondence_residuals, ground_truth_partner, nearest_feature,
                                         procrustes_transform, summarize)

LOSSES = ("bce", "l3", "s2h", "sstep")


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
        from s2h_ros.correspondences import s2h_correspondences

        return s2h_correspondences(f0, f1, self.reg)

    def _logits(self, src: torch.Tensor, tgt: torch.Tensor, p: torch.Tensor, xyz0: torch.Tensor, xyz1: torch.Tensor,
                rng: np.random.Generator | None = None) -> torch.Tensor:
        """Inlier logits of correspondences ``(src (K, 3), tgt (K, 3))`` with S-step probabilities
        ``p (K,)``: the context network reads ``p`` as an input (detached, as the pipeline hands it
        over) and draws its first anchors with a generator seeded from ``rng`` (fixed when None, as
        at inference); DGR's 6-D network reads the coordinates only."""
        net = self.nets["inlier"] if self.nets["inlier"].training else unwrap(self.nets["inlier"])
        if len(src) == 0:  # nothing matched: one dummy row keeps every rank's backward in step
            src, tgt, p = xyz0[:1], xyz1[:1], p.new_ones(1)
            return self._logits(src, tgt, p, xyz0, xyz1, rng)[:0]
        if isinstance(unwrap(self.nets["inlier"]), ContextInlierNetwork):
            gen = None if rng is None else torch.Generator().manual_seed(int(rng.integers(2**31)))
            return net(src, tgt, self.voxel, p.detach(), gen)
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
            src, p_in = xyz0[i_soft], mass
        else:
            src, tgt, p_in = xyz0[i], xyz1[j], p
        logits = self._logits(src, tgt.detach(), p_in, xyz0, xyz1, rng)
        T = torch.as_tensor(pair.T_gt, dtype=torch.float32, device=self.device)
        labels = (correspondence_residuals(src, tgt.detach(), T) < self.inlier_distance).float()
        logs = {"inlier_ratio": float(labels.mean()) if len(labels) else 0.0, "matches": float(len(labels))}
        zero = logits.sum() * 0.0
        if self.kind == "bce":
            n_pos = labels.sum()
            loss = balanced_bce(logits, labels) if len(labels) else zero
            with torch.no_grad():
                pred = logits > 0
                logs["precision"] = float((pred & (labels > 0)).sum() / pred.sum().clamp_min(1))
                logs["recall"] = float((pred & (labels > 0)).sum() / n_pos.clamp_min(1))
            return loss, logs
        # l3 / s2h: learned weights (times the straight-through PPM entries) into weighted Procrustes
        w = torch.sigmoid(logits)
        if self.kind == "s2h":
            w = w * straight_through(torch.ones_like(p), p)
        elif self.kind == "sstep":
            w = w * mass
        l3 = zero
        if len(w) >= 3:
            R, t = weighted_procrustes(src, tgt, w)
            l3 = motion_loss(R, t, T[:3, :3], T[:3, 3])
        loss = l3
        logs["l3"] = float(l3.detach())
        if self.end_to_end:
            l1, l2 = self.matching_terms(match, i, j, xyz0, xyz1, pair.T_gt)
            loss = total_loss(l1, l2, l3)
            logs.update(l1=float(l1.detach()), l2=float(l2.detach()))
        return loss, logs

    def matching_terms(self, match, i: torch.Tensor, j: torch.Tensor, xyz0: torch.Tensor, xyz1: torch.Tensor,
                       T_gt: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """``(L1, L2)`` on the candidate edges of ``match``: of the straight-through PPM ``(i, j)``
        (``s2h``), or of the soft ``P`` (``sstep``: S-step only in training). With no ground-truth
        pair at all (no overlap left after augmentation) L1 is undefined and counts as 0."""
        m = match.p if self.kind == "sstep" else match.hard_edges(i, j)
        gt = torch.as_tensor(ground_truth_partner(xyz0.detach().cpu().numpy(), xyz1.detach().cpu().numpy(),
                                                  T_gt, self.inlier_distance), device=m.device)
        n_gt = int((gt >= 0).sum())
        l1 = sparse_matching_loss(m, gt[match.rows] == match.cols, n_gt) if n_gt else m.sum() * 0.0
        return l1, sparse_inlier_count_loss(m, len(xyz0), len(xyz1))

    # ------------------------------------------------------------------ validation, checkpoints
    @torch.no_grad()
    def validate(self, pairs: list[CachedPair]) -> dict[str, float]:
        """Recall / RE / TE of weighted Procrustes on the learned weights, and the weights' precision."""
        T_preds, T_gts, precision, ratio = [], [], [], []
        for n, pair in enumerate(pairs):
            rng = np.random.default_rng([n, 7])
            pair = CachedPair(self._subsample(pair.source, rng), self._subsample(pair.target, rng), pair.T_gt, pair.name)
            (xyz0, f0), (xyz1, f1) = batched_features(self.fcgf, [pair.source, pair.target], self.voxel, self.device)
            i, j, p, _ = self._correspondences(f0, f1)
            w = torch.sigmoid(self._logits(xyz0[i], xyz1[j], p, xyz0, xyz1))
            w = torch.where(w < self.reg.weight_floor, torch.zeros_like(w), w)
            good = correspondence_residuals(xyz0[i], xyz1[j], pair.T_gt) < self.inlier_distance
            ratio.append(float(good.float().mean()) if len(good) else 0.0)
            precision.append(float((w * good).sum() / w.sum().clamp_min(1e-9)))
            T_pred = procrustes_transform(xyz0[i], xyz1[j], w)
            T_preds.append(np.eye(4) if T_pred is None else T_pred)
            T_gts.append(pair.T_gt)
        return {"match_inlier_ratio": float(np.mean(ratio)), "weighted_precision": float(np.mean(precision)),
                **summarize(T_preds, T_gts)}

    def save(self, path: Path, extra: dict) -> None:
        """DGR's layout: ``state_dict`` (FCGF) and ``state_dict_inlier``, loadable by ``models.load_dgr``
        (written atomically, ``write_checkpoint``)."""
        from s2h_ros.models.checkpoint import inlier_entries, write_checkpoint

        nets = extra.pop("nets")
        fcgf = nets.get("fcgf", self.fcgf)
        write_checkpoint(path, {"state_dict": fcgf.state_dict(), **inlier_entries(nets["inlier"]),
                                "fcgf_config": fcgf.config.to_dict(), "voxel": self.voxel,
                                "trainer": f"inlier/{self.kind}", "matcher": self.matcher, **extra})

    def load(self, data: dict) -> None:
        from s2h_ros.models.checkpoint import load_weights

        load_weights(self.nets["inlier"], data["state_dict_inlier"])
        load_weights(self.fcgf, data["state_dict"])


def initial_inlier_network(preset: str, init: str | Path | None = None) -> torch.nn.Module:
    """The network to train: the inlier network of checkpoint ``init`` (e.g. the shipped weights,
    whatever kind it holds), else a new one of ``preset`` (``context``: the context network with its
    default configuration; ``compact`` / ``dgr``: DGR's 6-D network)."""
    from s2h_ros.models import load_inlier
    from s2h_ros.models.inlier import InlierNetwork

    if init:
        return load_inlier(init)
    if preset == "context":
        return ContextInlierNetwork()
    return InlierNetwork(preset)


def train_inlier(args) -> dict:
    """``s2h train inlier``: load FCGF, train the inlier network on ``--data``, write ``--out`` (DGR layout)."""
    from s2h_ros.models import load_fcgf
    from s2h_ros.training.loop import run

    def make_task(device: torch.device, voxel: float) -> InlierTask:
        return InlierTask(load_fcgf(args.fcgf), initial_inlier_network(args.preset, args.inlier_init), voxel, device,
                          args.loss, args.matcher, args.max_points, args.inlier_distance, args.fcgf_lr,
                          augment_from_args(args))

    return run(args, make_task)
