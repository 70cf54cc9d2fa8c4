#!/usr/bin/env bash
# Stop what the scripts started (our own PostgreSQL cluster, the demo redis-server)
# and remove .cache and .venv. Never touches a system PostgreSQL or Redis.
#   scripts/clean.sh          stop, then remove .cache and .venv
#   scripts/clean.sh --stop   only stop
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="$ROOT/.cache"
PG_DIR="$CACHE/pg"

log() { printf '[clean] %s\n' "$*"; }

# as_pg CMD...: run CMD as the cluster owner (postgres when we are root).
as_pg() {
    if [[ "$(id -u)" -eq 0 ]]; then
        (cd / && runuser -u postgres -- "$@")
    else
        "$@"
    fi
}

find_pg_ctl() {
    local f
    f="$(printf '%s\n' /usr/lib/postgresql/*/bin/pg_ctl | sort -V | tail -n 1)"
    if [[ -x "$f" ]]; then
        echo "$f"
    else
        command -v pg_ctl || true
    fi
}

stop_own_pg() {
    [[ -f "$PG_DIR/data/PG_VERSION" ]] || return 0
    local pg_ctl data
    data="$(readlink -f "$PG_DIR/data")"   # .cache/pg may be a link to /var/tmp
    pg_ctl="$(find_pg_ctl)"
    [[ -n "$pg_ctl" ]] || return 0
    if as_pg "$pg_ctl" -D "$data" status >/dev/null 2>&1; then
        log "stopping our PostgreSQL cluster ($data)"
        as_pg "$pg_ctl" -D "$data" -m fast -w stop >/dev/null
    fi
}

stop_demo_redis() {
    local pidfile="$CACHE/demo-redis.pid" pid
    [[ -f "$pidfile" ]] || return 0
    pid="$(cat "$pidfile")"
    # Only kill it if that pid is still a redis-server (pids get reused).
    if [[ "$pid" =~ ^[0-9]+$ ]] && [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == redis-server* ]]; then
        log "stopping the demo redis-server (pid $pid)"
        kill "$pid"
        for _ in $(seq 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
    fi
    rm -f "$pidfile"
}

remove_dirs() {
    # .cache/pg may be a link to /var/tmp (see prepare_pg_dir in setup.sh).
    if [[ -L "$PG_DIR" ]]; then
        rm -rf "$(readlink -f "$PG_DIR")"
    fi
    log "removing .cache and .venv"
    rm -rf "$CACHE" "$ROOT/.venv"
}

stop_own_pg
stop_demo_redis
[[ "${1:-}" == --stop ]] || remove_dirs
