#!/usr/bin/env bash
# Several servers on this machine behind nginx, sharing their conversations in Redis (docs/serve.md
# "Several replicas"): installs the Debian packages redis-server and nginx where they are missing,
# then runs python -m mnn_h2o.serve.replicas with the arguments given; Ctrl-C stops everything.
#   bash scripts/replicas.sh [--replicas 2] [--port 8080] [--config h2o.yaml] [--set SECTION.KEY=VALUE]
# Run scripts/setup.sh first (the serve extra's redis client comes with its test extra).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! command -v redis-server >/dev/null 2>&1 || ! PATH="$PATH:/usr/sbin" command -v nginx >/dev/null 2>&1; then
  apt-get update -qq && apt-get install -y -qq redis-server nginx
fi
exec "$PY" -m mnn_h2o.serve.replicas "$@"
