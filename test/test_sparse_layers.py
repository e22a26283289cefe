"""Sparse layers: BatchNorm, ReLU, 1x1 linear, residual block, skip concatenation, global pooling,
MinkowskiEngine parameter layout, any dimension D, and the same results on CUDA."""
from __future__ import annotations


import numpy as np
import pytest
import torch

from s2h_ros.sparse import (
    BasicBlock,
    BatchNorm,
    Conv,
    ConvTranspose,
    GlobalPooling,
    SparseTensor,
    cat,
    relu,
)


@pytest.fixture
def cloud(rng) -> torch.Tensor:
    return torch.from_numpy(rng.uniform(0, 4, (1500, 3))).float()


def test_parameters_use_minkowski_names_and_shapes():
    assert Conv(4, 8, 3).kernel.shape == (27, 4, 8)
    assert Conv(4, 8, 5).kernel.shape == (125, 4, 8)
    assert Conv(4, 8, 3, dim=6).kernel.shape == (729, 4, 8)
    linear = Conv(4, 8, 1, bias=True)
    assert linear.kernel.shape == (4, 8) and linear.bias.shape == (1, 8)
    assert ConvTranspose(8, 4, 3, 2).kernel.shape == (27, 8, 4)
    keys = set(BasicBlock(8).state_dict())
    assert {"conv1.kernel", "norm1.bn.weight", "norm1.bn.running_var", "conv2.kernel", "norm2.bn.bias"} <= keys


def test_one_by_one_conv_is_a_linear_layer(cloud):
    x = SparseTensor.from_points(cloud, 0.3, feats=torch.randn(len(cloud), 4))
    layer = Conv(4, 3, 1, bias=True)
    torch.nn.init.normal_(layer.bias)
    y = layer(x)
    assert torch.equal(y.coords, x.coords)
    assert torch.allclose(y.feats, x.feats @ layer.kernel + layer.bias, atol=1e-6)  # one fused addmm


def test_batchnorm_and_relu_act_on_features_only(cloud):
    x = SparseTensor.from_points(cloud, 0.3, feats=torch.randn(len(cloud), 5) * 3 + 1)
    bn = BatchNorm(5).train()
    y = bn(x)
    assert torch.allclose(y.feats.mean(0), torch.zeros(5), atol=1e-5)
    assert torch.allclose(y.feats.std(0, unbiased=False), torch.ones(5), atol=1e-3)
    r = relu(x)
    assert torch.equal(r.feats, x.feats.clamp_min(0)) and r.coords is x.coords


def test_batchnorm_trains_on_a_single_voxel_with_running_statistics():
    x = SparseTensor.from_points(torch.zeros(1, 3), 0.3, feats=torch.tensor([[2.0, -1.0]]))
    bn = BatchNorm(2).train()
    y = bn(x)
    assert torch.allclose(y.feats, x.feats / torch.sqrt(torch.tensor(1.0 + bn.bn.eps)))
    y.feats.sum().backward()
    assert bn.bn.weight.grad is not None


def test_basic_block_is_identity_plus_relu_when_second_conv_is_zero(cloud):
    x = SparseTensor.from_points(cloud, 0.3, feats=torch.randn(len(cloud), 6))
    block = BasicBlock(6).eval()
    torch.nn.init.zeros_(block.conv2.kernel)
    assert torch.allclose(block(x).feats, x.feats.clamp_min(0))
    torch.nn.init.normal_(block.conv2.kernel)
    assert not torch.allclose(block(x).feats, x.feats.clamp_min(0))


def test_cat_puts_first_tensor_channels_first_and_checks_coordinates(cloud):
    x = SparseTensor.from_points(cloud, 0.3, feats=torch.randn(len(cloud), 2))
    y = Conv(2, 3, 3)(x)
    z = cat(y, x)
    assert torch.equal(z.feats[:, :3], y.feats) and torch.equal(z.feats[:, 3:], x.feats)
    down = Conv(2, 2, 3, 2)(x)
    with pytest.raises(ValueError, match="same coordinates"):
        cat(x, down)
    other = SparseTensor.from_points(cloud, 0.3)
    with pytest.raises(ValueError, match="same coordinates"):
        cat(x, other)


def test_global_pooling_per_batch_item(cloud):
    x = SparseTensor.from_points([cloud, cloud[:200] + 10.0], 0.3)
    x = x.replace(torch.randn(len(x), 3))
    b = x.coords[:, 0]
    avg = GlobalPooling("avg")(x)
    mx = GlobalPooling("max")(x)
    assert avg.shape == (2, 3)
    for i in range(2):
        assert torch.allclose(avg[i], x.feats[b == i].mean(0), atol=1e-6)
        assert torch.equal(mx[i], x.feats[b == i].max(0).values)
    with pytest.raises(ValueError, match="mode"):
        GlobalPooling("sum")(x)


def _brute_force_conv(coords: np.ndarray, feats: np.ndarray, kernel: np.ndarray, dim: int) -> np.ndarray:
    """Reference: y[o] = sum over inputs i with |c_i - c_o|_inf <= 1 of W[k(c_i - c_o)]^T x[i]."""
    out = np.zeros((len(coords), kernel.shape[2]))
    for o, co in enumerate(coords):
        for i, ci in enumerate(coords):
            d = ci - co
            if np.abs(d).max() <= 1:
                k = sum((d[j] + 1) * 3**j for j in range(dim))
                out[o] += feats[i] @ kernel[k]
    return out


@pytest.mark.parametrize("dim", [2, 4, 6])
def test_conv_in_any_dimension_matches_brute_force(rng, dim):
    coords = np.unique(rng.integers(0, 3, (60, dim)), axis=0)
    feats = rng.standard_normal((len(coords), 2))
    x = SparseTensor(torch.from_numpy(feats), torch.from_numpy(np.c_[np.zeros(len(coords), int), coords]))
    conv = Conv(2, 3, 3, dim=dim).double()
    y = conv(x)
    order = [tuple(c) for c in y.coords[:, 1:].tolist()]
    assert order == [tuple(c) for c in coords.tolist()]
    ref = _brute_force_conv(coords, feats, conv.kernel.detach().numpy(), dim)
    assert np.allclose(y.feats.detach().numpy(), ref, atol=1e-10)


def test_kernel_maps_are_built_once_and_shared(cloud):
    x = SparseTensor.from_points(cloud, 0.3)
    block = BasicBlock(1)
    block(x)
    maps = dict(x.manager._maps)
    assert list(maps) == [(1, 1, 3)]
    down = Conv(1, 1, 3, 2)(x)
    ConvTranspose(1, 1, 3, 2)(down)
    assert set(x.manager._maps) == {(1, 1, 3), (1, 2, 3)}  # the transposed conv reused the strided map
    assert x.manager._maps[(1, 1, 3)] is maps[(1, 1, 3)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (not counted as passing)")
def test_cuda_matches_cpu(cloud):
    torch.manual_seed(0)
    layers = torch.nn.ModuleList([Conv(1, 4, 3), Conv(4, 4, 3, 2), ConvTranspose(4, 2, 3, 2)]).double()

    def run(device):
        x = SparseTensor.from_points(cloud.to(device), 0.3)
        x = x.replace(x.feats.double())
        net = layers.to(device)
        y = net[2](net[1](net[0](x)))
        return y.feats.cpu(), y.coords.cpu()

    cpu_f, cpu_c = run("cpu")
    gpu_f, gpu_c = run("cuda")
    assert torch.equal(cpu_c, gpu_c) and torch.allclose(cpu_f, gpu_f, atol=1e-10)


def _minkowski_or_skip():
    from s2h_ros.sparse import minkowski

    if not minkowski.available():
        pytest.skip("MinkowskiEngine is not installed (optional backend; not counted as passing)")
    return minkowski


def test_minkowski_backend_gives_the_same_outputs_on_the_same_weights(cloud):
    """Run once with a MinkowskiEngine build (see docs/sparse.md); skipped where it is absent."""
    minkowski = _minkowski_or_skip()
    from s2h_ros.models import build_fcgf

    torch.manual_seed(0)
    model = build_fcgf("compact").eval()
    pts = cloud * 10.0
    with torch.no_grad():
        ours = model(SparseTensor.from_points(pts, 0.3))
        theirs = model(minkowski.from_points(pts, 0.3))
    assert torch.allclose(minkowski.to_rows(theirs, ours.coords), ours.feats, atol=1e-4)
