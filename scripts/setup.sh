#!/usr/bin/env bash
# Idempotent set-up of .venv/ at the repository root on Debian 12 / Python 3.11 (root):
#   1. Debian libraries Open3D needs (libusb-1.0-0), cmake/g++ for the message build;
#   2. .venv with torch 2.13.0 (CPU) and open3d-cpu 0.20.0 pinned here (requirements.txt only
#      bounds them, so a user's CUDA torch survives `pip install -r requirements.txt`), the core
#      dependencies, the ROS 2 Kilted wheels and the test tools (pytest, kiss-icp, colcon);
#   3. s2h_ros itself, editable, so the source tree is what runs;
#   4. rosidl message generation for msg/ (and tf2_msgs/TFMessage where no ROS provides it)
#      installed into .venv, so `from s2h_ros.msg import RegistrationResult` works unsourced.
# Every step is skipped when a stamp says its inputs have not changed: a second run costs seconds.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV="$ROOT/.venv"
PY="$VENV/bin/python"
STAMPS="$VENV/.s2h-stamps"
log() { printf '[setup] %s\n' "$*" >&2; }
# pip prints one warning per missing local index directory on this machine kind; keep errors.
quiet_pip() { "$PY" -m pip "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }
hash_of() { cat "$@" | sha256sum | cut -c1-16; }
stamp_ok() { [ -f "$STAMPS/$1" ] && [ "$(cat "$STAMPS/$1")" = "$2" ]; }
stamp_set() { mkdir -p "$STAMPS"; echo "$2" > "$STAMPS/$1"; }

# 1. System packages (only what is missing).
missing=()
ldconfig -p | grep -q 'libusb-1.0.so.0' || missing+=(libusb-1.0-0)
command -v cmake >/dev/null || missing+=(cmake)
command -v g++ >/dev/null || missing+=(g++)
command -v make >/dev/null || missing+=(make)
command -v ip >/dev/null || missing+=(iproute2)
command -v unshare >/dev/null || missing+=(util-linux)
if [ ${#missing[@]} -gt 0 ]; then
  log "apt-get install ${missing[*]}"
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# 2. Virtual environment and Python packages.
if [ ! -x "$PY" ]; then
  log "creating $VENV"
  python3 -m venv "$VENV"
fi
# The exact builds this machine kind runs and CI tests; installed first, so the requirement
# files (ranges) keep them.
PINNED=(torch==2.13.0 open3d-cpu==0.20.0)
REQS=("$ROOT/requirements.txt" "$ROOT/requirements-ros.txt" "$ROOT/requirements-test.txt")
deps_hash=$( { cat "${REQS[@]}"; echo "${PINNED[*]}"; } | sha256sum | cut -c1-16)
if ! stamp_ok deps "$deps_hash"; then
  log "pip install ${PINNED[*]}"
  quiet_pip install -q "${PINNED[@]}"
  log "pip install (core, ROS 2 Kilted wheels, test tools)"
  req_args=()
  for r in "${REQS[@]}"; do req_args+=(-r "$r"); done
  quiet_pip install -q "${req_args[@]}"
  "$PY" -c "import torch, scipy, open3d, rosbags, rclpy, pytest, colcon_core" \
    || { log "dependency import failed"; exit 1; }
  "$PY" - "${PINNED[@]}" <<'PYCHECK' || { log "a pinned package was replaced"; exit 1; }
import sys
from importlib.metadata import version
for pin in sys.argv[1:]:
    name, want = pin.split("==")
    assert version(name).split("+")[0] == want, f"{name} {version(name)} != {want}"
PYCHECK
  stamp_set deps "$deps_hash"
fi

# 3. The package itself, editable (a path entry, so the generated msg module merges in).
pkg_hash=$(hash_of "$ROOT/setup.py")
if ! stamp_ok pkg "$pkg_hash"; then
  log "pip install -e ."
  quiet_pip install -q --no-deps --no-build-isolation -e "$ROOT" --config-settings editable_mode=compat
  stamp_set pkg "$pkg_hash"
fi

# 4. Message generation with rosidl into the venv prefix.
export AMENT_PREFIX_PATH="$VENV" CMAKE_PREFIX_PATH="$VENV"
PY_INC=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
NP_INC=$("$PY" -c 'import numpy; print(numpy.get_include())')
# The wheels' exported CMake files name the include directories of the machine that built
# them; point them at this interpreter's (idempotent: only the foreign paths are rewritten).
fix_cmake_paths() {
  { grep -rlE '/opt/python/cp3[0-9]+-cp3[0-9]+' "$VENV/share" --include='*.cmake' 2>/dev/null || true; } \
    | while read -r f; do
        sed -i -E \
          -e "s#/opt/python/cp3[0-9]+-cp3[0-9]+/lib/python3\.[0-9]+/site-packages/numpy/(_core|core)/include#${NP_INC}#g" \
          -e "s#/opt/python/cp3[0-9]+-cp3[0-9]+/include/python3\.[0-9]+#${PY_INC}#g" "$f"
      done
}
build_msgs() {  # build_msgs NAME SOURCE_DIR [cmake args...]
  local name=$1 src=$2; shift 2
  local build="$ROOT/build/venv-$name"
  log "rosidl: building $name messages into $VENV"
  cmake -S "$src" -B "$build" -DCMAKE_INSTALL_PREFIX="$VENV" -DBUILD_TESTING=OFF \
    -DPython3_EXECUTABLE="$PY" -DCMAKE_BUILD_TYPE=Release "$@" >"$build.log" 2>&1 \
    || { tail -40 "$build.log"; exit 1; }
  make -C "$build" -j2 install >>"$build.log" 2>&1 || { tail -40 "$build.log"; exit 1; }
}
msgs_hash=$(hash_of "$ROOT"/msg/*.msg "$ROOT/CMakeLists.txt" "$ROOT/package.xml" "$ROOT"/ros_fallback/tf2_msgs/*.* "$ROOT"/ros_fallback/tf2_msgs/msg/*)
if ! stamp_ok msgs "$msgs_hash-$deps_hash-$pkg_hash"; then
  fix_cmake_paths
  mkdir -p "$ROOT/build"
  if ! "$PY" -c "import tf2_msgs.msg" 2>/dev/null; then
    build_msgs tf2_msgs "$ROOT/ros_fallback/tf2_msgs"
  fi
  build_msgs s2h_ros "$ROOT" -DS2H_INSTALL_PYTHON=OFF
  # rosidl's Python generator installs an __init__.py and an egg-info for s2h_ros. Without
  # them site-packages/s2h_ros is only a portion merged into the editable source package (see
  # s2h_ros/__init__.py), and pip keeps seeing one s2h_ros distribution: the editable one.
  SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  rm -rf "$SITE/s2h_ros/__init__.py" "$SITE"/s2h_ros-*.egg-info
  stamp_set msgs "$msgs_hash-$deps_hash-$pkg_hash"
fi

"$PY" -c "import rclpy, s2h_ros; from s2h_ros.msg import RegistrationResult; from tf2_msgs.msg import TFMessage" \
  || { log "set-up finished but the ROS imports fail"; exit 1; }
log "ready: $VENV"
