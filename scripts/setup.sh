#!/usr/bin/env bash
# One-command setup for stock_locks (Debian 12, Python >= 3.11; root or not).
#
#   scripts/setup.sh                 venv + deps, redis-server, zookeeper and chromium binaries,
#                                    PostgreSQL -> .cache/env.sh
#   scripts/setup.sh --no-services   venv + deps only (enough for lint)
#   scripts/setup.sh --lowest        also .cache/venv-lowest: the lowest versions pyproject.toml
#                                    allows (requirements-min.txt), for the second test run
#
# Environment:
#   PYTHON=...             interpreter used to create .venv (default: python3)
#   DATABASE_URL=...       use this database as is (it must connect); never overridden
#   STOCK_LOCKS_OWN_PG=1   skip the existing servers and use a throwaway cluster in .cache/pg
#   STOCK_LOCKS_CHROMIUM=  the Chromium the browser test drives (default: Debian's /usr/bin/chromium)
#
# Idempotent: a second run re-installs nothing and reuses the running cluster.
# It never stops or reconfigures a system PostgreSQL or Redis, and binds only 127.0.0.1.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
VPY="$VENV/bin/python"
CACHE="$ROOT/.cache"
VENV_LOWEST="$CACHE/venv-lowest"
STAMP_NAME=".stock_locks-install.sha256"
ENV_FILE="$CACHE/env.sh"
PG_DIR="$CACHE/pg"
PG_DB="stock_locks"
PYTHON="${PYTHON:-python3}"

APT_UPDATED=0
DB_URL=""   # result of the PostgreSQL step
PG_BIN=""   # directory holding initdb/pg_ctl for our own cluster

log() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }
is_root() { [[ "$(id -u)" -eq 0 ]]; }

usage() {
    sed -n '2,16s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"
}

# --------------------------------------------------------------------------- apt

# apt_install PKG...: install Debian packages when root, else print the command and exit 1.
apt_install() {
    if ! is_root; then
        printf '[setup] ERROR: missing %s. Install it with:\n' "$*" >&2
        printf '    sudo apt-get install -y %s\n' "$*" >&2
        printf '[setup] (run "sudo apt-get update" first if apt cannot find it), then re-run %s\n' \
            "scripts/setup.sh" >&2
        exit 1
    fi
    command -v apt-get >/dev/null || die "apt-get not found; install $* by hand"
    mkdir -p "$CACHE"
    local apt_log="$CACHE/apt.log"
    if [[ "$APT_UPDATED" -eq 0 ]]; then
        log "apt-get update"
        apt-get update -qq >"$apt_log" 2>&1 9>&- || apt_failed "apt-get update" "$apt_log"
        APT_UPDATED=1
    fi
    log "apt-get install $* (log: .cache/apt.log)"
    # 9>&-: a service started by the package's postinst must not inherit our lock.
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" \
        >>"$apt_log" 2>&1 9>&- || apt_failed "apt-get install $*" "$apt_log"
}

apt_failed() {
    tail -n 30 "$2" >&2
    die "$1 failed (full output: $2)"
}

# --------------------------------------------------------------------------- python / venv

# python_ok PY: true when PY runs and is Python >= 3.11.
python_ok() {
    "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null
}

check_python() {
    command -v "$PYTHON" >/dev/null 2>&1 || die "interpreter '$PYTHON' not found; set PYTHON=/path/to/python3.11"
    if ! python_ok "$PYTHON"; then
        local ver
        ver="$("$PYTHON" -c 'import platform; print(platform.python_version())' 2>/dev/null || echo '?')"
        die "Python >= 3.11 is required, but '$PYTHON' is $ver; set PYTHON=/path/to/python3.11"
    fi
}

# Debian splits venv/ensurepip into python3-venv.
ensure_venv_module() {
    "$PYTHON" -c 'import venv, ensurepip' 2>/dev/null && return 0
    local minor
    minor="$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
    log "the venv module of $PYTHON is missing (Debian: python${minor}-venv)"
    apt_install "python${minor}-venv"
}

# ensure_venv DIR: a virtualenv in DIR with a usable Python (recreated when broken).
ensure_venv() {
    local dir="$1"
    if [[ -d "$dir" ]] && ! python_ok "$dir/bin/python"; then
        log "removing broken or outdated ${dir#"$ROOT/"}"
        rm -rf "$dir"
    fi
    [[ -d "$dir" ]] && return 0
    check_python
    ensure_venv_module
    log "creating ${dir#"$ROOT/"} with $("$PYTHON" -c 'import sys; print(sys.executable)')"
    if ! "$PYTHON" -m venv "$dir"; then
        rm -rf "$dir"
        die "could not create ${dir#"$ROOT/"}"
    fi
}

# ensure_deps DIR REQUIREMENTS TARGET: pip install -r REQUIREMENTS -e TARGET into DIR,
# unless the same files were installed there with the same interpreter already.
ensure_deps() {
    local dir="$1" requirements="$2" target="$3" want stamp="$1/$STAMP_NAME"
    want="$(cd "$ROOT" && sha256sum "$requirements" pyproject.toml && "$dir/bin/python" -V \
        && echo "$target")"
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
        return 0
    fi
    log "installing $requirements and the package ($target, editable) into ${dir#"$ROOT/"}"
    rm -f "$stamp"
    (cd "$ROOT" && "$dir/bin/python" -m pip install -q --disable-pip-version-check \
        -r "$requirements" -e "$target") || die "pip install failed (see the errors above)"
    printf '%s\n' "$want" >"$stamp"
}

# --------------------------------------------------------------------------- redis

ensure_redis_binary() {
    command -v redis-server >/dev/null 2>&1 && return 0
    log "redis-server not found"
    apt_install redis-server
    command -v redis-server >/dev/null 2>&1 || die "redis-server still not on PATH after install"
}

# --------------------------------------------------------------------------- zookeeper

# The ZooKeeper backend's tests start private servers from Debian's package (its jar
# /usr/share/java/zookeeper.jar; java comes as a dependency). Nothing is started here.
ensure_zookeeper() {
    [[ -f /usr/share/java/zookeeper.jar ]] && command -v java >/dev/null 2>&1 && return 0
    log "zookeeper (Debian's package) not found (the ZooKeeper backend's tests need it)"
    apt_install zookeeper
    [[ -f /usr/share/java/zookeeper.jar ]] || die "/usr/share/java/zookeeper.jar still missing after install"
}

# --------------------------------------------------------------------------- chromium

CHROMIUM=""   # result of the Chromium step

# The admin dashboard's browser test drives Debian's Chromium through Playwright.
# Playwright's own browser download (`playwright install`) is never used.
ensure_chromium() {
    if [[ -n "${STOCK_LOCKS_CHROMIUM:-}" ]]; then
        [[ -x "$STOCK_LOCKS_CHROMIUM" ]] \
            || die "STOCK_LOCKS_CHROMIUM=$STOCK_LOCKS_CHROMIUM is not an executable file" \
                "(if it came from sourcing .cache/env.sh: unset STOCK_LOCKS_CHROMIUM)"
        CHROMIUM="$STOCK_LOCKS_CHROMIUM"
        return 0
    fi
    if [[ ! -x /usr/bin/chromium ]]; then
        log "chromium not found (the admin dashboard's browser test needs it)"
        apt_install chromium
        [[ -x /usr/bin/chromium ]] || die "/usr/bin/chromium still missing after installing chromium"
    fi
    CHROMIUM=/usr/bin/chromium
}

# --------------------------------------------------------------------------- postgres helpers (psycopg)

# pg_connects URL [quiet]: true when URL accepts a connection within 3 s.
pg_connects() {
    PG_URL="$1" PG_QUIET="${2:-}" "$VPY" - <<'PY'
import os, sys
import psycopg
try:
    psycopg.connect(os.environ["PG_URL"], connect_timeout=3).close()
except Exception as exc:  # noqa: BLE001
    if not os.environ["PG_QUIET"]:
        print(f"[setup]   {type(exc).__name__}: {str(exc).strip()}", file=sys.stderr)
    sys.exit(1)
PY
}

# pg_create_db ADMIN_URL NAME: CREATE DATABASE NAME unless it exists.
pg_create_db() {
    PG_URL="$1" PG_NAME="$2" "$VPY" - <<'PY'
import os
import psycopg
from psycopg import sql

name = os.environ["PG_NAME"]
with psycopg.connect(os.environ["PG_URL"], connect_timeout=3, autocommit=True) as conn:
    if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
        raise SystemExit(0)
    try:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        print(f"[setup] created database {name}")
    except psycopg.errors.DuplicateDatabase:
        pass
PY
}

free_port() {
    "$VPY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# port_free PORT: true when nothing listens on 127.0.0.1:PORT.
port_free() {
    "$VPY" - "$1" <<'PY'
import socket, sys
s = socket.socket()
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:
    sys.exit(1)
PY
}

# --------------------------------------------------------------------------- own throwaway cluster

find_pg_bin() {
    local initdb
    initdb="$(find_initdb)"
    if [[ -z "$initdb" ]]; then
        log "PostgreSQL server binaries (initdb) not found"
        apt_install postgresql
        initdb="$(find_initdb)"
        [[ -n "$initdb" ]] || die "initdb still not found under /usr/lib/postgresql/*/bin"
    fi
    PG_BIN="$(dirname "$initdb")"
}

find_initdb() {
    local f
    f="$(printf '%s\n' /usr/lib/postgresql/*/bin/initdb | sort -V | tail -n 1)"
    if [[ -x "$f" ]]; then
        echo "$f"
    elif command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
        command -v initdb
    fi
}

# as_pg CMD...: run CMD as the cluster owner (postgres when we are root; initdb/pg_ctl refuse root).
as_pg() {
    if is_root; then
        (cd / && runuser -u postgres -- "$@")
    else
        "$@"
    fi
}

ensure_postgres_user() {
    is_root || return 0
    getent passwd postgres >/dev/null && return 0
    log "creating the 'postgres' system user (the package did not)"
    useradd --system --user-group --home-dir /var/lib/postgresql --no-create-home \
        --shell /usr/sbin/nologin postgres || die "could not create the postgres user"
}

# When root, the postgres user must be able to reach .cache/pg. If a parent directory
# (e.g. /root) is closed to it, keep the cluster in /var/tmp and link .cache/pg there.
prepare_pg_dir() {
    mkdir -p "$CACHE"
    if ! is_root; then
        mkdir -p "$PG_DIR"
        chmod 700 "$PG_DIR"
        return 0
    fi
    if [[ -L "$PG_DIR" && ! -d "$PG_DIR" ]]; then
        rm -f "$PG_DIR"   # dangling link (e.g. /var/tmp was cleaned)
    fi
    if [[ ! -e "$PG_DIR" ]]; then
        mkdir -p "$PG_DIR"
        if ! runuser -u postgres -- test -x "$PG_DIR"; then
            rmdir "$PG_DIR"
            local far
            far="/var/tmp/stock-locks-pg-$(printf '%s' "$ROOT" | sha256sum | cut -c1-12)"
            log "the postgres user cannot reach $CACHE; keeping the cluster in $far"
            mkdir -p "$far"
            ln -s "$far" "$PG_DIR"
        fi
    fi
    PG_DIR="$(readlink -f "$PG_DIR")"   # from here on, a path the postgres user can use
    chown postgres: "$PG_DIR"
    chmod 700 "$PG_DIR"
    runuser -u postgres -- test -w "$PG_DIR" || die "the postgres user cannot write to $PG_DIR"
}

pg_running() {
    as_pg "$PG_BIN/pg_ctl" -D "$PG_DIR/data" status >/dev/null 2>&1
}

init_cluster() {
    # initdb.done, not PG_VERSION: an interrupted initdb leaves PG_VERSION behind.
    [[ -f "$PG_DIR/initdb.done" && -f "$PG_DIR/data/PG_VERSION" ]] && return 0
    rm -rf "$PG_DIR/data"
    log "initdb $PG_DIR/data (trust auth, superuser postgres)"
    as_pg "$PG_BIN/initdb" -D "$PG_DIR/data" --auth=trust -U postgres -E UTF8 \
        >"$PG_DIR/initdb.log" 2>&1 || { cat "$PG_DIR/initdb.log" >&2; die "initdb failed"; }
    touch "$PG_DIR/initdb.done"
}

# Unix socket in .cache/pg, unless its path is too long or unsafe to quote (then TCP only).
socket_dir() {
    local dir="$PG_DIR"
    if [[ "$dir" == *"'"* || ${#dir} -gt 90 ]]; then
        echo ""
    else
        echo "$dir"
    fi
}

start_cluster() {
    local port=""
    [[ -f "$PG_DIR/port" ]] && port="$(cat "$PG_DIR/port")"
    if [[ ! "$port" =~ ^[0-9]+$ ]] || ! port_free "$port"; then
        port="$(free_port)"
    fi
    log "starting our PostgreSQL on 127.0.0.1:$port (log: $PG_DIR/log)"
    # 9>&-: the postmaster must not inherit (and so hold forever) our lock.
    if ! as_pg "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/log" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -p $port -k '$(socket_dir)'" start >/dev/null 9>&-; then
        tail -n 20 "$PG_DIR/log" >&2 || true
        die "pg_ctl start failed"
    fi
    echo "$port" >"$PG_DIR/port"
}

# Port of the running postmaster (4th line of postmaster.pid).
running_port() {
    sed -n 4p "$PG_DIR/data/postmaster.pid" 2>/dev/null || true
}

# Reuse the running postmaster, or start it. A postmaster that was just killed can still
# look alive for a moment, and one recovering from a crash refuses connections: wait.
ensure_cluster_up() {
    local port
    for _ in $(seq 40); do
        if ! pg_running; then
            start_cluster
        fi
        port="$(running_port)"
        if [[ "$port" =~ ^[0-9]+$ ]] && pg_connects "postgres://postgres@127.0.0.1:$port/postgres" quiet; then
            echo "$port" >"$PG_DIR/port"
            return 0
        fi
        sleep 0.5
    done
    die "our cluster on port $port does not answer (log: $PG_DIR/log)"
}

use_own_cluster() {
    find_pg_bin
    ensure_postgres_user
    prepare_pg_dir
    init_cluster
    ensure_cluster_up
    local port
    port="$(cat "$PG_DIR/port")"
    pg_create_db "postgres://postgres@127.0.0.1:$port/postgres" "$PG_DB"
    DB_URL="postgres://postgres@127.0.0.1:$port/$PG_DB"
}

# --------------------------------------------------------------------------- choose the database

choose_database() {
    if [[ -n "${DATABASE_URL:-}" ]]; then
        local hint="(if it came from sourcing .cache/env.sh: unset DATABASE_URL)"
        [[ "${STOCK_LOCKS_OWN_PG:-}" == 1 ]] \
            && die "STOCK_LOCKS_OWN_PG=1 and DATABASE_URL are both set; unset one $hint"
        case "$DATABASE_URL" in
            postgres://* | postgresql://*)
                pg_connects "$DATABASE_URL" \
                    || die "DATABASE_URL=$DATABASE_URL is set but does not connect $hint"
                ;;
            *) log "DATABASE_URL is not a PostgreSQL URL; using it unchecked" ;;
        esac
        DB_URL="$DATABASE_URL"
        return 0
    fi
    if [[ "${STOCK_LOCKS_OWN_PG:-}" != 1 ]]; then
        local admin="postgres://postgres@127.0.0.1:5432/postgres"
        if pg_connects "$admin" quiet; then
            pg_create_db "$admin" "$PG_DB"
            DB_URL="postgres://postgres@127.0.0.1:5432/$PG_DB"
            return 0
        fi
        log "no PostgreSQL with trust auth on 127.0.0.1:5432; using a throwaway cluster"
    fi
    use_own_cluster
}

write_env_file() {
    mkdir -p "$CACHE"
    local tmp="$ENV_FILE.tmp.$$"
    {
        echo "# Written by scripts/setup.sh; safe to source more than once."
        printf 'export DATABASE_URL=%q\n' "$DB_URL"
        printf 'export STOCK_LOCKS_CHROMIUM=%q\n' "$CHROMIUM"
    } >"$tmp"
    mv -f "$tmp" "$ENV_FILE"
}

# --------------------------------------------------------------------------- main

# Serialise concurrent runs (make -j, two terminals). Commands that may leave a
# daemon behind run with 9>&- so that the daemon does not keep the lock.
take_lock() {
    mkdir -p "$CACHE"
    command -v flock >/dev/null 2>&1 || return 0
    exec 9>"$CACHE/setup.lock"
    if ! flock -w 600 9; then
        die "another scripts/setup.sh holds $CACHE/setup.lock (see: fuser -v $CACHE/setup.lock)"
    fi
}

main() {
    local services=1 lowest=0
    for arg in "$@"; do
        case "$arg" in
            --no-services) services=0 ;;
            --lowest) lowest=1 ;;
            -h | --help) usage; exit 0 ;;
            *) die "unknown option: $arg (see --help)" ;;
        esac
    done
    cd "$ROOT"
    take_lock
    ensure_venv "$VENV"
    ensure_deps "$VENV" requirements.txt .
    if [[ "$lowest" -eq 1 ]]; then
        ensure_venv "$VENV_LOWEST"
        ensure_deps "$VENV_LOWEST" requirements-min.txt ".[celery]"
    fi
    [[ "$services" -eq 1 ]] || { log "venv ready (--no-services)"; return 0; }
    ensure_redis_binary
    ensure_zookeeper
    ensure_chromium
    choose_database
    write_env_file
    log "ready: DATABASE_URL=$DB_URL STOCK_LOCKS_CHROMIUM=$CHROMIUM (source .cache/env.sh)"
}

main "$@"
