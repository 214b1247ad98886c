#!/usr/bin/env bash
# NBD over TLS against plaintext NBD, 128 KiB sequential, one cryptblk server answering
# both (`--tls optional`) on TCP loopback, the LUKS1 image of scripts/peer-bench.sh in
# tmpfs. Two clients, each reading the whole export and writing it from a tmpfs file:
# - nbdcopy (libnbd; GnuTLS for nbds://): --request-size=131072, one connection, 8 requests
#   in flight, reading to null:;
# - cryptblk itself (rustls for the handshake, its own record layer): `cryptblk export` /
#   `import` of the export as a cipher_null plain volume, REQUEST_SIZE requests (default
#   128K, as nbdcopy's; 1M before session 20), four in flight (one before session 19).
# Plaintext and TLS alternate, ROUNDS rounds; printed: every figure, then the medians, the
# TLS ÷ plaintext ratios, and the CPU seconds per GB of the server and of the client (so
# what TLS costs each side shows even where both share the CPUs).
# With cores to spare, SERVER_CPUS and CLIENT_CPUS (taskset lists) keep the two apart.
# CONNECTIONS: nbdcopy's connections (default 1; nbdcopy alone would open 4 where the server
# offers multi-conn, as cryptblk's does, each with its own TLS session).
# CRYPTBLK_BIN: the cryptblk binary, server and client (default target/release/cryptblk).
# usage: [ROUNDS=3] [CLIENTS="nbdcopy cryptblk"] [CONNECTIONS=1] [REQUEST_SIZE=128K] scripts/bench-tls.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
B=${CRYPTBLK_BIN:-$PWD/target/release/cryptblk}
[ -x "$B" ] || cargo build --release -p cryptblk >/dev/null
# Empty: no --request-size (the binary's default, 1M; binaries before session 20 lack it).
REQ=${REQUEST_SIZE-128K}
P=${PEER_DIR:-/dev/shm/cryptblk-peer}; export PEER_DIR=$P
# The image (and raw.img) are made by peer-bench.sh on first use; make them the same way.
[ -f "$P/luks1.img" ] || NO_BUILTIN_PEERS=1 bash scripts/peer-bench.sh 1 >/dev/null 2>&1 || true
[ -f "$P/luks1.img" ] || { echo "bench-tls: no $P/luks1.img" >&2; exit 1; }
W=$(mktemp -d /dev/shm/cryptblk-tls.XXXXXX); OUT=$(mktemp)
SRV=""
cleanup() { [ -n "$SRV" ] && kill "$SRV" 2>/dev/null; rm -rf "$W" "$OUT"; }
trap cleanup EXIT
# A throwaway CA and a server certificate for 127.0.0.1.
openssl req -x509 -days 1 -subj /CN=bench-ca -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
  -keyout "$W/ca-key.pem" -out "$W/ca-cert.pem" -addext basicConstraints=critical,CA:TRUE 2>/dev/null
openssl req -subj /CN=localhost -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
  -keyout "$W/server-key.pem" -out "$W/server.csr" 2>/dev/null
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' > "$W/ext"
openssl x509 -req -days 1 -in "$W/server.csr" -CA "$W/ca-cert.pem" -CAkey "$W/ca-key.pem" \
  -CAcreateserial -extfile "$W/ext" -out "$W/server-cert.pem" 2>/dev/null
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
${SERVER_CPUS:+taskset -c $SERVER_CPUS} "$B" open "$P/luks1.img" tl --key-file "$P/pw" --run-dir "$W/run" --nbd "tcp:127.0.0.1:$PORT" \
  --tls optional --tls-cert "$W/server-cert.pem" --tls-key "$W/server-key.pem" >/dev/null 2>&1 &
SRV=$!
for _ in $(seq 100); do nbdinfo --size "nbd://127.0.0.1:$PORT/tl" >/dev/null 2>&1 && break; sleep 0.1; done
SIZE=$(nbdinfo --size "nbd://127.0.0.1:$PORT/tl")
head -c "$SIZE" /dev/urandom > "$W/src"
plain="nbd://127.0.0.1:$PORT/tl"
tls="nbds://127.0.0.1:$PORT/tl?tls-certificates=$W"
cpu() { awk '{print $14 + $15}' "/proc/$SRV/stat"; }
head -c 32 /dev/zero > "$W/null.key"
NULLVOL=(--type plain --cipher cipher_null-ecb --key-size 256 --key-file "$W/null.key")
# One copy: prints "client name dir MB/s server_cpu_s client_cpu_s".
copy() {
  local client=$1 name=$2 dir=$3 uri=$4 from to s0 s1 t0 t1 c
  local cmd
  if [ "$client" = nbdcopy ]; then
    if [ "$dir" = read ]; then from=$uri; to=null:; else from=$W/src; to=$uri; fi
    cmd=(nbdcopy --request-size=131072 -C "${CONNECTIONS:-1}" -R 8 "$from" "$to")
  elif [ "$dir" = read ]; then
    cmd=("$B" export -r -q ${REQ:+--request-size "$REQ"} "${NULLVOL[@]}" "$uri" /dev/null)
  else
    cmd=("$B" import -q ${REQ:+--request-size "$REQ"} "${NULLVOL[@]}" "$uri" "$W/src")
  fi
  s0=$(cpu); t0=$(date +%s.%N)
  c=$( { ${CLIENT_CPUS:+taskset -c $CLIENT_CPUS} "${GNU_TIME:-/usr/bin/time}" -f '%U %S' "${cmd[@]}" >/dev/null; } 2>&1 | tail -n1)
  t1=$(date +%s.%N); s1=$(cpu)
  python3 -c "import os,sys; t=os.sysconf('SC_CLK_TCK'); u,s=map(float,'$c'.split()); print('$client $name $dir', round($SIZE/($t1-$t0)/1e6), ($s1-$s0)/t, round(u+s,2))"
}
for r in $(seq "$ROUNDS"); do
  for client in ${CLIENTS:-nbdcopy cryptblk}; do
    for d in read write; do
      copy "$client" plaintext "$d" "$plain" | tee -a "$OUT"
      copy "$client" tls "$d" "$tls" | tee -a "$OUT"
    done
  done
done
python3 - "$OUT" "$SIZE" <<'PY'
import collections, statistics, sys
size_gb = int(sys.argv[2]) / 1e9
d = collections.defaultdict(list)
clients = []
for line in open(sys.argv[1]):
    client, name, rw, mbs, srv, cli = line.split()
    d[(client, name, rw)].append((float(mbs), float(srv), float(cli)))
    if client not in clients:
        clients.append(client)
print("\n| client | sequential | plaintext MB/s | TLS MB/s | TLS ÷ plaintext | server CPU s/GB, plain → TLS | client CPU s/GB, plain → TLS |")
print("|---|---|---|---|---|---|---|")
for c in clients:
    for rw in ("read", "write"):
        p, t = d[(c, "plaintext", rw)], d[(c, "tls", rw)]
        med = lambda v, i: statistics.median(x[i] for x in v)
        print(f"| {c} | {rw} | {med(p,0):.0f} | {med(t,0):.0f} | **{med(t,0)/med(p,0):.2f}** "
              f"| {med(p,1)/size_gb:.2f} → {med(t,1)/size_gb:.2f} | {med(p,2)/size_gb:.2f} → {med(t,2)/size_gb:.2f} |")
PY
