#!/usr/bin/env bash
# The GPU check of the PyTorch split path (tests/gpu/README.md): run from anywhere as
#   bash tests/gpu/check.sh [check.py options]
# Where the interpreter lacks nebula-mq's dependencies (a bare GPU machine), the wheels carried
# in .whl/ (tests/gpu/fetch_wheels.sh) are installed into $SITE first (FORCE_WHEELS=1: always);
# without a GPU it is the CPU-only dry run. Exit status: check.py's
# (0 all passed, 1 a check failed), 124 past the time limit (CHECK_TIMEOUT_S, default 360 s).
set -euo pipefail
cd "$(dirname "$0")/../.."
WHEELS=${WHEELS:-.whl}
SITE=${SITE:-/tmp/site}

# The interpreter with torch: $PYTHON, else python3, else the repo's virtualenv.
PY=${PYTHON:-python3}
if [ -z "${PYTHON:-}" ] && ! python3 -c "import torch" 2>/dev/null && [ -x .venv/bin/python ]; then
  PY=.venv/bin/python
fi
echo "== $($PY -c 'import sys; print(sys.executable, sys.version.split()[0])')"

source tests/gpu/deps.sh
use_deps "import numpy, ml_dtypes, msgpack, lz4, cryptography, structlog, prometheus_client"
echo "== PYTHONPATH=$PYTHONPATH"
exec timeout "${CHECK_TIMEOUT_S:-360}" "$PY" tests/gpu/check.py "$@"
