#!/usr/bin/env bash
# Run the demo: scripts/demo.sh [args for "manage.py demo"...]
#
#   DEMO_DATABASE=postgres   use the PostgreSQL from scripts/setup.sh (.cache/env.sh)
#   DATABASE_URL=...         use this database (docs/operations.md, "The demo"); default: SQLite
#   REDIS_URL=...            default redis://127.0.0.1:6379/0; if nothing answers there and
#                            the host is local, a private redis-server is started on that port
#                            (pid file .cache/demo-redis.pid; "make clean" stops it).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="$ROOT/.cache"
VPY="$ROOT/.venv/bin/python"
export REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379/0}"

log() { printf '[demo] %s\n' "$*"; }
die() { printf '[demo] ERROR: %s\n' "$*" >&2; exit 1; }

choose_database() {
    if [[ "${DEMO_DATABASE:-}" == postgres ]]; then
        # shellcheck source=/dev/null
        . "$CACHE/env.sh"
        log "database: PostgreSQL ($DATABASE_URL)"
    elif [[ -n "${DATABASE_URL:-}" ]]; then
        log "database: DATABASE_URL from the environment ($DATABASE_URL)"
    else
        unset DATABASE_URL
        log "database: SQLite (set DEMO_DATABASE=postgres for PostgreSQL)"
    fi
}

# Prints "HOST PORT" from REDIS_URL.
redis_host_port() {
    "$VPY" - <<'PY'
import os
from urllib.parse import urlsplit
u = urlsplit(os.environ["REDIS_URL"])
print(u.hostname or "127.0.0.1", u.port or 6379)
PY
}

# redis_answers HOST PORT: true when a Redis server answers there (an auth error counts).
redis_answers() {
    "$VPY" - "$1" "$2" <<'PY'
import sys
import redis
r = redis.Redis(host=sys.argv[1], port=int(sys.argv[2]), socket_timeout=1, socket_connect_timeout=1)
try:
    r.ping()
except (redis.ConnectionError, redis.TimeoutError):
    sys.exit(1)
except redis.RedisError:
    pass  # e.g. NOAUTH: something is there
PY
}

start_demo_redis() {
    local port="$1"
    log "starting redis-server on 127.0.0.1:$port (pid file .cache/demo-redis.pid)"
    mkdir -p "$CACHE"
    redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --daemonize yes \
        --dir "$CACHE" --pidfile "$CACHE/demo-redis.pid" --logfile "$CACHE/demo-redis.log" \
        || die "redis-server failed to start (log: .cache/demo-redis.log)"
    for _ in $(seq 50); do
        redis_answers 127.0.0.1 "$port" && return 0
        sleep 0.2
    done
    die "redis-server on port $port does not answer PING (log: .cache/demo-redis.log)"
}

ensure_redis() {
    local host port hp
    hp="$(redis_host_port)" || die "cannot parse REDIS_URL=$REDIS_URL"
    read -r host port <<<"$hp"
    if redis_answers "$host" "$port"; then
        log "redis: $REDIS_URL answers"
        return 0
    fi
    case "$host" in
        127.0.0.1 | localhost) start_demo_redis "$port" ;;
        *) die "nothing answers at $REDIS_URL (not local, so not starting one)" ;;
    esac
}

main() {
    cd "$ROOT"
    bash scripts/setup.sh
    choose_database
    ensure_redis
    "$VPY" manage.py migrate --noinput
    exec "$VPY" manage.py demo "$@"
}

main "$@"
