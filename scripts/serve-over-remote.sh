#!/usr/bin/env bash
# For scripts/bench-remote.sh: starts the remote NBD server given as arguments (serving on
# the unix socket REMOTE_SOCK), then cryptblk serving the LUKS volume on that export at
# $PEER_DIR/nbd.sock (CRYPTBLK_ARGS: more options for it); stops both on SIGTERM.
# REMOTE_CPUS (a taskset list): the remote server runs on those CPUs only, as if on another host.
# CRYPTBLK_BIN: the cryptblk binary to run (default target/release/cryptblk; for A/B runs).
# usage: serve-over-remote.sh REMOTE_SOCK REMOTE_SERVER_COMMAND...
set -uo pipefail
R=$1; shift
P=${PEER_DIR:-/dev/shm/cryptblk-peer}
B=${CRYPTBLK_BIN:-$(cd "$(dirname "$0")/.." && pwd)/target/release/cryptblk}
rm -f "$R"
${REMOTE_CPUS:+taskset -c $REMOTE_CPUS} "$@" > /dev/null 2>&1 &
remote=$!
for _ in $(seq 100); do [ -S "$R" ] && break; sleep 0.1; done
"$B" open "nbd+unix:///?socket=$R" pb --nbd "unix:$P/nbd.sock" --run-dir "$P/run" \
  --key-file "$P/pw" ${CRYPTBLK_ARGS:-} > /dev/null 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null; kill $remote 2>/dev/null; wait $remote 2>/dev/null; exit 0' TERM INT
wait $server
kill $remote 2>/dev/null
