#!/usr/bin/env bash
# A throwaway single-node Ceph cluster for the RBD tests and benchmarks, from Debian's
# packages (ceph-mon, ceph-osd, ceph-common): no systemd, no containers, cephx off, one
# monitor on 127.0.0.1, one OSD keeping its objects in memory (memstore), pools of size 1.
#
#   tests/ceph/cluster.sh start DIR   # prints the ceph.conf path; pids in DIR/*.pid
#   tests/ceph/cluster.sh stop DIR    # stops the daemons by pid, removes DIR
#
# The OSD holds at most CEPH_MEMSTORE_BYTES (default 2 GiB) of objects, in memory.
# CEPH_PLUGIN_DIR, CEPH_CLASS_DIR: where Ceph's plugins and the OSD's object classes are
# when not where its packages put them (a carried copy: scripts/device-bundle.sh).
#
# Everything (config, monitor store, logs, sockets) lives in DIR; nothing is written
# elsewhere. Clients use it with CEPH_CONF=DIR/ceph.conf (or --ceph-conf).
set -euo pipefail
cmd=${1:?usage: cluster.sh start|stop DIR}
DIR=${2:?usage: cluster.sh start|stop DIR}

stop() {
  for f in "$DIR"/osd.pid "$DIR"/mon.pid; do
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  done
  rm -rf "$DIR"
}

if [ "$cmd" = stop ]; then stop; exit 0; fi
[ "$cmd" = start ] || { echo "usage: cluster.sh start|stop DIR" >&2; exit 2; }
for t in ceph-mon ceph-osd rados monmaptool ceph-authtool; do
  command -v "$t" >/dev/null || { echo "$t not found: install ceph-mon ceph-osd ceph-common (scripts/setup.sh does)" >&2; exit 1; }
done
# Monitor commands through librados' C API: the `ceph` tool's Python bindings are built for
# one Python version, and this also runs where Debian's Ceph was carried to another system.
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$DIR"
chmod 700 "$DIR"
DIR=$(cd "$DIR" && pwd)
# A free loopback port for the monitor (v1 protocol only: one address, no msgr2 dance).
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
fsid=$(python3 -c 'import uuid; print(uuid.uuid4())')
conf=$DIR/ceph.conf
cat > "$conf" <<CONF
[global]
fsid = $fsid
mon host = v1:127.0.0.1:$port
mon initial members = a
auth cluster required = none
auth service required = none
auth client required = none
auth allow insecure global id reclaim = false
ms bind msgr2 = false
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
osd objectstore = memstore
memstore device bytes = ${CEPH_MEMSTORE_BYTES:-2147483648}
osd max object name len = 256
osd max object namespace len = 64
osd crush chooseleaf type = 0
run dir = $DIR/run
keyring = $DIR/keyring
# Clients (librbd in the tests, the rbd and rados tools) keep no admin socket or log file.
admin socket =
log file = /dev/null
mon data avail warn = 1
# A client killed with its image's exclusive lock held keeps the next one out until its
# watch expires (30 s by default); clients renew theirs every 5 s.
osd client watch timeout = 10
# The OSD places itself in the CRUSH map at start with two monitor commands of its own,
# which now and then went out with a monitor map it did not yet have ("wrong fsid": the OSD
# exits, five starts in a row in one CI run). This script places it instead (osd crush add).
osd crush update on start = false
osd class update on start = false
${CEPH_PLUGIN_DIR:+plugin dir = $CEPH_PLUGIN_DIR}
${CEPH_PLUGIN_DIR:+erasure code dir = $CEPH_PLUGIN_DIR/erasure-code}
${CEPH_CLASS_DIR:+osd class dir = $CEPH_CLASS_DIR}
[mon.a]
mon data = $DIR/mon
admin socket = $DIR/run/mon.a.asok
log file = $DIR/log/mon.a.log
pid file = $DIR/mon.pid
[osd.0]
osd data = $DIR/osd0
admin socket = $DIR/run/osd.0.asok
log file = $DIR/log/osd.0.log
pid file = $DIR/osd.pid
CONF
mkdir -p "$DIR/run" "$DIR/log" "$DIR/mon" "$DIR/osd0"
ceph-authtool --create-keyring "$DIR/keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
monmaptool --create --add a "v1:127.0.0.1:$port" --fsid "$fsid" "$DIR/monmap" >/dev/null
ceph-mon -c "$conf" --mkfs -i a --monmap "$DIR/monmap" --keyring "$DIR/keyring"
ceph-mon -c "$conf" -i a
mon() { python3 "$HERE/mon_command.py" "$conf" "$1"; }
# The OSD is made with the uuid the monitor has for osd.0: one it had made up on its own
# ("osd create" without one) made the OSD's boot fail now and then with "wrong fsid".
osd_uuid=$(python3 -c 'import uuid; print(uuid.uuid4())')
mon "{\"prefix\": \"osd create\", \"uuid\": \"$osd_uuid\", \"id\": 0}" >/dev/null
mon '{"prefix": "osd crush add", "id": 0, "weight": 1.0, "args": ["host=localhost", "root=default"]}' >/dev/null
ceph-osd -c "$conf" -i 0 --mkfs --osd-uuid "$osd_uuid" 2>/dev/null
# It daemonizes; its complaints are in DIR/log/osd.0.log. A start that fails is tried
# again: with its own CRUSH commands off (above), none has failed in 24 starts three at a
# time on two loaded CPUs.
started=
for _ in 1 2 3 4 5; do
  if ceph-osd -c "$conf" -i 0 2>/dev/null; then started=1; break; fi
  sleep 0.5
done
[ -n "$started" ] ||
  { echo "ceph-osd did not start:" >&2; tail -n 20 "$DIR/log/osd.0.log" >&2; exit 1; }
mon '{"prefix": "osd pool create", "pool": "rbd", "pg_num": 8}' >/dev/null
mon '{"prefix": "osd pool application enable", "pool": "rbd", "app": "rbd"}' >/dev/null
# Ready when an object can be written (no manager runs, so no placement-group stats).
for _ in $(seq 150); do
  if timeout 10 rados -c "$conf" -p rbd put cluster-ready /dev/null 2>/dev/null; then
    rados -c "$conf" -p rbd rm cluster-ready 2>/dev/null
    echo "$conf"
    exit 0
  fi
  sleep 0.2
done
echo "the test cluster did not come up (logs in $DIR/log):" >&2
tail -n 20 "$DIR/log/osd.0.log" >&2
exit 1
