#!/usr/bin/env bash
# Download, on a machine with the package registry, the wheels a bare GPU machine (Python 3.12,
# x86-64, PyTorch preinstalled, no network) lacks to run tests/gpu/check.sh: nebula-mq's runtime
# dependencies that the torch split path imports over the in-memory transport (pika is not
# imported there: it is RabbitMQ's client, carried anyway because it is small and pure Python).
#
#   bash tests/gpu/fetch_wheels.sh                  # cp312 wheels into .whl/ (ignored by git)
#   PYVER=3.11 DEST=/tmp/whl311 bash tests/gpu/fetch_wheels.sh   # for a local bare-venv test
#
# The pins are the versions the repository's virtualenv tests with.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
PYVER=${PYVER:-3.12}
DEST=${DEST:-.whl}
PINS=(
  numpy==2.4.6
  ml_dtypes==0.6.0
  msgpack==1.2.4
  lz4==4.4.5
  cryptography==50.0.2
  cffi==2.1.1
  structlog==26.1.0
  prometheus_client==0.26.0
  pika==1.4.4
)
mkdir -p "$DEST"
for pin in "${PINS[@]}"; do
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$DEST" "$pin" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
done
ls -l "$DEST"/*.whl | awk '{print $5, $NF}'
du -sh "$DEST"
