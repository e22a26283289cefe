"""A pointwise inlier network over correspondences: context normalisation and rigid-length consistency.

DGR's 6-D sparse ResUNet (``models.inlier``) stays available and official DGR checkpoints load
into it, but measured here it is a poor fit for the product: 8.8 M parameters (35 MB) in its
compact form, 0.55-0.83 s per pair on the CPU, and after 45-minute CPU runs no better than RANSAC
on the S2H matches (docs/training.md). Its input is the 6-D coordinate of a correspondence, so a
pair at another relative heading is another input it must have seen in training.

This network weighs the same correspondences with what a rigid motion preserves. For two true
correspondences ``i``, ``a`` the lengths ``||x_i - x_a||`` and ``||y_i - y_a||`` are equal (up to
noise), whatever the rotation and translation; for an outlier they almost never are. Each stage
scores every correspondence against a set of anchor correspondences with the kernel
``k(c) = exp(-c^2 / (2 tau^2))`` of ``c_ia = | ||x_i - x_a|| - ||y_i - y_a|| |`` at three ``tau``
(1, 2, 4 voxels), averaged over the anchors:

- stage 1: random anchors (uniform), next to per-correspondence inputs that are invariant to a
  rotation about z and a translation of either cloud: the horizontal distance and the height of
  ``x_i`` from the matched source points' centroid, the same for ``y_i`` (in units of
  ``SCALE_VOXELS`` voxels), and the S-step probability ``p_i``;
- stage s > 1: anchors are the ``anchors`` correspondences stage s - 1 trusts most, each weighted
  by its stage s - 1 probability (a learned step of spectral matching's power iteration: inliers
  agree with trusted inliers, outliers do not), next to stage s - 1's hidden features.

Each stage is a stack of PointCN blocks (pointwise linear -> context normalisation, i.e. each
channel normalised over the N correspondences of the pair -> ReLU, residual) with one logit per
correspondence. Every input is invariant to the relative heading, so a turned pair needs no
augmentation; the cost is O(N x anchors) for the consistency and O(N C^2) for the blocks
(a few ms for thousands of matches). Written here because no maintained library ships a
correspondence-weighting network for torch.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
from torch import nn

SCALE_VOXELS = 64.0  # geometric inputs are divided by this many voxels (19.2 m at 0.3 m)
TAUS_VOXELS = (1.0, 2.0, 4.0)  # consistency kernel widths
CONSISTENCY_ROWS = 2048  # correspondences per block of the consistency terms on a CPU (fastest of 256-8,000)


@dataclass
class ContextInlierConfig:
    channels: int = 64
    blocks: int = 4  # PointCN blocks per stage
    stages: int = 2
    anchors: int = 256  # anchor correspondences per stage
    first_anchors: str = "random"  # stage 1 anchors: "random" (uniform) or "probability" (highest S-step p)
    taus: list[float] = field(default_factory=lambda: list(TAUS_VOXELS))

    def to_dict(self) -> dict:
        return asdict(self)


class _ContextNorm(nn.Module):
    """Each channel normalised over the correspondences of the pair, then a learned affine."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # (N, C)
        # Two passes (mean, then the mean square of the centred values): the same statistics as
        # torch.var_mean over dim 0, which on the CPU took 6x as long (4,000 x 32: 0.97 vs 0.16 ms).
        centred = h - h.mean(0, keepdim=True)
        var = (centred * centred).mean(0, keepdim=True)
        return centred * (self.weight / var.add(1e-5).sqrt()) + self.bias


class _PointCNBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(channels, channels), _ContextNorm(channels), nn.ReLU(),
                                  nn.Linear(channels, channels), _ContextNorm(channels))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return torch.relu(h + self.body(h))


class _Stage(nn.Module):
    def __init__(self, in_channels: int, cfg: ContextInlierConfig) -> None:
        super().__init__()
        self.inp = nn.Linear(in_channels, cfg.channels)
        self.blocks = nn.Sequential(*[_PointCNBlock(cfg.channels) for _ in range(cfg.blocks)])
        self.out = nn.Linear(cfg.channels, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.blocks(self.inp(x))
        return h, self.out(h)[:, 0]


def length_consistency(xs: torch.Tensor, ys: torch.Tensor, anchors: torch.Tensor, anchor_weights: torch.Tensor,
                       taus: torch.Tensor) -> torch.Tensor:
    """``(N, len(taus))``: for each correspondence the anchor-weighted mean of
    ``exp(-c^2 / (2 tau^2))``, ``c = | ||x_i - x_a|| - ||y_i - y_a|| |`` (``anchors (A,)`` int64 rows,
    ``anchor_weights (A,)`` >= 0).

    On a CPU the ``(N, A)`` terms are made ``CONSISTENCY_ROWS`` correspondences at a time: each
    elementwise pass then stays in the core's cache, where over all N at once every one of the
    dozen passes went to memory (measured on the 2-core VM, N = 8,000, A = 256: 12 against 28 ms a
    call, the same values to the last bit). A GPU takes them in one block. Where no gradient is
    asked for (inference), the passes overwrite their input instead of allocating another
    ``(rows, A)`` block (a fifth less time, the same values)."""
    # cdist's matrix-product form: on centred voxel coordinates its float32 rounding stays far below
    # the narrowest kernel (measured: validation metrics equal to 6 digits with the exact form, 3x faster).
    xa, ya = xs[anchors], ys[anchors]
    w = anchor_weights / anchor_weights.sum().clamp_min(1e-9)
    widths = [float(t) for t in taus]
    in_place = not (torch.is_grad_enabled() and any(t.requires_grad for t in (xs, ys, anchor_weights)))
    n = xs.shape[0]
    rows = max(n, 1) if xs.device.type != "cpu" else CONSISTENCY_ROWS
    blocks = []
    for start in range(0, max(n, 1), rows):  # no correspondence: one empty block, (0, len(taus))
        c = torch.cdist(xs[start:start + rows], xa) - torch.cdist(ys[start:start + rows], ya)
        c2 = c.mul_(c) if in_place else c * c  # (rows, A)
        blocks.append(torch.stack(_kernel_means(c2, widths, w, in_place), 1))
    return torch.cat(blocks) if len(blocks) != 1 else blocks[0]


def _kernel_means(c2: torch.Tensor, taus: list[float], w: torch.Tensor, in_place: bool) -> list[torch.Tensor]:
    """``exp(-c2 / (2 tau^2)) @ w`` ``(rows,)`` for each tau, in the order given (``c2 (rows, A)``;
    with ``in_place`` the kernels overwrite the block they come from). exp is the forward pass's
    largest cost on a CPU (measured: 58 % of it), so a tau half the previous one is that kernel to
    the 4th power (two squarings) instead of another exp; the exponent is clamped above float32's
    denormals (their slow path doubled exp's time here)."""
    order = sorted(set(taus), reverse=True)
    halving = all(b * 2.0 == a for a, b in zip(order, order[1:]))  # then c2 is needed for the first kernel only
    means: dict[float, torch.Tensor] = {}
    k = None
    for i, tau in enumerate(order):
        if i and tau * 2.0 == order[i - 1]:
            squared = k.mul_(k) if in_place else k * k
            k = squared.mul_(squared) if in_place else squared * squared
        elif in_place and halving:
            k = c2.mul_(-0.5 / tau ** 2).clamp_min_(-80.0).exp_()
        else:
            k = torch.exp((c2 * (-0.5 / tau ** 2)).clamp_min(-80.0))
        means[tau] = k @ w
    return [means[t] for t in taus]


class ContextInlierNetwork(nn.Module):
    """``(x_src (N, 3), x_tgt (N, 3), p (N,))`` -> ``(N,)`` inlier logits (the last stage's)."""

    kind = "context"

    def __init__(self, config: ContextInlierConfig | dict | None = None) -> None:
        super().__init__()
        if isinstance(config, dict):
            config = ContextInlierConfig(**config)
        self.config = config = config or ContextInlierConfig()
        if (config.stages < 1 or config.blocks < 1 or config.anchors < 1 or not config.taus
                or config.first_anchors not in ("random", "probability")):
            raise ValueError(f"invalid context inlier configuration {config}")
        n_tau = len(config.taus)
        self.stages = nn.ModuleList(
            [_Stage(5 + n_tau, config)] + [_Stage(config.channels + n_tau, config) for _ in range(config.stages - 1)])

    @staticmethod
    def _local_inputs(xs: torch.Tensor, ys: torch.Tensor, probs: torch.Tensor, scale: float) -> torch.Tensor:
        """``(N, 5)``: horizontal distance and height of each side from its centroid (``xs``, ``ys``
        come centred), divided by ``scale``, and p."""
        cols = []
        for pts in (xs, ys):
            rel = pts / scale
            cols += [rel[:, :2].norm(dim=1), rel[:, 2]]
        return torch.stack(cols + [probs], 1)

    def forward_all(self, src_xyz: torch.Tensor, tgt_xyz: torch.Tensor, voxel: float,
                    probs: torch.Tensor | None = None, generator: torch.Generator | None = None) -> list[torch.Tensor]:
        """Every stage's ``(N,)`` logits (deep supervision trains them all). Anchors of stage 1 are
        a random subset drawn with ``generator`` (default: a fixed seed, so inference is
        deterministic)."""
        device = self.stages[0].inp.weight.device
        xs = torch.as_tensor(src_xyz, dtype=torch.float32, device=device)
        ys = torch.as_tensor(tgt_xyz, dtype=torch.float32, device=device)
        if xs.ndim != 2 or xs.shape[1] != 3 or xs.shape != ys.shape:
            raise ValueError(f"correspondences must be two (N, 3) arrays, got {tuple(xs.shape)} and {tuple(ys.shape)}")
        n = xs.shape[0]
        p = torch.ones(n, device=device) if probs is None else torch.as_tensor(probs, dtype=torch.float32, device=device)
        if n == 0:
            return [xs.new_zeros(0) for _ in self.stages]
        cfg = self.config
        # Each side centred on its centroid, in voxels.
        xs = (xs - xs.mean(0, keepdim=True)) / voxel
        ys = (ys - ys.mean(0, keepdim=True)) / voxel
        taus = torch.as_tensor(cfg.taus, dtype=torch.float32, device=device)
        a = min(cfg.anchors, n)
        if generator is None:
            generator = torch.Generator().manual_seed(0)
        if cfg.first_anchors == "probability":
            anchors = torch.topk(p, a).indices
        else:
            anchors = torch.randperm(n, generator=generator)[:a].to(device)
        consistency = length_consistency(xs, ys, anchors, torch.ones(a, device=device), taus)
        h, logit = self.stages[0](torch.cat([self._local_inputs(xs, ys, p, SCALE_VOXELS), consistency], 1))
        logits = [logit]
        for stage in self.stages[1:]:
            trust = torch.sigmoid(logit)
            anchors = torch.topk(trust.detach(), a).indices
            consistency = length_consistency(xs, ys, anchors, trust[anchors], taus)
            h, logit = stage(torch.cat([h, consistency], 1))
            logits.append(logit)
        return logits

    def forward(self, src_xyz, tgt_xyz, voxel: float, probs=None, generator: torch.Generator | None = None,
                all_stages: bool = False):
        """The last stage's ``(N,)`` logits, or every stage's list with ``all_stages``."""
        logits = self.forward_all(src_xyz, tgt_xyz, voxel, probs, generator)
        return logits if all_stages else logits[-1]

    def weights(self, src_xyz, tgt_xyz, voxel: float, probs=None, threshold: float = 0.05) -> torch.Tensor:
        """Inlier weights as DGR's network gives them (``InlierNetwork.weights``): sigmoid of the
        last stage's logits, zeroed below ``threshold``."""
        w = torch.sigmoid(self(src_xyz, tgt_xyz, voxel, probs))
        return torch.where(w < threshold, torch.zeros_like(w), w)
