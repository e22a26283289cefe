"""Sparse convolution equals dense conv3d / conv_transpose3d on a voxel grid; gradients and
determinism; kernel maps skip empty offsets."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from s2h_ros.sparse import (
    Conv,
    ConvTranspose,
    SparseTensor,
    build_kernel_map,
    kernel_offsets,
    sparse_conv,
    sparse_quantize,
)

GRID = 12


def _occupied_grid(rng, n=300, channels=4):
    """Random occupied voxels of a GRID^3 box, their features and the equivalent dense volume."""
    cells = torch.from_numpy(rng.choice(GRID**3, size=n, replace=False))
    xyz = torch.stack([cells % GRID, (cells // GRID) % GRID, cells // GRID**2], 1)
    feats = torch.from_numpy(rng.standard_normal((n, channels))).double()
    x = SparseTensor(feats, torch.cat([torch.zeros(n, 1, dtype=torch.long), xyz], 1))
    dense = torch.zeros(1, channels, GRID, GRID, GRID, dtype=torch.float64)
    dense[0, :, x.coords[:, 1], x.coords[:, 2], x.coords[:, 3]] = x.feats.T
    return x, dense


@pytest.fixture(params=["neighbour_table", "per_offset"])
def conv_path(request, monkeypatch):
    """Run a test through each evaluation of sparse_conv: the table (what GPUs use) or the loop."""
    from s2h_ros.sparse import conv

    if request.param == "neighbour_table":
        monkeypatch.setattr(conv, "_use_table", lambda feats, kmap: True)
    else:
        monkeypatch.setattr(conv, "_use_table", lambda feats, kmap: False)
    return request.param


def _dense_weight(conv: Conv) -> torch.Tensor:
    """[K, C_in, C_out] x-fastest -> conv3d (C_out, C_in, kx, ky, kz)."""
    k = conv.kernel_size
    w = conv.kernel.detach().reshape(k, k, k, conv.in_channels, conv.out_channels)  # (kz, ky, kx, ..)
    return w.permute(4, 3, 2, 1, 0)


@pytest.mark.parametrize("kernel_size", [3, 5])
@pytest.mark.parametrize("stride", [1, 2])
def test_conv_matches_dense_conv3d(rng, kernel_size, stride, conv_path):
    x, dense = _occupied_grid(rng)
    conv = Conv(4, 5, kernel_size, stride, dim=3).double()
    y = conv(x)
    ref = F.conv3d(dense, _dense_weight(conv), stride=stride, padding=kernel_size // 2)
    c = y.coords[:, 1:] // stride
    expected = ref[0, :, c[:, 0], c[:, 1], c[:, 2]].T
    assert y.stride == stride
    assert torch.allclose(y.feats, expected, atol=1e-10)
    if stride == 2:
        assert torch.equal(y.coords, torch.unique(torch.cat([x.coords[:, :1], x.coords[:, 1:] // 2 * 2], 1), dim=0))


@pytest.mark.parametrize("kernel_size", [3, 5])
def test_transposed_conv_matches_dense_conv_transpose3d(rng, kernel_size, conv_path):
    x, _ = _occupied_grid(rng)
    low = Conv(4, 4, 3, 2).double()(x)  # stride-2 tensor on the same coordinate manager
    up = ConvTranspose(4, 3, kernel_size, 2).double()
    y = up(low)
    assert y.stride == 1 and torch.equal(y.coords, x.coords)
    half = GRID // 2
    dense = torch.zeros(1, 4, half, half, half, dtype=torch.float64)
    c = low.coords[:, 1:] // 2
    dense[0, :, c[:, 0], c[:, 1], c[:, 2]] = low.feats.detach().T
    w = _dense_weight(up).permute(1, 0, 2, 3, 4)  # conv_transpose3d wants (C_in, C_out, ...)
    pad = kernel_size // 2
    ref = F.conv_transpose3d(dense, w, stride=2, padding=pad, output_padding=1)
    yc = y.coords[:, 1:]
    expected = ref[0, :, yc[:, 0], yc[:, 1], yc[:, 2]].T
    assert torch.allclose(y.feats, expected, atol=1e-10)


def test_conv_on_stride_two_tensor_uses_dilated_offsets(rng):
    x, dense = _occupied_grid(rng)
    down = Conv(4, 4, 3, 2).double()
    mid = down(x)
    conv = Conv(4, 2, 3, 1).double()
    y = conv(mid)
    half = GRID // 2
    grid = torch.zeros(1, 4, half, half, half, dtype=torch.float64)
    c = mid.coords[:, 1:] // 2
    grid[0, :, c[:, 0], c[:, 1], c[:, 2]] = mid.feats.detach().T
    ref = F.conv3d(grid, _dense_weight(conv), padding=1)
    assert torch.allclose(y.feats, ref[0, :, c[:, 0], c[:, 1], c[:, 2]].T, atol=1e-10)


def test_gradients_match_finite_differences(rng, conv_path):
    """dL/dfeatures and dL/dkernel of a stride-2 conv followed by its transposed conv."""
    x, _ = _occupied_grid(rng, n=40, channels=2)
    feats = x.feats.clone().requires_grad_(True)
    kernel = torch.randn(27, 2, 3, dtype=torch.float64, requires_grad=True)
    kernel_up = torch.randn(27, 3, 2, dtype=torch.float64, requires_grad=True)
    down = x.manager.kernel_map(1, 2, 3)

    def f(features, k1, k2):
        return sparse_conv(sparse_conv(features, k1, down), k2, down.transposed())

    assert torch.autograd.gradcheck(f, (feats, kernel, kernel_up), eps=1e-6, atol=1e-6, fast_mode=True)


def test_forward_and_backward_are_deterministic_on_cpu(rng, conv_path):
    pts = torch.from_numpy(rng.uniform(0, 5, (2000, 3))).float()
    grads, outs = [], []
    for _ in range(2):
        torch.manual_seed(0)
        conv = Conv(1, 8, 3, 2)
        y = conv(SparseTensor.from_points(pts, 0.2))
        y.feats.square().sum().backward()
        outs.append(y.feats.detach())
        grads.append(conv.kernel.grad)
    assert torch.equal(outs[0], outs[1]) and torch.equal(grads[0], grads[1])


def test_kernel_offsets_run_x_fastest():
    off = kernel_offsets(3, 3)
    assert off.shape == (27, 3)
    assert off[0].tolist() == [-1, -1, -1] and off[1].tolist() == [0, -1, -1] and off[3].tolist() == [-1, 0, -1]
    assert off[13].tolist() == [0, 0, 0] and off[9].tolist() == [-1, -1, 0]
    assert kernel_offsets(3, 6).shape == (729, 6)
    with pytest.raises(ValueError, match="odd"):
        kernel_offsets(4, 3)


def test_six_dimensional_map_lists_only_occupied_offsets():
    # points on a line in 6-D: every voxel has at most 2 neighbours out of 729 offsets
    coords = torch.zeros(50, 7, dtype=torch.long)
    coords[:, 1:] = torch.arange(50)[:, None]
    kmap = build_kernel_map(coords, coords, kernel_offsets(3, 6), 1)
    assert sorted(kmap.kernel_ids) == [0, 728] and kmap.identity == 364  # centre offset: a plain matmul
    assert len(kmap) == 50 + 2 * 49


def test_dense_table_column_table_and_binary_search_lookups_give_the_same_map(rng, monkeypatch):
    """Sparse columns of a tall grid in two batches: the key range (about 1.2 M cells) is over a
    50 k limit but its columns (about 20 k) and their occupied cells (about 300 x 60) are under it."""
    from s2h_ros.sparse import kernel_map

    columns = rng.integers(0, 100, (150, 2))
    rows = [np.c_[np.full(len(columns), b), columns, rng.integers(0, 60, len(columns))] for b in (0, 1)]
    coords = torch.from_numpy(np.concatenate(rows)).unique(dim=0)
    offsets = kernel_offsets(3, 3)
    lo = coords.min(0).values
    extent = coords.max(0).values - lo + 1
    keys = kernel_map.coordinate_keys(coords, lo, extent)
    above = coords + torch.tensor([0, 0, 0, 1])  # one cell up: inside the box except at the top
    above = above[above[:, -1] < lo[-1] + extent[-1]]
    kinds, maps = {}, {}
    for limit in (1 << 22, 50_000, 0):
        monkeypatch.setattr(kernel_map, "_TABLE_LIMIT", limit)
        lookup = kernel_map._KeyLookup(coords, lo, extent)
        assert torch.equal(lookup(*lookup.parts(coords)), torch.arange(len(coords)))
        found = lookup(*lookup.parts(above))
        assert torch.equal(found >= 0, torch.isin(kernel_map.coordinate_keys(above, lo, extent), keys))
        assert torch.equal(coords[found[found >= 0]], above[found >= 0])
        kinds[limit] = "columns" if lookup.columns is not None else "table" if lookup.table is not None else "search"
        maps[limit] = build_kernel_map(coords, coords, offsets, 1)
    assert kinds == {1 << 22: "table", 50_000: "columns", 0: "search"}
    first = maps[1 << 22]
    assert len(first) > len(coords)
    for other in (maps[50_000], maps[0]):
        assert other.kernel_ids == first.kernel_ids and other.identity == first.identity == 13
        for a, b in zip(first.in_idx + first.out_idx, other.in_idx + other.out_idx):
            assert torch.equal(a, b)


def test_batches_never_mix():
    pts = torch.rand(500, 3) * 3
    one = Conv(1, 3, 3)
    single = one(SparseTensor.from_points(pts, 0.25)).feats
    both = one(SparseTensor.from_points([pts, pts + 0.01], 0.25))
    first = both.coords[:, 0] == 0
    assert torch.allclose(both.feats[first], single)


def test_bad_input_raises_clear_errors():
    with pytest.raises(ValueError, match="empty"):
        SparseTensor.from_points(torch.zeros(0, 3), 0.3)
    with pytest.raises(ValueError, match="NaN"):
        SparseTensor.from_points(torch.tensor([[0.0, float("nan"), 1.0]]), 0.3)
    with pytest.raises(ValueError, match="shape"):
        sparse_quantize(torch.zeros(5), 0.3)
    with pytest.raises(ValueError, match="positive"):
        sparse_quantize(torch.zeros(5, 3), 0.0)
    with pytest.raises(ValueError, match="3-D"):
        Conv(1, 2, 3, dim=3)(SparseTensor.from_points(torch.rand(10, 6), 0.3))


def test_sparse_quantize_keeps_first_point_per_voxel():
    xyz = torch.tensor([[0.05, 0.0, 0.0], [0.5, 0.5, 0.5], [0.01, 0.02, 0.03], [-0.1, 0.0, 0.0]])
    coords, first, inverse = sparse_quantize(xyz, 0.3)
    assert coords.tolist() == [[-1, 0, 0], [0, 0, 0], [1, 1, 1]]
    assert first.tolist() == [3, 0, 1]
    assert inverse.tolist() == [1, 2, 1, 0]


def test_both_evaluations_give_the_same_fcgf_features_on_a_real_scan(monkeypatch):
    """The shipped FCGF on the bundled real KITTI scan: neighbour table == per-offset loop."""
    from s2h_ros import paths
    from s2h_ros.datasets.io import read_points
    from s2h_ros.models.checkpoint import load_registration_models
    from s2h_ros.models.fcgf import extract_features
    from s2h_ros.sparse import conv

    scan = paths.KITTI_LOOP_PAIR[0]
    fcgf = load_registration_models(None).fcgf
    monkeypatch.setattr(conv, "_use_table", lambda feats, kmap: True)
    _, table = extract_features(fcgf, read_points(scan), 0.3)
    monkeypatch.setattr(conv, "_use_table", lambda feats, kmap: False)
    _, loop = extract_features(fcgf, read_points(scan), 0.3)
    assert table.shape == loop.shape and table.shape[0] > 5000
    assert torch.allclose(table, loop, atol=1e-5), float((table - loop).abs().max())


def test_the_table_is_for_gpus_and_within_its_budget():
    from s2h_ros.sparse import conv

    x = SparseTensor.from_points(torch.rand(500, 3) * 4, 0.2)
    kmap = x.manager.kernel_map(1, 1, 3)
    assert not conv._use_table(x.feats, kmap)  # CPU: the loop was faster
    meta = x.feats.to("meta")
    assert conv._use_table(meta, kmap)
    assert not conv._use_table(meta.expand(-1, conv.TABLE_BUDGET // (kmap.n_out * 27) + 1), kmap)
