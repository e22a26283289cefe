"""Shared pytest fixtures: seeded RNGs and the bundled real samples."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from s2h_ros import paths

# Tests are small; one intra-op thread keeps them deterministic and fair on 2-core CI.
torch.set_num_threads(1)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


@pytest.fixture(scope="session")
def samples_dir():
    return paths.SAMPLES_DIR


@pytest.fixture(scope="session")
def vlp16_drive(tmp_path_factory):
    """An 8-scan 16-beam synthetic drive at 8 m/s, written in the KITTI layout and read back."""
    from s2h_ros.datasets.kitti import KittiSequence
    from s2h_ros.datasets.synthetic import simulate_sequence

    out = tmp_path_factory.mktemp("vlp16_drive")
    simulate_sequence(n_frames=8, seed=11, sensor="vlp16", speed=8.0, out_dir=out)
    return KittiSequence(out)

# launch_testing tests need a full ROS 2 install (launch/launch_ros are not on PyPI); they run
# through `colcon test` / `launch_test`, never in this suite, so they are not collected here.
collect_ignore = ["launch_testing"]
