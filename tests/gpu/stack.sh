# Sourced by wan.sh and langid.sh on the lent GPU machine: nebula-mq's dependencies (the carried
# wheels where the interpreter lacks them), RabbitMQ and Erlang (the carried archive where the
# machine has none), then the local stack (two TLS nodes joined by federation), started once per
# call and reused by the next script. Sets PY, OUT, STACK; defines start_sampler / stop_sampler
# (nvidia-smi's utilization every 200 ms into $OUT/gpu_util.csv) and gpu_rows.
OUT=${OUT:-/tmp/wanout}
WHEELS=${WHEELS:-.whl}
SITE=${SITE:-/tmp/site}
STACK=${STACK:-/tmp/wanstack}
ARCHIVE=${RABBIT_ARCHIVE:-.rabbit/rabbitmq-erlang.tar.xz}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 LC_ALL=C.UTF-8
HOME=${GPU_HOME:-/tmp/nebula-gpu-home}  # pip, torch and Erlang (its cookie) write here: one for every script of a call
mkdir -p "$HOME"
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

sampler=
start_sampler() {  # "percent of time a kernel was running", every 200 ms
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=timestamp,utilization.gpu --format=csv,noheader,nounits -lms 200 >> "$OUT/gpu_util.csv" &
    sampler=$!
  fi
}
stop_sampler() { if [ -n "$sampler" ]; then kill "$sampler" 2>/dev/null || true; sampler=; fi; }
trap stop_sampler EXIT
