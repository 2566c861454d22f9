# Sourced by check.sh and stack.sh: nebula-mq's dependencies for $PY, from the interpreter itself
# where it has them (and FORCE_WHEELS is not 1), else from the wheels carried in $WHEELS
# (tests/gpu/fetch_wheels.sh), installed into $SITE. Exports PYTHONPATH with the repo on it.
# Usage: use_deps "import numpy, ..."
use_deps() {
  local deps=$1 wheels
  shopt -s nullglob
  wheels=("$WHEELS"/*.whl)
  if [ "${FORCE_WHEELS:-0}" != 1 ] && PYTHONPATH=$PWD "$PY" -c "$deps" 2>/dev/null; then
    echo "== the interpreter has nebula-mq's dependencies: $WHEELS not needed"
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
  elif [ "${FORCE_WHEELS:-0}" != 1 ] && [ -d "$SITE" ] && PYTHONPATH=$SITE:$PWD "$PY" -c "$deps" 2>/dev/null; then
    echo "== $SITE has nebula-mq's dependencies: installed by an earlier script of this call"
    export PYTHONPATH=$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}
  elif [ ${#wheels[@]} -gt 0 ]; then
    echo "== installing ${#wheels[@]} wheels from $WHEELS into $SITE"
    if "$PY" -m pip --version >/dev/null 2>&1; then
      "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        "${wheels[@]}"
    else  # no pip: a wheel is a zip of what its install puts in site-packages
      "$PY" -c 'import sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in sys.argv[2:]]' \
        "$SITE" "${wheels[@]}"
    fi
    export PYTHONPATH=$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}
  else
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
  fi
  shopt -u nullglob
}
