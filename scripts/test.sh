#!/usr/bin/env bash
# The whole test suite: set-up (idempotent), then pytest. Tests that exchange ROS messages run
# in a private network namespace when root can make one (CI), with localhost-only discovery and
# a domain id of their own, so they neither see nor disturb other DDS traffic on the machine.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
export ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST
export ROS_DOMAIN_ID=${ROS_DOMAIN_ID:-$(( 100 + RANDOM % 100 ))}
export FASTDDS_BUILTIN_TRANSPORTS=${FASTDDS_BUILTIN_TRANSPORTS:-LARGE_DATA}
export MPLBACKEND=Agg
cmd=(.venv/bin/python -m pytest test -ra "$@")
if [ "$(id -u)" = 0 ] && unshare -n true 2>/dev/null; then
  exec unshare -n bash -c 'ip link set lo up && exec "$@"' bash "${cmd[@]}"
fi
echo "[test] not root or no unshare: running without a private network namespace" >&2
exec "${cmd[@]}"
