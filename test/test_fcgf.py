"""FCGF ResUNet: official KITTI preset has the official parameter names and shapes, the compact
preset is small, features are unit-norm per voxel on real KITTI data, deterministic for a seed,
and trainable (gradients reach every weight)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from s2h_ros import paths
from s2h_ros.models import build_fcgf, extract_features
from s2h_ros.models.fcgf import PRESETS
from s2h_ros.sparse import SparseTensor

OFFICIAL_SHAPES = {  # from the official ResUNetBN2C KITTI checkpoint
    "conv1.kernel": (125, 1, 32),
    "norm1.bn.weight": (32,),
    "norm1.bn.running_mean": (32,),
    "block1.conv1.kernel": (27, 32, 32),
    "block1.norm2.bn.running_var": (32,),
    "conv2.kernel": (27, 32, 64),
    "conv4.kernel": (27, 128, 256),
    "conv4_tr.kernel": (27, 256, 128),
    "conv3_tr.kernel": (27, 256, 64),
    "conv2_tr.kernel": (27, 128, 64),
    "block2_tr.conv2.kernel": (27, 64, 64),
    "conv1_tr.kernel": (96, 64),
    "final.kernel": (64, 32),
    "final.bias": (1, 32),
}


@pytest.fixture(scope="module")
def kitti_xyz() -> np.ndarray:
    """A real KITTI scan (bundled sample), cropped to 15 m to keep the test fast."""
    pts = np.fromfile(paths.KITTI_LOOP_PAIR[0], dtype=np.float32).reshape(-1, 6)[:, :3]
    return pts[np.linalg.norm(pts[:, :2], axis=1) < 15.0]


def test_kitti_preset_has_official_parameter_names_and_shapes():
    with torch.device("meta"):  # shapes only
        state = build_fcgf("kitti").state_dict()
    for key, shape in OFFICIAL_SHAPES.items():
        assert tuple(state[key].shape) == shape, key
    assert not [k for k in state if k.startswith(("net.", "module."))]


def test_compact_preset_is_small_enough_to_ship():
    compact = sum(v.numel() * v.element_size() for v in build_fcgf("compact").state_dict().values())
    with torch.device("meta"):
        official = sum(v.numel() * v.element_size() for v in build_fcgf("kitti").state_dict().values())
    assert compact < 6e6 < official


def test_features_are_unit_norm_and_aligned_with_voxels(kitti_xyz):
    torch.manual_seed(0)
    model = build_fcgf("compact").eval()
    xyz, feats = extract_features(model, torch.from_numpy(kitti_xyz), 0.3)
    voxels = np.unique(np.floor(kitti_xyz / 0.3), axis=0)
    assert xyz.shape == (len(voxels), 3) and feats.shape == (len(voxels), 32)
    assert torch.allclose(feats.norm(dim=1), torch.ones(len(feats)), atol=1e-5)
    # every returned point is an input point, one per voxel, in the row order of the model input
    x = SparseTensor.from_points(kitti_xyz, 0.3)
    assert torch.equal(torch.floor(xyz / 0.3).long(), x.coords[:, 1:])
    with torch.no_grad():  # extract_features runs the folded copy: equal up to float rounding
        assert torch.allclose(model(x).feats, feats, atol=1e-5)
    xyz_np, feats_np_input = extract_features(model, kitti_xyz, 0.3)  # numpy in -> numpy points out
    assert isinstance(xyz_np, np.ndarray) and np.array_equal(xyz_np, xyz.numpy())
    assert torch.equal(feats_np_input, feats)


def test_same_seed_gives_identical_model_and_features(kitti_xyz):
    outs = []
    for _ in range(2):
        torch.manual_seed(3)
        outs.append(extract_features(build_fcgf("compact"), kitti_xyz[:3000], 0.3)[1])
    assert torch.equal(outs[0], outs[1])
    torch.manual_seed(4)
    assert not torch.equal(outs[0], extract_features(build_fcgf("compact"), kitti_xyz[:3000], 0.3)[1])


def test_gradients_reach_every_weight(kitti_xyz):
    torch.manual_seed(0)
    model = build_fcgf("compact").train()
    out = model(SparseTensor.from_points(kitti_xyz[:4000], 0.3))
    (out.feats[:, 0] - out.feats[:, 1]).square().mean().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


def test_bad_inputs_and_presets_raise():
    model = build_fcgf("compact")
    with pytest.raises(ValueError, match="empty"):
        extract_features(model, np.zeros((0, 3), np.float32), 0.3)
    with pytest.raises(ValueError, match="shape"):
        extract_features(model, np.zeros((10, 4), np.float32), 0.3)
    with pytest.raises(ValueError, match="unknown FCGF preset"):
        build_fcgf("huge")
    assert set(PRESETS) >= {"kitti", "compact"}


def _with_batchnorm_statistics(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every BatchNorm given running statistics and an affine map far from the identity, so that
    folding them is not a no-op."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm1d):
            n = m.num_features
            m.running_mean.copy_(torch.randn(n, generator=g))
            m.running_var.copy_(torch.rand(n, generator=g) * 3 + 0.1)
            m.weight.data.copy_(torch.randn(n, generator=g))
            m.bias.data.copy_(torch.randn(n, generator=g))
    return model.eval()


def test_folded_copy_computes_the_same_features_without_batchnorm_passes(kitti_xyz):
    torch.manual_seed(0)
    model = _with_batchnorm_statistics(build_fcgf("compact"), 1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    folded = model.folded()
    x = SparseTensor.from_points(kitti_xyz, 0.3)
    with torch.no_grad():
        want, got = model(x).feats, folded(SparseTensor.from_points(kitti_xyz, 0.3)).feats
    assert not any(isinstance(m, torch.nn.BatchNorm1d) for m in folded.modules())
    assert torch.allclose(got, want, atol=1e-5)
    assert (got - want).abs().max() < 1e-3 * want.abs().max()
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())  # the original untouched


def test_extract_features_folds_the_weights_again_after_they_change(kitti_xyz):
    torch.manual_seed(0)
    model = _with_batchnorm_statistics(build_fcgf("compact"), 1)
    _, first = extract_features(model, kitti_xyz, 0.3)
    _with_batchnorm_statistics(model, 2)  # new statistics in place, as a training step would leave
    _, second = extract_features(model, kitti_xyz, 0.3)
    with torch.no_grad():
        want = model(SparseTensor.from_points(kitti_xyz, 0.3)).feats
    assert not torch.allclose(first, second, atol=1e-3)
    assert torch.allclose(second, want, atol=1e-5)
