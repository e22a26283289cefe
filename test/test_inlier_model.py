"""DGR's 6-D inlier network: official parameter names/shapes, one logit per correspondence,
translation equivariance on the 6-D grid, thresholded weights, trainability, bad input."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from s2h_ros.models import InlierNetwork, correspondence_weights


@pytest.fixture
def correspondences(rng):
    src = torch.from_numpy(rng.uniform(-8, 8, (400, 3))).float()
    tgt = src + torch.from_numpy(rng.normal(0, 0.5, (400, 3))).float()
    return src, tgt


def test_dgr_preset_has_official_inlier_parameter_names_and_shapes():
    with torch.device("meta"):  # shapes only: the full 6-D network holds about 0.5 GB of weights
        state = InlierNetwork("dgr").state_dict()
    assert tuple(state["conv1.kernel"].shape) == (729, 1, 32)  # 3^6 offsets
    assert tuple(state["block1.conv1.kernel"].shape) == (729, 32, 32)
    assert tuple(state["conv1_tr.kernel"].shape) == (96, 64)
    assert tuple(state["final.kernel"].shape) == (64, 1) and tuple(state["final.bias"].shape) == (1, 1)


def test_one_logit_per_correspondence_and_duplicates_share_it(correspondences):
    torch.manual_seed(0)
    net = InlierNetwork("compact").eval()
    src, tgt = correspondences
    with torch.no_grad():
        logits = net(torch.cat([src, src[:5]]), torch.cat([tgt, tgt[:5]]), 0.3)
    assert logits.shape == (405,) and torch.isfinite(logits).all()
    assert torch.equal(logits[:5], logits[400:])


def test_logits_are_equivariant_to_whole_voxel_shifts(correspondences):
    """Sparse convolution commutes with grid translations, so shifting the 6-D input by whole
    voxels (a different hash range, the same neighbourhoods) must give the same logits."""
    torch.manual_seed(0)
    net = InlierNetwork("compact").eval()
    src, tgt = correspondences
    # shifts by multiples of 8 voxels keep the stride-2/4/8 grids aligned
    shift_src, shift_tgt = torch.tensor([2.4, -4.8, 7.2]), torch.tensor([-9.6, 0.0, 2.4])
    with torch.no_grad():
        a = net(src, tgt, 0.3)
        b = net(src + shift_src * 4, tgt + shift_tgt * 4, 0.3)
    assert torch.allclose(a, b, atol=1e-5)
    with torch.no_grad():
        c = net(src, tgt + 0.15, 0.3)  # half a voxel: a different quantisation
    assert not torch.allclose(a, c, atol=1e-3)


def test_weights_are_sigmoid_zeroed_below_threshold(correspondences):
    torch.manual_seed(1)
    net = InlierNetwork("compact").eval()
    src, tgt = correspondences
    with torch.no_grad():
        p = torch.sigmoid(net(src, tgt, 0.3))
        w = net.weights(src, tgt, 0.3, threshold=float(p.median()))
    keep = p >= p.median()
    assert torch.equal(w[keep], p[keep]) and (w[~keep] == 0).all() and (~keep).any()


def test_correspondence_weights_are_probabilities_per_row(correspondences):
    torch.manual_seed(2)
    net = InlierNetwork("compact").eval()
    src, tgt = correspondences
    w = correspondence_weights(net, src.numpy(), tgt.numpy(), 0.3, "cpu")
    assert w.dtype == np.float32 and w.shape == (400,) and ((w > 0) & (w < 1)).all()
    with torch.no_grad():
        assert np.allclose(w, torch.sigmoid(net(src, tgt, 0.3)).numpy())


def test_inlier_network_trains_on_a_logistic_loss(correspondences):
    torch.manual_seed(0)
    net = InlierNetwork("compact").train()
    src, tgt = correspondences
    labels = ((tgt - src).norm(dim=1) < 0.6).float()
    loss = torch.nn.functional.binary_cross_entropy_with_logits(net(src, tgt, 0.3), labels)
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in net.parameters())
    assert net.conv1.kernel.grad.abs().sum() > 0


def test_bad_correspondences_raise():
    net = InlierNetwork("compact")
    with pytest.raises(ValueError, match="differ in length"):
        net(torch.zeros(5, 3), torch.zeros(4, 3), 0.3)
    with pytest.raises(ValueError, match="empty"):
        net(torch.zeros(0, 3), torch.zeros(0, 3), 0.3)
    with pytest.raises(ValueError, match="NaN"):
        net(torch.full((2, 3), float("nan")), torch.zeros(2, 3), 0.3)
    with pytest.raises(ValueError, match="unknown inlier preset"):
        InlierNetwork("tiny")
