"""The context inlier network (models.context_inlier), its training on cached S2H matches
(training.match_data, training.context_trainer) and the pipeline's learned path with DGR's safeguard."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from s2h_ros import geometry
from s2h_ros.config import RegistrationConfig
from s2h_ros.models.checkpoint import combine_weights, load_inlier, load_registration_models, shipped_weights
from s2h_ros.models.context_inlier import ContextInlierConfig, ContextInlierNetwork, length_consistency
from s2h_ros.pipeline import Registrar
from s2h_ros.training.context_trainer import ContextInlierTask
from s2h_ros.training.match_data import MatchSample, load_shard, pair_samples

VOXEL = 0.3


def _rigid_matches(rng: np.random.Generator, n_in: int = 300, n_out: int = 700, yaw: float = 40.0):
    """Matches of a street-like cloud: ``n_in`` true pairs under a rigid motion (2 cm noise) and
    ``n_out`` pairs of unrelated points; returns xs, ys, probs, T, inlier mask."""
    xs = rng.uniform([-40, -40, -2], [40, 40, 6], size=(n_in + n_out, 3)).astype(np.float32)
    T = geometry.make_transform(geometry.yaw_transform(yaw)[:3, :3], np.array([7.0, -3.0, 0.2]))
    ys = geometry.apply_transform(T, xs.astype(np.float64)) + rng.normal(0, 0.02, xs.shape)
    ys[n_in:] = rng.uniform([-40, -40, -2], [40, 40, 6], size=(n_out, 3))
    inlier = np.arange(n_in + n_out) < n_in
    probs = np.where(inlier, rng.uniform(0.3, 1.0, len(xs)), rng.uniform(0.0, 0.8, len(xs))).astype(np.float32)
    perm = rng.permutation(len(xs))
    return xs[perm], ys[perm].astype(np.float32), probs[perm], T, inlier[perm]


def test_logits_do_not_depend_on_heading_or_position_of_either_cloud(rng):
    """Every input is invariant to a rotation about z and a translation of either side, so a pair
    at another relative heading gets the same weights (no heading augmentation needed)."""
    xs, ys, probs, _, _ = _rigid_matches(rng)
    net = ContextInlierNetwork().eval()
    with torch.no_grad():
        base = net(xs, ys, VOXEL, probs)
        turned = geometry.apply_transform(geometry.make_transform(geometry.yaw_transform(137.0)[:3, :3],
                                                                  np.array([300.0, -50.0, 4.0])), xs.astype(np.float64))
        moved = net(turned.astype(np.float32), ys + np.float32([1000.0, 20.0, 0.0]), VOXEL, probs)
    assert base.shape == (len(xs),)
    assert torch.allclose(base, moved, atol=2e-3), float((base - moved).abs().max())


def test_length_consistency_separates_rigid_pairs_from_outliers(rng):
    xs, ys, _, _, inlier = _rigid_matches(rng, n_in=200, n_out=200)
    anchors = torch.as_tensor(np.flatnonzero(inlier)[:50])
    c = length_consistency(torch.as_tensor(xs) / VOXEL, torch.as_tensor(ys) / VOXEL, anchors, torch.ones(50),
                           torch.tensor([1.0, 2.0, 4.0]))
    assert c.shape == (400, 3)
    assert float(c[inlier, 0].min()) > 0.9 and float(c[~inlier, 0].mean()) < 0.1


def test_length_consistency_in_row_blocks_is_the_one_block_value_and_gradient(rng, monkeypatch):
    """The CPU makes the (N, A) terms a block of rows at a time; blocks of 64 rows over 400
    correspondences give the same values and the same gradient in the anchor weights as one block,
    and inference, which overwrites each block in place, the same values."""
    from s2h_ros.models import context_inlier

    xs, ys, _, _, _ = _rigid_matches(rng, n_in=200, n_out=200)
    xs, ys = torch.as_tensor(xs) / VOXEL, torch.as_tensor(ys) / VOXEL
    anchors = torch.arange(0, 400, 5)
    taus = torch.tensor([1.0, 2.0, 4.0])

    def consistency_and_gradient(rows: int):
        monkeypatch.setattr(context_inlier, "CONSISTENCY_ROWS", rows)
        weights = torch.linspace(0.1, 1.0, len(anchors)).requires_grad_()
        c = length_consistency(xs, ys, anchors, weights, taus)
        (c * torch.arange(1.0, 4.0)).sum().backward()
        return c.detach(), weights.grad

    blocked, one = consistency_and_gradient(64), consistency_and_gradient(100_000)
    with torch.no_grad():  # inference: the blocks are overwritten in place
        inferred = length_consistency(xs, ys, anchors, torch.linspace(0.1, 1.0, len(anchors)), taus)
    assert blocked[0].shape == (400, 3)
    assert torch.equal(blocked[0], one[0]) and torch.equal(inferred, one[0])
    assert torch.allclose(blocked[1], one[1], rtol=1e-5, atol=1e-7)
    assert float(one[1].abs().sum()) > 0.0
    none = torch.zeros(0, 3)
    assert length_consistency(none, none, torch.zeros(0, dtype=torch.long), torch.ones(0), taus).shape == (0, 3)


def test_bad_inputs_raise_and_empty_input_gives_no_logits():
    net = ContextInlierNetwork()
    with pytest.raises(ValueError):
        net(np.zeros((5, 3)), np.zeros((4, 3)), VOXEL)
    with pytest.raises(ValueError):
        ContextInlierNetwork(ContextInlierConfig(first_anchors="best"))
    assert net(np.zeros((0, 3)), np.zeros((0, 3)), VOXEL).shape == (0,)


def _sample(rng, yaw: float) -> MatchSample:
    xs, ys, probs, T, _ = _rigid_matches(rng, n_in=250, n_out=750, yaw=yaw)
    return MatchSample(xs, ys, probs, T, 5000, "global", True)


def test_training_on_matches_learns_weights_whose_procrustes_recovers_the_motion():
    """Untrained, weighted Procrustes on the weights is far off (75 % outliers); after 150 steps
    of BCE + L3 on other pairs it recovers held-apart pairs' motion within centimetres."""
    rng = np.random.default_rng(3)
    torch.manual_seed(0)
    train = [_sample(rng, yaw) for yaw in rng.uniform(-180, 180, 12)]
    held = [_sample(np.random.default_rng(100 + i), yaw) for i, yaw in enumerate((-150.0, 20.0, 95.0))]
    task = ContextInlierTask(ContextInlierNetwork(ContextInlierConfig(channels=32, blocks=2)), VOXEL,
                             torch.device("cpu"))
    before = task.validate(held)
    opt = torch.optim.Adam(task.param_groups(3e-3))
    for step in range(150):
        loss, _ = task.loss(train[step % len(train)], np.random.default_rng(step))
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = task.validate(held)
    assert before["te_m"] != before["te_m"] or before["recall_global"] < 1.0 or before["te_m"] > 0.2
    assert after["recall_global"] == 1.0 and after["te_m"] < 0.05, after
    assert after["weighted_precision"] > 0.9


def test_checkpoint_round_trip_and_packing_with_fcgf(tmp_path, rng):
    xs, ys, probs, _, _ = _rigid_matches(rng)
    task = ContextInlierTask(ContextInlierNetwork(ContextInlierConfig(stages=3, anchors=64)), VOXEL,
                             torch.device("cpu"))
    task.save(tmp_path / "ctx.pt", {"nets": dict(task.nets)})
    loaded = load_inlier(tmp_path / "ctx.pt")
    assert isinstance(loaded, ContextInlierNetwork) and loaded.config.stages == 3
    with torch.no_grad():
        assert torch.equal(loaded(xs, ys, VOXEL, probs), task.nets["inlier"].eval()(xs, ys, VOXEL, probs))
    packed = combine_weights(shipped_weights(VOXEL), tmp_path / "ctx.pt", tmp_path / "packed.pt", steps=7)
    models = load_registration_models(packed)
    assert isinstance(models.inlier, ContextInlierNetwork) and models.voxel == VOXEL


@pytest.fixture(scope="module")
def held_out_pair():
    from s2h_ros.datasets.synthetic import synthetic_pairs

    return synthetic_pairs(1, 31, sensor="hdl64")[0]


def test_match_samples_are_the_pipelines_matches_with_the_truth(held_out_pair):
    """A cached sample: the global one at the right heading hypothesis, the tracking one around a
    perturbed prior; T_gt maps the stored source points onto their true partners."""
    registrar = Registrar(RegistrationConfig())
    samples = pair_samples(registrar, held_out_pair.source[:, :3], held_out_pair.target[:, :3], held_out_pair.T_gt,
                           np.random.default_rng(5), wrong_heading=0.0)
    assert [s.search for s in samples] == ["global", "prior"]
    for s in samples:
        assert s.heading_right and len(s.xs) == len(s.ys) == len(s.probs) > 300
        assert float((s.residuals() < 0.6).mean()) > 0.08  # the right heading: hundreds of true matches
    wrong = pair_samples(registrar, held_out_pair.source[:, :3], held_out_pair.target[:, :3], held_out_pair.T_gt,
                         np.random.default_rng(5), wrong_heading=1.0)[0]
    assert not wrong.heading_right and float((wrong.residuals() < 0.6).mean()) < 0.04


def test_shards_round_trip(tmp_path, rng):
    from s2h_ros.training.match_data import _save_shard

    samples = [_sample(rng, 10.0), MatchSample(np.zeros((0, 3), np.float32), np.zeros((0, 3), np.float32),
                                               np.zeros(0, np.float32), np.eye(4), 10, "prior", True, "empty")]
    _save_shard(tmp_path / "matches_1000.npz", samples, {"seed": 1000})
    back = load_shard(tmp_path / "matches_1000.npz")
    assert [b.search for b in back] == ["global", "prior"] and back[1].name == "empty"
    assert np.array_equal(back[0].xs, samples[0].xs) and np.allclose(back[0].T_gt, samples[0].T_gt)


def test_indoor_matches_are_made_as_the_depth_camera_node_makes_them(tmp_path):
    """``s2h train matches --params-file config/depth_camera.yaml --min-overlap``: the pairs' overlap
    reaches the floor, the shard says the voxel, inlier distance and prior radius it was matched
    at, and its matches are the indoor FCGF's at 0.05 m (true matches within 0.1 m, not 0.6 m)."""
    import json
    from pathlib import Path

    from s2h_ros.config import configs_from_params_files
    from s2h_ros.datasets.types import overlap_ratio
    from s2h_ros.training.data import OVERLAP_VOXEL
    from s2h_ros.training.match_data import _world_pairs, write_matches

    config = configs_from_params_files([Path(__file__).parents[1] / "config" / "depth_camera.yaml"])[0]
    pairs = _world_pairs(4200, "vlp16", "rooms", 2, 0.3, 2.5, 0.25)
    assert len(pairs) == 2 and all(overlap_ratio(p, OVERLAP_VOXEL) >= 0.25 for p in pairs)
    out = write_matches(tmp_path / "train", range(4200, 4201), ["vlp16"], ["rooms"], 1, 0.3, 2.5, config,
                        log=lambda m: None, min_overlap=0.25)
    shard = out / "matches_4200.npz"
    with np.load(shard) as z:
        meta = json.loads(str(z["info"]))["meta"]
    assert (meta["voxel"], meta["inlier_distance"], meta["prior_radius"], meta["min_overlap"]) == (0.05, 0.1, 0.25, 0.25)
    samples = load_shard(shard)
    assert [s.search for s in samples] == ["global", "prior"]
    prior = samples[1]
    assert len(prior.xs) > 300 and float((prior.residuals() < 0.1).mean()) > 0.1


def test_fine_tuning_starts_from_the_networks_of_a_weight_file_and_validates_at_its_scale():
    """``s2h train context --init``: the network starts as the file's (here the indoor weights'),
    whatever the shape options say; recall's translation threshold follows the inlier distance
    (DGR's 0.6 m outdoors, 0.1 m at the indoor 0.1 m)."""
    import argparse

    from s2h_ros.training.context_trainer import _initial_network

    path = shipped_weights(0.05)
    args = argparse.Namespace(init=path, channels=64, blocks=4, stages=2, anchors=256, first_anchors="random")
    net = _initial_network(args)
    shipped = load_inlier(path)
    assert net.training and net.config.to_dict() == shipped.config.to_dict()
    assert all(torch.equal(a, b) for a, b in zip(net.state_dict().values(), shipped.state_dict().values()))
    fresh = _initial_network(argparse.Namespace(**{**vars(args), "init": None}))
    assert fresh.config.stages == 2 and fresh.config.channels == 64
    assert ContextInlierTask(net, 0.05, torch.device("cpu"), 0.1).te_threshold == pytest.approx(0.1)
    assert ContextInlierTask(net, VOXEL, torch.device("cpu")).te_threshold == pytest.approx(0.6)


def _register_with(weights_path, pair, **changes):
    registrar = Registrar(RegistrationConfig(weights=str(weights_path), **changes))
    return registrar, registrar.register(pair.source[:, :3], pair.target[:, :3])


def test_safeguard_reports_why_ransac_estimated_the_transform(tmp_path, held_out_pair, monkeypatch):
    """With an inlier network in the weights: a weight sum below the threshold falls back to
    RANSAC and says so; learned weights that give an untrusted result are re-estimated by RANSAC
    from the same matches (and the result says so); the shipped FCGF-only file says 'no inlier network'."""
    task = ContextInlierTask(ContextInlierNetwork(ContextInlierConfig(channels=16, blocks=1)), VOXEL,
                             torch.device("cpu"))
    task.save(tmp_path / "ctx.pt", {"nets": dict(task.nets)})
    packed = combine_weights(shipped_weights(VOXEL), tmp_path / "ctx.pt", tmp_path / "packed.pt")

    _, low = _register_with(packed, held_out_pair, safeguard_min_weight=1e6)
    assert low.success and low.used_fallback and low.fallback.startswith("inlier weight sum below")

    # Uniform weights over all matches (most are outliers): Procrustes is wrong, RANSAC rescues it.
    monkeypatch.setattr(Registrar, "_inlier_weights",
                        lambda self, s, t, pairs, probs: (np.ones(len(pairs), np.float32), True))
    _, rescued = _register_with(packed, held_out_pair, safeguard_min_weight=0.0, safeguard_ratio=0.0,
                                heading_hypotheses=1)
    re, te = geometry.transform_errors(rescued.transform, held_out_pair.T_gt)
    assert rescued.success and rescued.fallback == "learned estimate not trusted" and re < 1.0 and te < 0.2
    monkeypatch.undo()

    from s2h_ros.models.checkpoint import load_fcgf, save_checkpoint

    fcgf_only = save_checkpoint(tmp_path / "fcgf.pt", load_fcgf(shipped_weights(VOXEL)), voxel=VOXEL)
    _, plain = _register_with(fcgf_only, held_out_pair)
    assert plain.success and plain.used_fallback and plain.fallback == "no inlier network"


def test_the_result_message_says_why_ransac_estimated_the_transform(tmp_path, held_out_pair):
    """registration_node's s2h_ros/RegistrationResult carries ``fallback`` through a serialisation
    round trip: the reason for a safeguard result, empty for the learned path."""
    pytest.importorskip("rclpy")
    from rclpy.serialization import deserialize_message, serialize_message
    from std_msgs.msg import Header

    from s2h_ros.msg import RegistrationResult as RegistrationResultMsg
    from s2h_ros.odometry import OdometryStep
    from s2h_ros.ros.messages import result_message

    task = ContextInlierTask(ContextInlierNetwork(ContextInlierConfig(channels=16, blocks=1)), VOXEL,
                             torch.device("cpu"))
    task.save(tmp_path / "ctx.pt", {"nets": dict(task.nets)})
    packed = combine_weights(shipped_weights(VOXEL), tmp_path / "ctx.pt", tmp_path / "packed.pt")
    _, result = _register_with(packed, held_out_pair, safeguard_min_weight=1e6, heading_hypotheses=1)
    step = OdometryStep(1, 0.1, result.success, result.message, None, None, 0, 0.0, False, result)
    msg = deserialize_message(serialize_message(result_message(step, Header(frame_id="velodyne"), 1)),
                              RegistrationResultMsg)
    assert msg.fallback == result.fallback and msg.fallback.startswith("inlier weight sum below")
    assert msg.weight_sum == pytest.approx(result.weight_sum, rel=1e-6)


def test_a_turned_hypothesis_with_low_weights_gets_ransac_only_when_nothing_else_is_trusted(tmp_path, held_out_pair):
    """The source turned by 270 deg: the as-given hypothesis fails (RANSAC on its matches too:
    with the features trained across sensors it does not at 90 or 180 deg on this pair); the
    turned ones have a weight sum below the (here huge) threshold, so they are deferred, and
    RANSAC runs on them, in the order tried, only after no hypothesis was trusted: the 90 deg one
    (which undoes the turn) is found and says why."""
    task = ContextInlierTask(ContextInlierNetwork(ContextInlierConfig(channels=16, blocks=1)), VOXEL,
                             torch.device("cpu"))
    task.save(tmp_path / "ctx.pt", {"nets": dict(task.nets)})
    packed = combine_weights(shipped_weights(VOXEL), tmp_path / "ctx.pt", tmp_path / "packed.pt")
    turn = geometry.yaw_transform(270.0)
    source = geometry.apply_transform(turn, held_out_pair.source[:, :3].astype(np.float64)).astype(np.float32)
    registrar = Registrar(RegistrationConfig(weights=str(packed), safeguard_min_weight=1e6))
    result = registrar.register(source, held_out_pair.target[:, :3])
    re, te = geometry.transform_errors(result.transform, held_out_pair.T_gt @ geometry.invert_transform(turn))
    assert result.success and result.heading_deg == 90.0 and re < 1.0 and te < 0.2, result.message
    assert result.used_fallback and result.fallback.startswith("inlier weight sum below")
