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

shopt -s nullglob
wheels=("$WHEELS"/*.whl)
DEPS="import numpy, ml_dtypes, msgpack, lz4, cryptography, structlog, prometheus_client"
if [ "${FORCE_WHEELS:-0}" != 1 ] && PYTHONPATH=$PWD "$PY" -c "$DEPS" 2>/dev/null; then
  echo "== the interpreter has nebula-mq's dependencies: $WHEELS not needed"
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
elif [ ${#wheels[@]} -gt 0 ]; then
  echo "== installing ${#wheels[@]} wheels from $WHEELS into $SITE"
  if "$PY" -m pip --version >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" "${wheels[@]}"
  else  # no pip: a wheel is a zip of what its install puts in site-packages
    "$PY" -c 'import sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in sys.argv[2:]]' \
      "$SITE" "${wheels[@]}"
  fi
  export PYTHONPATH=$SITE:$PWD
else
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
echo "== PYTHONPATH=$PYTHONPATH"
exec timeout "${CHECK_TIMEOUT_S:-360}" "$PY" tests/gpu/check.py "$@"
