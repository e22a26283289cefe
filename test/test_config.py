"""The one typed config: defaults in one place, clear errors for wrong types and ranges."""
from __future__ import annotations

import pytest

from s2h_ros.config import (
    ConfigError,
    OdometryConfig,
    RegistrationConfig,
    config_from_dict,
    configs_from_params_files,
    describe,
    parse_overrides,
)
from s2h_ros.matching import OUTLIER_RULES


def test_defaults_are_valid_and_documented():
    for cls in (RegistrationConfig, OdometryConfig):
        cls()
        for name, typ, default, description, _ in describe(cls):
            assert description, f"{cls.__name__}.{name} has no description"
            assert isinstance(default, typ)


@pytest.mark.parametrize("bad, field", [
    ({"voxel_size": "0.3"}, "voxel_size"),
    ({"voxel_size": -1.0}, "voxel_size"),
    ({"k": 2.5}, "k"),
    ({"k": True}, "k"),
    ({"device": "gpu"}, "device"),
    ({"matcher": "hungarian"}, "matcher"),
    ({"temperature": float("nan")}, "temperature"),
])
def test_wrong_type_or_range_is_rejected_naming_the_field(bad, field):
    with pytest.raises(ConfigError, match=field):
        RegistrationConfig(**bad)


def test_integers_are_accepted_for_float_fields():
    assert RegistrationConfig(voxel_size=1).voxel_size == 1.0


def test_unknown_keys_are_rejected_by_name():
    with pytest.raises(ConfigError, match="voxel"):
        config_from_dict(RegistrationConfig, {"voxel": 0.3})


def test_outlier_profit_choices_are_the_matching_engine_rules():
    for rule in OUTLIER_RULES:
        assert RegistrationConfig(outlier_profit=rule).outlier_profit == rule
    with pytest.raises(ConfigError):
        RegistrationConfig(outlier_profit="paper")


def test_overrides_text_is_read_with_each_fields_type():
    values = parse_overrides(RegistrationConfig, "matcher=nn+k=8+temperature=0.05+use_inlier_model=false")
    assert values == {"matcher": "nn", "k": 8, "temperature": 0.05, "use_inlier_model": False}
    assert RegistrationConfig().replace(**values).k == 8


@pytest.mark.parametrize("text, named", [("kk=3", "kk"), ("k=eight", "k"), ("k", "k"), ("use_inlier_model=maybe", "use_inlier_model")])
def test_bad_overrides_text_names_the_key(text, named):
    with pytest.raises(ConfigError, match=named):
        parse_overrides(RegistrationConfig, text)


def test_parameter_files_give_the_settings_the_node_runs_with(tmp_path):
    """config/register.yaml is the defaults; config/depth_camera.yaml or config/cpu.yaml over it
    changes what it names; a later file wins; an unknown registration key is refused naming it."""
    from s2h_ros.paths import config_dir

    base = config_dir() / "register.yaml"
    reg, odo = configs_from_params_files([base])
    assert reg == RegistrationConfig() and odo == OdometryConfig()
    reg, odo = configs_from_params_files([base, config_dir() / "depth_camera.yaml"])
    assert (reg.voxel_size, reg.inlier_distance, reg.prior_radius, odo.keyframe_distance) == (0.05, 0.1, 0.25, 1.0)
    assert reg.min_fitness == RegistrationConfig().min_fitness  # untouched keys keep the defaults
    reg, odo = configs_from_params_files([base, config_dir() / "cpu.yaml"])
    assert reg == RegistrationConfig(max_points=8000, prior_max_points=4000)  # the CPU profile: fewer voxels
    assert odo == OdometryConfig(keyframe_distance=10.0)  # and keyframes further apart
    later = tmp_path / "later.yaml"
    later.write_text("registration_node:\n  ros__parameters:\n    registration:\n      voxel_size: 0.2\n")
    assert configs_from_params_files([config_dir() / "depth_camera.yaml", later])[0].voxel_size == 0.2
    bad = tmp_path / "bad.yaml"
    bad.write_text("registration_node:\n  ros__parameters:\n    registration:\n      voxle_size: 0.2\n")
    with pytest.raises(ConfigError, match="voxle_size"):
        configs_from_params_files([bad])


def test_cpu_threads_leave_a_core_on_the_cpu_and_one_thread_with_a_gpu(monkeypatch):
    import os

    from s2h_ros.config import cpu_threads

    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert cpu_threads(0, "cpu") == 15
    assert cpu_threads(0, "cuda") == 1 and cpu_threads(0, "cuda:1") == 1
    assert cpu_threads(6, "cuda") == 6 and cpu_threads(6, "cpu") == 6
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    assert cpu_threads(0, "cpu") == 1


def test_cpu_threads_bound_the_blas_of_other_threads_as_well_as_torch(monkeypatch):
    """numpy's BLAS follows the setting in a thread started afterwards (the odometry's step thread):
    a matrix product there uses no more CPU time than wall time (all cores would, on any machine
    with two or more)."""
    import os
    import threading
    import time

    import numpy as np
    import torch
    from threadpoolctl import threadpool_info, threadpool_limits

    import s2h_ros.config
    from s2h_ros.config import cpu_workers, use_cpu_threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # both restored after the test
    monkeypatch.setattr(s2h_ros.config, "_CPU_THREADS", None)
    assert cpu_workers() == -1
    a = np.random.default_rng(0).standard_normal((1500, 1500))
    seen: dict = {}

    def product() -> None:
        seen["blas"] = [d["num_threads"] for d in threadpool_info() if d["user_api"] == "blas"]
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(4):
            a @ a
        seen["wall"], seen["cpu"] = time.perf_counter() - wall, time.process_time() - cpu

    before = torch.get_num_threads()
    with threadpool_limits(limits=None):  # every pool restored afterwards
        try:
            use_cpu_threads(1)
            worker = threading.Thread(target=product)
            worker.start()
            worker.join()
        finally:
            torch.set_num_threads(before)
    assert torch.get_num_threads() == before
    assert cpu_workers() == 1 and os.environ["OMP_NUM_THREADS"] == "1"
    assert seen["blas"] and all(n == 1 for n in seen["blas"]), seen["blas"]
    assert seen["cpu"] < 1.3 * seen["wall"], seen
