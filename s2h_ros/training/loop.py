"""The training loop shared by the FCGF and inlier trainers.

Seeds, one pair per step and process, Adam, compact progress lines, a checkpoint every N steps
(written by rank 0 only) that ``--resume`` continues exactly, a weights-only copy at the end, a validation split, a wall-clock
budget (``max_minutes``) that stops cleanly with the checkpoint written, and PyTorch DDP when
launched by ``torchrun`` (process group from the environment: gloo on CPU, nccl on CUDA).

Randomness is a pure function of ``(seed, step, rank)``: the data order is DistributedSampler's
(a seeded permutation per epoch, padded to a multiple of the world size, every rank taking every
world-th item), and each step draws from ``np.random.default_rng([seed, step, rank])``. So a run
resumed from a checkpoint sees the same data and samples as an uninterrupted one.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from s2h_ros.training.data import CachedPair


@dataclass
class LoopConfig:
    """How long and how to train; the trainers fill it from the command line."""

    out: Path
    steps: int = 1000
    lr: float = 1e-3
    device: str = "cpu"
    seed: int = 0
    resume: bool = False
    max_minutes: float = 0.0  # 0: no limit
    checkpoint_every: int = 200
    val_every: int = 500  # 0: validate only at the end
    log_every: int = 25
    lr_schedule: str = "constant"  # or "cosine": lr x (1 + cos(pi step / steps)) / 2, also across --resume


class TrainTask(Protocol):
    """What a trainer plugs into the loop."""

    nets: dict[str, nn.Module]  # trainable networks; the loop wraps them in DDP in place

    def param_groups(self, lr: float) -> list[dict]: ...

    def loss(self, pair: CachedPair, rng: np.random.Generator) -> tuple[torch.Tensor, dict[str, float]]:
        """Scalar loss of one pair (always through the nets, so DDP sees every parameter) and logs."""
        ...

    def validate(self, pairs: list[CachedPair]) -> dict[str, float]: ...

    def save(self, path: Path, extra: dict) -> None: ...

    def load(self, data: dict) -> None: ...


# ------------------------------------------------------------------------------ distributed


@dataclass
class DistInfo:
    """This process's place in the job (rank 0 of 1 without torchrun)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world_size > 1


def init_distributed(device: str) -> DistInfo:
    """Join the torchrun process group when ``WORLD_SIZE`` > 1; ``cuda`` means this rank's GPU."""
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device {device!r} requested but CUDA is not available")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo(device=dev)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if dev.type == "cuda":
        dev = torch.device("cuda", local if dev.index is None else dev.index)
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
    return DistInfo(dist.get_rank(), dist.get_world_size(), local, dev)


def sample_index(step: int, n: int, seed: int, rank: int = 0, world_size: int = 1) -> int:
    """Index of the pair that ``rank`` trains on at ``step`` (DistributedSampler's order, shuffled per epoch)."""
    per_rank = math.ceil(n / world_size)
    epoch, pos = divmod(step, per_rank)
    perm = np.random.default_rng([seed, epoch]).permutation(n)
    perm = np.resize(perm, per_rank * world_size)  # pad by wrapping around, as DistributedSampler does
    return int(perm[rank::world_size][pos])


def step_rng(seed: int, step: int, rank: int) -> np.random.Generator:
    """The random stream of one step of one rank."""
    return np.random.default_rng([seed, step, rank, 1])


def unwrap(net: nn.Module) -> nn.Module:
    """The network inside a DDP wrapper (validation and saving must not run DDP's collectives)."""
    return net.module if isinstance(net, nn.parallel.DistributedDataParallel) else net


def _agree(flag: bool, info: DistInfo) -> bool:
    """True on every rank when any rank says True (so all ranks stop at the same step)."""
    if not info.active:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=info.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


# ------------------------------------------------------------------------------------ loop


def _log(msg: str) -> None:
    from tqdm import tqdm

    tqdm.write(msg)


def train(task: TrainTask, train_pairs: list[CachedPair], val_pairs: list[CachedPair],
          cfg: LoopConfig, info: DistInfo) -> dict:
    """Run ``cfg.steps`` steps of ``task``; returns the summary (also stored in the checkpoint)."""
    from tqdm import tqdm

    if not train_pairs:
        raise ValueError("no training pairs")
    torch.manual_seed(cfg.seed)
    optimizer = torch.optim.Adam(task.param_groups(cfg.lr))
    base_lrs = [g["lr"] for g in optimizer.param_groups]  # before a resumed state overwrites them
    start, history = 0, []
    if cfg.resume and Path(cfg.out).is_file():
        from s2h_ros.models.checkpoint import read_checkpoint

        data = read_checkpoint(cfg.out)
        state = data.get("train_state")
        if state is not None:
            task.load(data)
            optimizer.load_state_dict(state["optimizer"])
            start, history = int(state["step"]), list(state.get("history", []))
            if info.is_main:
                _log(f"resumed from {cfg.out} at step {start}")
    if info.active:
        for name, net in task.nets.items():
            ids = [info.device.index] if info.device.type == "cuda" else None
            task.nets[name] = nn.parallel.DistributedDataParallel(net, device_ids=ids)

    def checkpoint(step: int) -> None:
        if info.is_main:
            nets = {k: unwrap(v) for k, v in task.nets.items()}
            task.save(cfg.out, {"train_state": {"step": step, "optimizer": optimizer.state_dict(),
                                                "history": history, "seed": cfg.seed,
                                                "world_size": info.world_size}, "nets": nets})
        if info.active:
            dist.barrier()

    def validate(step: int) -> None:
        if info.is_main and val_pairs:
            for net in task.nets.values():
                net.eval()
            t = time.perf_counter()
            metrics = task.validate(val_pairs)
            metrics["seconds"] = round(time.perf_counter() - t, 1)
            history.append({"step": step, **{k: round(float(v), 4) for k, v in metrics.items()}})
            _log(f"val step {step}: " + " ".join(f"{k} {v:.4g}" for k, v in metrics.items()))
        if info.active:
            dist.barrier()

    t0 = time.perf_counter()
    budget = cfg.max_minutes * 60.0 if cfg.max_minutes > 0 else math.inf
    val_cost = 0.0
    window: dict[str, list[float]] = {}
    step = start
    bar = tqdm(total=cfg.steps, initial=start, disable=None if info.is_main else True, mininterval=2,
               dynamic_ncols=True, leave=False)
    while step < cfg.steps:
        elapsed = time.perf_counter() - t0
        per_step = elapsed / max(step - start, 1)
        if _agree(elapsed + per_step + val_cost > budget, info):
            if info.is_main:
                _log(f"stopping at step {step}: {cfg.max_minutes} min budget reached")
            break
        for net in task.nets.values():
            net.train()
        idx = sample_index(step, len(train_pairs), cfg.seed, info.rank, info.world_size)
        loss, logs = task.loss(train_pairs[idx], step_rng(cfg.seed, step, info.rank))
        factor = 0.5 * (1.0 + math.cos(math.pi * step / cfg.steps)) if cfg.lr_schedule == "cosine" else 1.0
        for group, base in zip(optimizer.param_groups, base_lrs):
            group["lr"] = base * factor
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        step += 1
        bar.update(1)
        for k, v in {"loss": float(loss.detach()), **logs}.items():
            window.setdefault(k, []).append(v)
        if info.is_main and (step % cfg.log_every == 0 or step == cfg.steps):
            rate = (step - start) / max(time.perf_counter() - t0, 1e-9)
            _log(f"step {step}/{cfg.steps} " + " ".join(f"{k} {np.mean(v):.4f}" for k, v in window.items())
                 + f" | {rate:.2f} it/s")
            history.append({"step": step, **{k: round(float(np.mean(v)), 5) for k, v in window.items()}})
            window = {}
        if cfg.val_every and step % cfg.val_every == 0 and step < cfg.steps:
            tv = time.perf_counter()
            validate(step)
            val_cost = time.perf_counter() - tv
        if step % cfg.checkpoint_every == 0:
            checkpoint(step)
    bar.close()
    validate(step)
    checkpoint(step)
    if info.is_main:  # the same weights without the optimiser state (a third of the size), for shipping
        task.save(weights_path(cfg.out), {"nets": {k: unwrap(v) for k, v in task.nets.items()}, "steps": step})
    summary = {"steps": step, "minutes": round((time.perf_counter() - t0) / 60.0, 2),
               "history": history, "out": str(cfg.out)}
    if info.is_main:
        _log(f"done: step {step}, {summary['minutes']} min, checkpoint {cfg.out}")
    return summary


def weights_path(out: Path) -> Path:
    """Where the final weights-only file goes: ``run.pt`` -> ``run.weights.pt``."""
    out = Path(out)
    return out.with_name(out.stem + ".weights" + out.suffix)


def loop_config(args) -> LoopConfig:
    """The loop options of ``s2h train fcgf|inlier``."""
    return LoopConfig(out=Path(args.out), steps=args.steps, lr=args.lr, device=args.device, seed=args.seed,
                      resume=args.resume, max_minutes=args.max_minutes, checkpoint_every=args.checkpoint_every,
                      val_every=args.val_every, log_every=args.log_every,
                      lr_schedule=args.lr_schedule)


def load_splits(args, info: DistInfo) -> tuple[list[CachedPair], list[CachedPair], float]:
    """Training and validation pairs of ``--data`` and the cache's voxel size."""
    from s2h_ros.training.data import open_split

    if args.threads:
        torch.set_num_threads(args.threads)
    train_cache = open_split(args.data, "train", args.train_pairs or None)
    val_cache = open_split(args.data, "val", args.val_pairs or None)
    val = val_cache.pairs if val_cache is not None else []
    if info.is_main:
        _log(f"data: {len(train_cache)} training pairs, {len(val)} validation pairs, voxel {train_cache.voxel} m, "
             f"{info.world_size} process(es) on {info.device}")
    return train_cache.pairs, val, train_cache.voxel


def run(args, make_task: Callable[[torch.device, float], TrainTask]) -> dict:
    """What ``s2h train fcgf|inlier`` share: join the process group, load ``--data``, seed the initial
    weights (the same on every rank), build the task for ``(device, cache voxel)`` and train it."""
    info = init_distributed(args.device)
    train_pairs, val_pairs, voxel = load_splits(args, info)
    torch.manual_seed(args.seed)
    return train(make_task(info.device, voxel), train_pairs, val_pairs, loop_config(args), info)
