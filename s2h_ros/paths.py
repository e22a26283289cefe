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


def config_dir() -> Path:
    """``config/`` of the source tree (editable/pip from a checkout) or of the ROS share directory."""
    local = PACKAGE_DIR.parent / "config"
    if local.is_dir():
        return local
    try:
        from ament_index_python.packages import get_package_share_directory

        return Path(get_package_share_directory("s2h_ros")) / "config"
    except (ImportError, LookupError) as exc:
        raise FileNotFoundError("cannot find s2h_ros's config/ directory (source tree or ROS share)") from exc
