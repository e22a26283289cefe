#!/usr/bin/env bash
# The main job on the embedded defaults: set-up (idempotent), a synthetic 64-beam drive with
# exact ground truth (`s2h simulate`), replayed through registration_node over real DDS
# (`s2h replay`, lock-step so no scan is dropped on a slow CPU), ending with the sequence
# metrics (results/demo/replay/metrics.json) and a top-view trajectory plot (trajectory.png).
# Extra arguments go to `s2h replay` (e.g. --rate 10, -p registration.device:=cuda).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
export ROS_AUTOMATIC_DISCOVERY_RANGE=${ROS_AUTOMATIC_DISCOVERY_RANGE:-LOCALHOST}
export ROS_DOMAIN_ID=${ROS_DOMAIN_ID:-42}
export FASTDDS_BUILTIN_TRANSPORTS=${FASTDDS_BUILTIN_TRANSPORTS:-LARGE_DATA}
export MPLBACKEND=Agg
OUT=${S2H_DEMO_OUT:-results/demo}
FRAMES=${S2H_DEMO_FRAMES:-60}
if [ ! -f "$OUT/sequence/poses.txt" ] || [ "$(ls "$OUT/sequence/velodyne" | wc -l)" != "$FRAMES" ]; then
  rm -rf "$OUT/sequence"
  .venv/bin/s2h simulate --out "$OUT/sequence" --frames "$FRAMES" --seed 7 --sensor hdl64
fi
.venv/bin/s2h replay "$OUT/sequence" --rate 0 --out "$OUT/replay" "$@"
