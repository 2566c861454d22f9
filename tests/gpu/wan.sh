#!/usr/bin/env bash
# Issue 30's GPU target, on the lent GPU machine: does a split job across the shaped WAN keep
# the GPU as busy as the same job inside one cluster? One command, run from anywhere:
#
#   bash tests/gpu/wan.sh            (device call: carry [".whl", ".rabbit"])
#
# It installs the carried wheels (tests/gpu/fetch_wheels.sh) where the interpreter lacks them,
# unpacks the carried RabbitMQ + Erlang (tests/gpu/pack_rabbitmq.sh) where the machine has none,
# starts the local stack, samples the GPU's utilization, and runs
# `nebula-mq bench wan tests/gpu/wan-job.toml` (in-cluster row, then one row per rate x delay).
# Env: STEPS, WARMUP, RATES, DELAYS (the bench's flags), STACK (stack dir, reused if it exists),
# WAN_TIMEOUT_S (the bench's limit, 480 s: under the device call's), PYTHON, WHEELS, SITE,
# FORCE_WHEELS=1, OUT (where results go: wan.log, wan.json, gpu_util.csv, gpu_rows.txt).
# Exit status: the bench's (124: it ran past WAN_TIMEOUT_S).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/wanout}
WHEELS=${WHEELS:-.whl}
SITE=${SITE:-/tmp/site}
STACK=${STACK:-/tmp/wanstack}
ARCHIVE=${RABBIT_ARCHIVE:-.rabbit/rabbitmq-erlang.tar.xz}
JOB=tests/gpu/wan-job.toml
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 LC_ALL=C.UTF-8
HOME=$(mktemp -d)  # pip, torch and Erlang write here; nothing of the machine's own
export HOME

# The interpreter with torch: $PYTHON, else python3, else the repo's virtualenv (as check.sh).
PY=${PYTHON:-python3}
if [ -z "${PYTHON:-}" ] && ! python3 -c "import torch" 2>/dev/null && [ -x .venv/bin/python ]; then
  PY=.venv/bin/python
fi

# nebula-mq's dependencies: the interpreter's own, else the carried wheels (as check.sh; pika too,
# since this runs on real RabbitMQ).
DEPS="import numpy, ml_dtypes, msgpack, lz4, cryptography, structlog, prometheus_client, pika"
source tests/gpu/deps.sh
use_deps "$DEPS"
"$PY" -c "$DEPS"  # fail here, in one line, rather than inside a worker

# RabbitMQ and Erlang: the carried archive, unpacked into / (its scripts hard-code
# /usr/lib/erlang and /usr/lib/rabbitmq). Python's tarfile, since tar -J needs an xz binary.
if [ ! -x /usr/lib/rabbitmq/bin/rabbitmq-server ]; then
  echo "== unpacking $ARCHIVE into ${RABBIT_ROOT:-/}"
  "$PY" -c 'import sys, tarfile
with tarfile.open(sys.argv[1]) as t:
    kw = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}
    t.extractall(sys.argv[2], **kw)' "$ARCHIVE" "${RABBIT_ROOT:-/}"
fi
# Only the libraries this machine lacks come from the archive's private folder (linked one by
# one into $HOME/libs), so the Debian builds there never shadow the machine's own. ldd cannot see
# past a missing library, so look again after each round.
PRIVATE=/opt/nebula-rabbit-libs
ERTS=$(ls -d /usr/lib/erlang/erts-*/bin | head -1)
bins=("$ERTS/beam.smp" "$ERTS/erl_child_setup" "$ERTS/epmd" "$ERTS/inet_gethost" /usr/lib/erlang/lib/crypto-*/priv/lib/crypto.so)
for _ in 1 2 3; do
  missing=$(for b in "${bins[@]}"; do ldd "$b" 2>/dev/null; done | awk '/not found/ {print $1}' | sort -u)
  [ -z "$missing" ] && break
  mkdir -p "$HOME/libs"
  for lib in $missing; do
    if [ -e "$PRIVATE/$lib" ]; then ln -sf "$PRIVATE/$lib" "$HOME/libs/$lib"; else echo "!! $lib: missing, not in $PRIVATE"; fi
  done
  export LD_LIBRARY_PATH=$HOME/libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  echo "== from $PRIVATE: $(echo $missing)"
done
# The nodes are named NAME@localhost: Erlang must resolve it.
getent hosts localhost >/dev/null || echo "127.0.0.1 localhost" >> /etc/hosts

echo "== $(uname -srm), $(nproc) cores"
command -v nvidia-smi >/dev/null && nvidia-smi -L
"$PY" -c 'import sys, torch, numpy
print("==", sys.executable, sys.version.split()[0], "torch", torch.__version__, "numpy", numpy.__version__,
      "cuda", torch.cuda.is_available() and torch.cuda.get_device_name(0))'
echo "== RabbitMQ $(ls -d /usr/lib/rabbitmq/lib/rabbitmq_server-* | sed 's/.*-//'), $(cat /usr/lib/erlang/releases/*/OTP_VERSION 2>/dev/null | head -1 | sed 's/^/Erlang /')"

node_logs() {  # why a node did not start: the tail of each node's logs
  for f in "$STACK"/nodes/*/log/*.log "$STACK"/nodes/*/log/start.out; do
    [ -f "$f" ] && { echo "---- $f"; tail -n 40 "$f"; }
  done
}
if ! "$PY" -m nebula_mq stack up --stack "$STACK"; then
  echo "!! the stack did not start"; node_logs; exit 1
fi

# The GPU's utilization every 200 ms ("percent of time a kernel was running"), for the rows.
sampler=
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=timestamp,utilization.gpu --format=csv,noheader,nounits -lms 200 > "$OUT/gpu_util.csv" &
  sampler=$!
fi
trap '[ -n "$sampler" ] && kill "$sampler" 2>/dev/null || true' EXIT

# NEBULA_KEEP_BENCH keeps each row's run dir: its step history gives the measured window.
export NEBULA_KEEP_BENCH=1
started=$(date +%s)
set +e
timeout "${WAN_TIMEOUT_S:-480}" "$PY" -m nebula_mq bench wan "$JOB" --stack "$STACK" --steps "${STEPS:-200}" \
  --warmup "${WARMUP:-30}" --rates "${RATES:-60,10}" --delay-ms "${DELAYS:-20,100}" --json "$OUT/wan.json" 2>&1 \
  | tee "$OUT/wan.log"
status=${PIPESTATUS[0]}
set -e
[ -n "$sampler" ] && kill "$sampler" 2>/dev/null || true
root=$(find /tmp -maxdepth 1 -name 'nebula-bench-wan-*' -newermt "@$started" | head -1)
echo "== bench exit status $status, run dirs ${root:-none}"
if [ "$status" != 0 ] && [ -n "$root" ]; then  # why: each worker's last log lines
  for f in "$root"/*/logs/*.log; do echo "---- $f"; tail -n 15 "$f" | cut -c1-400; done
fi

# Per row, the GPU's mean utilization over the steps the bench measured (head history, after
# the warm-up), beside the in-cluster row's.
if [ -n "$root" ] && [ -s "$OUT/gpu_util.csv" ]; then
  "$PY" - "$root" "$OUT/gpu_util.csv" "${WARMUP:-30}" <<'EOF' | tee "$OUT/gpu_rows.txt" || true
import datetime, json, sys
from pathlib import Path
root, csv, warmup = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
samples = []
for line in csv.read_text().splitlines():
    try:
        stamp, util = (v.strip() for v in line.split(","))
        samples.append((datetime.datetime.strptime(stamp, "%Y/%m/%d %H:%M:%S.%f").timestamp(), float(util)))
    except ValueError:
        continue
rows = []
for d in root.iterdir():
    for hist in sorted((d / "history").glob("head*.jsonl"))[:1]:
        rows.append((d.name, [json.loads(x)["time"] for x in hist.read_text().splitlines()]))
base = None
for name, t in sorted(rows, key=lambda r: r[1][0]):  # in the order they ran: in-cluster first
    w = min(warmup, len(t) // 3)
    inside = [u for s, u in samples if t[w] <= s <= t[-1]]
    mean = sum(inside) / len(inside) if inside else float("nan")
    base = mean if base is None else base
    print(f"{name:<16} GPU busy {mean:5.1f}% ({len(inside)} samples over {t[-1] - t[w]:.1f} s)"
          f"   vs in-cluster {mean / base if base else float('nan'):.2f}x")
EOF
fi
[ -n "$root" ] && rm -rf "$root"  # the rows' checkpoints (~2 GB a row)
exit "$status"
