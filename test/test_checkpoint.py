"""Checkpoint I/O: our round trip, official FCGF / DGR file layouts (EasyDict config, numpy
scalars, no num_batches_tracked), weights_only safety, and errors naming the bad keys."""
from __future__ import annotations

import os
import sys
import types

import numpy as np
import pytest
import torch

from s2h_ros.models import (
    CheckpointError,
    InlierNetwork,
    build_fcgf,
    load_dgr,
    load_fcgf,
    load_inlier,
    load_registration_models,
    load_weights,
    read_checkpoint,
    save_checkpoint,
)
from s2h_ros.sparse import SparseTensor


@pytest.fixture
def cloud(rng) -> torch.Tensor:
    return torch.from_numpy(rng.uniform(-6, 6, (2000, 3))).float()


def _trained_like(model):
    """Non-default BatchNorm statistics so that a load that silently skipped them would show."""
    for name, buf in model.named_buffers():
        if name.endswith(("running_mean", "running_var")):
            buf.copy_(torch.rand_like(buf) + 0.5)
    return model.eval()


@pytest.fixture
def easydict_module(monkeypatch):
    """An ``easydict`` module as the official training scripts had it, to write files like theirs."""
    module = types.ModuleType("easydict")

    class EasyDict(dict):
        def __init__(self, d=None):
            super().__init__(d or {})
            for k, v in (d or {}).items():
                setattr(self, k, v)

    EasyDict.__module__ = "easydict"
    EasyDict.__qualname__ = "EasyDict"
    module.EasyDict = EasyDict
    monkeypatch.setitem(sys.modules, "easydict", module)
    return module


def _official_file(path, easydict_module, state, **extra):
    config = easydict_module.EasyDict({"model": "ResUNetBN2C", "voxel_size": 0.3, "conv1_kernel_size": 5})
    torch.save({"epoch": 100, "state_dict": state, "config": config, "best_val": np.float64(0.92), **extra}, path)
    del sys.modules["easydict"]  # the reader must not need easydict installed


def test_own_checkpoint_round_trips_exactly(tmp_path, cloud):
    torch.manual_seed(0)
    model = _trained_like(build_fcgf("compact"))
    path = save_checkpoint(tmp_path / "fcgf.pt", model, epoch=3)
    loaded = load_fcgf(path)
    assert loaded.config == model.config
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    with torch.no_grad():
        a = model(SparseTensor.from_points(cloud, 0.3)).feats
        b = loaded(SparseTensor.from_points(cloud, 0.3)).feats
    assert torch.equal(a, b)
    assert read_checkpoint(path)["epoch"] == 3


def test_official_fcgf_file_loads_with_shape_read_off_the_weights(tmp_path, easydict_module):
    torch.manual_seed(1)
    official = _trained_like(build_fcgf("kitti"))
    state = {k: v for k, v in official.state_dict().items() if not k.endswith("num_batches_tracked")}
    _official_file(tmp_path / "KITTI-v0.3-ResUNetBN2C-conv1-5-nout32.pth", easydict_module, state,
                   optimizer={"state": {}, "param_groups": [{"lr": 0.1, "params": [0, 1]}]})
    loaded = load_fcgf(tmp_path / "KITTI-v0.3-ResUNetBN2C-conv1-5-nout32.pth")
    assert loaded.config.conv1_kernel_size == 5 and loaded.config.channels == [32, 64, 128, 256]
    assert loaded.config.tr_channels == [64, 64, 64, 128] and loaded.config.normalize
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in state.items())
    config = read_checkpoint(tmp_path / "KITTI-v0.3-ResUNetBN2C-conv1-5-nout32.pth")["config"]
    assert config["voxel_size"] == 0.3


def test_official_dgr_file_loads_both_networks(tmp_path, easydict_module):
    torch.manual_seed(2)
    fcgf = _trained_like(build_fcgf("compact"))
    inlier = _trained_like(InlierNetwork("compact"))
    _official_file(tmp_path / "dgr.pth", easydict_module, fcgf.state_dict(),
                   state_dict_inlier={f"module.{k}": v for k, v in inlier.state_dict().items()})
    f, g = load_dgr(tmp_path / "dgr.pth")
    assert g.config.dim == 6 and g.config.conv1_kernel_size == 3 and not g.config.normalize
    assert torch.equal(f.final.kernel, fcgf.final.kernel) and torch.equal(g.conv1.kernel, inlier.conv1.kernel)
    assert torch.equal(load_inlier(tmp_path / "dgr.pth").final.bias, inlier.final.bias)
    with pytest.raises(CheckpointError, match="not a DGR checkpoint"):
        load_dgr(save_checkpoint(tmp_path / "plain.pt", fcgf))


def test_registration_models_come_from_one_trainer_file(tmp_path):
    torch.manual_seed(3)
    fcgf, inlier = _trained_like(build_fcgf("compact")), _trained_like(InlierNetwork("compact"))
    torch.save({"state_dict": fcgf.state_dict(), "state_dict_inlier": inlier.state_dict(),
                "fcgf_config": fcgf.config.to_dict(), "inlier_config": inlier.config.to_dict(), "voxel": 0.3},
               tmp_path / "trained.pt")
    models = load_registration_models(tmp_path / "trained.pt")
    assert models.voxel == 0.3 and models.inlier is not None
    assert torch.equal(models.inlier.final.kernel, inlier.final.kernel)
    assert torch.equal(models.fcgf.conv1.kernel, fcgf.conv1.kernel)
    only_fcgf = load_registration_models(save_checkpoint(tmp_path / "fcgf.pt", fcgf))
    assert only_fcgf.inlier is None and only_fcgf.voxel is None


def test_mismatched_weights_name_missing_unexpected_and_misshaped_keys():
    model = build_fcgf("compact")
    state = dict(model.state_dict())
    del state["block2.conv1.kernel"]
    state["extra.weight"] = torch.zeros(3)
    state["final.kernel"] = torch.zeros(32, 16)
    with pytest.raises(CheckpointError) as err:
        load_weights(model, state)
    text = str(err.value)
    assert "missing keys: block2.conv1.kernel" in text
    assert "unexpected keys: extra.weight" in text
    assert "final.kernel: file [32, 16] vs model [32, 32]" in text


def test_missing_corrupt_and_foreign_files_raise(tmp_path):
    with pytest.raises(FileNotFoundError, match="checkpoint not found"):
        read_checkpoint(tmp_path / "nope.pth")
    (tmp_path / "bad.pth").write_bytes(b"this is not a torch file")
    with pytest.raises(CheckpointError, match="cannot read checkpoint"):
        read_checkpoint(tmp_path / "bad.pth")
    torch.save([1, 2, 3], tmp_path / "list.pth")
    with pytest.raises(CheckpointError, match="expected a dict"):
        read_checkpoint(tmp_path / "list.pth")
    torch.save({"state_dict": {"conv1.kernel": torch.zeros(27, 1, 8)}}, tmp_path / "partial.pth")
    with pytest.raises(CheckpointError, match="final.kernel"):
        load_fcgf(tmp_path / "partial.pth")


class _Payload:
    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return (os.system, (f"touch {self.target}",))


def test_files_that_would_run_code_are_refused(tmp_path):
    marker = tmp_path / "pwned"
    torch.save({"state_dict": {}, "config": _Payload(marker)}, tmp_path / "evil.pth")
    with pytest.raises(CheckpointError, match="cannot read checkpoint"):
        read_checkpoint(tmp_path / "evil.pth")
    assert not marker.exists()
