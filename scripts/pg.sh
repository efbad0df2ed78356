#!/usr/bin/env bash
# A throwaway PostgreSQL for the tests: `pg.sh start` prints its URL,
# `pg.sh stop` stops it and removes its data. Loopback only.
set -euo pipefail
DIR=${RIFT_PG_DIR:-/tmp/rift-pg}
PORT=${RIFT_PG_PORT:-55439}
BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1)
[ -n "$BIN" ] || { echo "pg.sh: no PostgreSQL server installed" >&2; exit 1; }
RUN=(); [ "$(id -u)" -eq 0 ] && RUN=(runuser -u postgres --)

case "${1:-}" in
  start)
    if "${RUN[@]}" "$BIN/pg_ctl" -D "$DIR" status >/dev/null 2>&1; then
      "${RUN[@]}" "$BIN/pg_ctl" -D "$DIR" -m immediate stop >/dev/null 2>&1 || true
    fi
    rm -rf "$DIR"; mkdir -p "$DIR"
    [ "$(id -u)" -eq 0 ] && chown postgres:postgres "$DIR"
    "${RUN[@]}" "$BIN/initdb" -D "$DIR" -U postgres -A trust >/dev/null
    "${RUN[@]}" "$BIN/pg_ctl" -D "$DIR" -l "$DIR/log" -w -t 30 \
      -o "-p $PORT -k $DIR -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200" \
      start >/dev/null
    "${RUN[@]}" "$BIN/createdb" -h 127.0.0.1 -p "$PORT" -U postgres rift_test
    echo "postgresql+psycopg://postgres@127.0.0.1:$PORT/rift_test"
    ;;
  stop)
    "${RUN[@]}" "$BIN/pg_ctl" -D "$DIR" -m fast stop >/dev/null 2>&1 || true
    rm -rf "$DIR"
    ;;
  *) echo "usage: pg.sh start|stop" >&2; exit 2 ;;
esac
