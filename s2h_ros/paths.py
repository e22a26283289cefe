"""Where the package's bundled files are (works for editable, pip and colcon installs)."""
from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
SAMPLES_DIR = PACKAGE_DIR / "data" / "samples"
WEIGHTS_DIR = PACKAGE_DIR / "weights"

KITTI_LOOP_PAIR = (
    SAMPLES_DIR / "kitti" / "pair_00_1554_4534" / "kitti_00_001554.bin",
    SAMPLES_DIR / "kitti" / "pair_00_1554_4534" / "kitti_00_004534.bin",
)
THREEDMATCH_DEMO_DIR = SAMPLES_DIR / "3dmatch_demo_pair"
