"""Training the context inlier network (``models.context_inlier``) on cached S2H matches.

FCGF is frozen (the paper's supplement trains SHM_DGR's inlier network that way), so the matches
of each pair are fixed and come from ``training.match_data`` (``s2h train matches``). A step is one
sample: a random 50-100 % of its matches (the network must not rely on a match count), every
stage's logits, and

    loss = mean over stages of class-balanced BCE(logit, ||T_gt x - y|| < inlier_distance)
           + L3(weighted Procrustes of the last stage's weights)

where L3 is ``matching.motion_loss`` (the paper's motion loss) and applies only where the sample
holds at least ``MIN_TRUE_INLIERS`` true inliers (a wrong-heading sample has no right motion to
learn; its BCE teaches the network to weigh everything down, so the safeguard takes over).
The loop is ``training.loop.train`` (checkpoints, ``--resume``, budget, validation).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from s2h_ros.config import RegistrationConfig
from s2h_ros.geometry import transform_errors, weighted_procrustes
from s2h_ros.matching import balanced_bce, motion_loss
from s2h_ros.models.context_inlier import ContextInlierConfig, ContextInlierNetwork
from s2h_ros.training.match_data import MatchSample
from s2h_ros.training.validation import RE_THRESH_DEG, TE_THRESH_M, procrustes_transform

MIN_TRUE_INLIERS = 10
OUTDOOR_INLIER_DISTANCE = RegistrationConfig().inlier_distance  # m: the label distance at the outdoor 0.3 m voxels
MAX_MATCHES = 8000  # matches per training step (a sample's random subset above)


class ContextInlierTask:
    """The context inlier network plugged into ``training.loop.train`` (one MatchSample per step)."""

    def __init__(self, net: ContextInlierNetwork, voxel: float, device: torch.device,
                 inlier_distance: float = OUTDOOR_INLIER_DISTANCE, weight_floor: float = 0.05) -> None:
        self.nets = {"inlier": net.to(device)}
        self.voxel, self.device = voxel, device
        self.inlier_distance, self.weight_floor = inlier_distance, weight_floor
        # recall's translation threshold: DGR's KITTI 0.6 m at the outdoor 0.6 m inlier distance, scaled with it
        self.te_threshold = TE_THRESH_M * inlier_distance / OUTDOOR_INLIER_DISTANCE

    def param_groups(self, lr: float) -> list[dict]:
        return [{"params": list(self.nets["inlier"].parameters()), "lr": lr}]

    def _tensors(self, s: MatchSample, keep: np.ndarray | None = None):
        xs, ys, p = (s.xs, s.ys, s.probs) if keep is None else (s.xs[keep], s.ys[keep], s.probs[keep])
        t = lambda a: torch.as_tensor(np.ascontiguousarray(a), dtype=torch.float32, device=self.device)  # noqa: E731
        return t(xs), t(ys), t(p)

    def loss(self, sample: MatchSample, rng: np.random.Generator) -> tuple[torch.Tensor, dict[str, float]]:
        net = self.nets["inlier"]
        n = len(sample.xs)
        keep = np.sort(rng.choice(n, min(MAX_MATCHES, max(3, int(n * rng.uniform(0.5, 1.0)))), replace=False))
        xs, ys, p = self._tensors(sample, keep)
        labels = torch.as_tensor(sample.residuals()[keep] < self.inlier_distance, dtype=torch.float32,
                                 device=self.device)
        gen = torch.Generator().manual_seed(int(rng.integers(2**31)))
        logits = net(xs, ys, self.voxel, p, gen, all_stages=True)
        bce = torch.stack([balanced_bce(lg, labels) for lg in logits]).mean()
        loss, l3 = bce, torch.zeros((), device=self.device)
        if float(labels.sum()) >= MIN_TRUE_INLIERS:
            w = torch.sigmoid(logits[-1])
            T = torch.as_tensor(sample.T_gt, dtype=torch.float64, device=self.device)
            R, t = weighted_procrustes(xs.double(), ys.double(), w.double())
            l3 = motion_loss(R, t, T[:3, :3], T[:3, 3]).float()
            loss = loss + l3
        with torch.no_grad():
            pred = logits[-1] > 0
            tp = float((pred & (labels > 0)).sum())
        return loss, {"bce": float(bce.detach()), "l3": float(l3.detach()), "inlier_ratio": float(labels.mean()),
                      "precision": tp / max(float(pred.sum()), 1.0), "recall": tp / max(float(labels.sum()), 1.0)}

    @torch.no_grad()
    def weights(self, sample: MatchSample) -> torch.Tensor:
        """The pipeline's weights of a sample's matches: sigmoid of the last stage, floored."""
        xs, ys, p = self._tensors(sample)
        return self.nets["inlier"].weights(xs, ys, self.voxel, p, self.weight_floor)

    @torch.no_grad()
    def validate(self, samples: list[MatchSample]) -> dict[str, float]:
        """Weighted-Procrustes recall / RE / TE (before any refinement) on samples with the right
        heading, per search (global, prior), the weights' precision, and the weight sums of right
        and wrong-heading samples (what the safeguard threshold separates)."""
        hits: dict[str, list[bool]] = {k: [] for k in ("global", "prior")}
        re_all, te_all, precision, wsum_right, wsum_wrong = [], [], [], [], []
        for s in samples:
            w = self.weights(s)
            if not s.heading_right:
                wsum_wrong.append(float(w.sum()))
                continue
            good = torch.as_tensor(s.residuals() < self.inlier_distance, device=self.device)
            wsum_right.append(float(w.sum()))
            precision.append(float((w * good).sum() / w.sum().clamp_min(1e-9)))
            xs, ys, _ = self._tensors(s)
            T = procrustes_transform(xs, ys, w)
            hit = False
            if T is not None:
                re, te = transform_errors(T[None], s.T_gt[None])
                hit = bool(re[0] < RE_THRESH_DEG and te[0] < self.te_threshold)
                if hit:
                    re_all.append(float(re[0]))
                    te_all.append(float(te[0]))
            hits.setdefault(s.search, []).append(hit)
        mean = lambda v: float(np.mean(v)) if len(v) else float("nan")  # noqa: E731
        return {"recall_global": mean(hits["global"]), "recall_prior": mean(hits["prior"]),
                "re_deg": mean(re_all), "te_m": mean(te_all), "weighted_precision": mean(precision),
                "wsum_right_p10": float(np.percentile(wsum_right, 10)) if wsum_right else 0.0,
                "wsum_wrong_p90": float(np.percentile(wsum_wrong, 90)) if wsum_wrong else 0.0}

    def save(self, path: Path, extra: dict) -> None:
        from s2h_ros.models.checkpoint import inlier_entries, write_checkpoint

        nets = extra.pop("nets")
        write_checkpoint(path, {**inlier_entries(nets["inlier"]), "voxel": self.voxel, "trainer": "inlier/context",
                                **extra})

    def load(self, data: dict) -> None:
        from s2h_ros.models.checkpoint import load_weights

        load_weights(self.nets["inlier"], data["state_dict_inlier"])


def train_context_inlier(args) -> dict:
    """``s2h train context``: train the context inlier network on ``--matches`` (``train/``, ``val/``)."""
    from s2h_ros.training.loop import init_distributed, loop_config, train
    from s2h_ros.training.match_data import load_matches

    info = init_distributed(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    train_samples = load_matches(Path(args.matches) / "train")[: args.train_pairs or None]
    val_samples = load_matches(Path(args.matches) / "val")[: args.val_pairs or None]
    torch.manual_seed(args.seed)
    task = ContextInlierTask(_initial_network(args), args.voxel, info.device, args.inlier_distance)
    return train(task, train_samples, val_samples, loop_config(args), info)


def _initial_network(args) -> ContextInlierNetwork:
    """A new network of the options' shape, or (``--init``) a copy of the context network of a
    weight file, to fine-tune (e.g. the outdoor one on indoor matches: it works in voxel units)."""
    if args.init:
        from s2h_ros.models.checkpoint import load_inlier

        net = load_inlier(args.init)
        if not isinstance(net, ContextInlierNetwork):
            raise ValueError(f"--init {args.init}: its inlier network is not the context network")
        return net.train()
    return ContextInlierNetwork(ContextInlierConfig(channels=args.channels, blocks=args.blocks, stages=args.stages,
                                                    anchors=args.anchors, first_anchors=args.first_anchors))
