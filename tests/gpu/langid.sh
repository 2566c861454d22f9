#!/usr/bin/env bash
# The language-identification example on the lent GPU machine: real strings, a real model, real
# RabbitMQ (tests/gpu/README.md). Two benches, one after the other, on one stack:
#   1. the split job (tests/gpu/langid-split.toml) across the shaped WAN against the same job
#      inside one cluster, with the GPU's busy time per row (wan.sh; issue 30's GPU target);
#   2. the replicas job (tests/gpu/langid-replicas.toml) as synchronous data parallelism, DiLoCo
#      and Streaming DiLoCo across the shaped WAN, each cluster's compute utilisation (issue 31).
#
#   python tests/gpu/langid_carried.py save    # first, on a machine with the catalogues
#   bash tests/gpu/langid.sh                   # device call: carry [".whl", ".rabbit", ".langid"]
#
# Env: SPLIT_STEPS, SPLIT_WARMUP, SPLIT_RATES, SPLIT_DELAYS, SPLIT_CODECS, SPLIT_TIMEOUT_S (bench
# wan's); ROUNDS, REPLICAS_RATES, REPLICAS_DELAYS, MODES, REPLICAS_TIMEOUT_S (bench replicas');
# OUT (results: split/ as wan.sh writes it, replicas.log, replicas.json). Exit status: 0 when both
# benches ran. The default limits (180 s each, and about 30 s of setup) fit a 420 s device call.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ ! -s "${NEBULA_LANGID_NPZ:-.langid/langid.npz}" ]; then
  echo "!! no .langid/langid.npz: run 'python tests/gpu/langid_carried.py save' and carry .langid"; exit 2
fi
OUT=${OUT:-/tmp/langidout}
mkdir -p "$OUT/split"
status=0
JOB=tests/gpu/langid-split.toml STEPS=${SPLIT_STEPS:-400} WARMUP=${SPLIT_WARMUP:-80} RATES=${SPLIT_RATES:-60} \
  DELAYS=${SPLIT_DELAYS:-20,100} CODECS=${SPLIT_CODECS:-job} WAN_TIMEOUT_S=${SPLIT_TIMEOUT_S:-180} \
  OUT=$OUT/split bash tests/gpu/wan.sh || status=$?

source tests/gpu/stack.sh  # the stack wan.sh started: reused
set +e
timeout "${REPLICAS_TIMEOUT_S:-180}" "$PY" -m nebula_mq bench replicas tests/gpu/langid-replicas.toml --stack "$STACK" \
  --rounds "${ROUNDS:-8}" --rates "${REPLICAS_RATES:-60}" --delay-ms "${REPLICAS_DELAYS:-20}" \
  --modes "${MODES:-sync,diloco,streaming}" --json-out "$OUT/replicas.json" 2>&1 | tee "$OUT/replicas.log"
replicas=${PIPESTATUS[0]}
set -e
echo "== bench wan exit status $status, bench replicas exit status $replicas"
[ "$status" = 0 ] && [ "$replicas" = 0 ]
