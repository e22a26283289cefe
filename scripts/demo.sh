#!/usr/bin/env bash
# The main job on the embedded defaults: set-up (idempotent), a synthetic 64-beam drive with
# exact ground truth (`s2h simulate`: 320 m at 15 m/s through three corners of a town the model
# never saw, world seed 9), replayed through registration_node over real DDS in real time at the
# rate this machine sustains (`s2h replay --rate auto`: the first 12 scans lock-step, then a fixed
# rate chosen from the node's answer times, at most the sensor's 10 Hz; a slow CPU replays in
# slowed time and the node drops what it cannot keep up with, as on a robot), KISS-ICP run offline
# on the same scans beside it, ending with a short summary (rate, ATE, KITTI drift, latency, trusted
# and dropped scans), the metrics (results/demo/replay/metrics.json) and a top-view trajectory plot
# (trajectory.png). Extra arguments go to `s2h replay` (e.g. --rate 0 for lock-step,
# -p registration.device:=cuda). The node registers on the CPU unless told otherwise, and then with
# config/cpu.yaml (fewer voxels a scan: docs/performance.md, "Fewer voxels on a CPU"); with a
# registration.device:=cuda argument it runs the defaults.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
export ROS_AUTOMATIC_DISCOVERY_RANGE=${ROS_AUTOMATIC_DISCOVERY_RANGE:-LOCALHOST}
export ROS_DOMAIN_ID=${ROS_DOMAIN_ID:-42}
export FASTDDS_BUILTIN_TRANSPORTS=${FASTDDS_BUILTIN_TRANSPORTS:-LARGE_DATA}
export MPLBACKEND=Agg
OUT=${S2H_DEMO_OUT:-results/demo}
LENGTH=${S2H_DEMO_LENGTH_M:-320}
if [ ! -f "$OUT/sequence/poses.txt" ] || [ "$(cat "$OUT/sequence/drive" 2>/dev/null)" != "$LENGTH m seed 9" ]; then
  rm -rf "$OUT/sequence"
  .venv/bin/s2h simulate --out "$OUT/sequence" --length-m "$LENGTH" --speed 15 --seed 9 --sensor hdl64
  echo "$LENGTH m seed 9" > "$OUT/sequence/drive"
fi
PROFILE=(--params-file config/cpu.yaml)
if [[ " $* " == *"registration.device:=cuda"* ]]; then PROFILE=(); fi
echo "[demo] node settings: config/register.yaml, config/kitti.yaml${PROFILE[1]:+, ${PROFILE[1]}}"
.venv/bin/s2h replay "$OUT/sequence" --rate auto --out "$OUT/replay" --baseline kiss_icp "${PROFILE[@]}" "$@"
