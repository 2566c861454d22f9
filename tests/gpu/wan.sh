#!/usr/bin/env bash
# Issue 30's GPU target, on the lent GPU machine: does a split job across the shaped WAN keep
# the GPU as busy as the same job inside one cluster? One command, run from anywhere:
#
#   bash tests/gpu/wan.sh            (device call: carry [".whl", ".rabbit"])
#
# It installs the carried wheels (tests/gpu/fetch_wheels.sh) where the interpreter lacks them,
# unpacks the carried RabbitMQ + Erlang (tests/gpu/pack_rabbitmq.sh) where the machine has none,
# starts the local stack, samples the GPU's utilization, and runs
# `nebula-mq bench wan tests/gpu/wan-job.toml` (in-cluster row, then one row per rate x delay);
# the setup is stack.sh's, shared with langid.sh.
# Env: JOB (the job file), STEPS, WARMUP, RATES, DELAYS, CODECS (the bench's flags), STACK (stack dir, reused if it exists),
# WAN_TIMEOUT_S (the bench's limit, 480 s: under the device call's), PYTHON, WHEELS, SITE,
# FORCE_WHEELS=1, OUT (where results go: wan.log, wan.json, gpu_util.csv, gpu_rows.txt).
# Exit status: the bench's (124: it ran past WAN_TIMEOUT_S).
set -euo pipefail
cd "$(dirname "$0")/../.."
JOB=${JOB:-tests/gpu/wan-job.toml}
source tests/gpu/stack.sh
start_sampler

# NEBULA_KEEP_BENCH keeps each row's run dir: its step history gives the measured window.
export NEBULA_KEEP_BENCH=1
started=$(date +%s)
set +e
timeout "${WAN_TIMEOUT_S:-480}" "$PY" -m nebula_mq bench wan "$JOB" --stack "$STACK" --steps "${STEPS:-200}" \
  --warmup "${WARMUP:-30}" --rates "${RATES:-60,10}" --delay-ms "${DELAYS:-20,100}" --codecs "${CODECS:-job}" --json "$OUT/wan.json" 2>&1 \
  | tee "$OUT/wan.log"
status=${PIPESTATUS[0]}
set -e
stop_sampler
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
