#!/usr/bin/env bash
# Runs INSIDE the test VM (tests/vm/vm.sh; a stock kernel with dm-crypt, nbd and fuse), as root. Data written
# through each cryptblk frontend (kernel nbd-client over NBD, a loop device on the FUSE
# file) must be what dm-crypt reads from the image, and the reverse; a filesystem made
# through a frontend must mount and check clean through dm-crypt.
# usage: [SECTIONS="nbd fuse tls"] frontends.sh /path/to/cryptblk
set -uo pipefail
CB=$1
modprobe loop 2>/dev/null; modprobe nbd nbds_max=4 2>/dev/null; modprobe fuse 2>/dev/null
cd /tmp
printf 'frontend passphrase' > pw
pass=0; fail=0
check() { # name, command...
  local name=$1; shift
  if "$@"; then pass=$((pass+1)); echo "ok   $name"; else fail=$((fail+1)); echo "FAIL $name"; fi
}
SZ=$((4 << 20))
RUN=/tmp/run
serve() { # frontend(nbd|fuse) image [options] -> sets DEV to the plaintext block device
  local fe=$1 img=$2; shift 2
  if [ "$fe" = nbd ]; then
    "$CB" open "$img" v --nbd unix:/tmp/v.sock --run-dir $RUN --daemon --key-file "$KEY" "$@" >/dev/null || return 1
    # NBD_BS: the block size the kernel client uses (unset: its default, 512, which a
    # 4096-byte-sector volume serves by read-modify-write)
    nbd-client -unix /tmp/v.sock /dev/nbd0 -N v ${NBD_BS:+-b $NBD_BS} >/dev/null || return 1
    DEV=/dev/nbd0
  else
    mkdir -p /tmp/mnt
    "$CB" open "$img" v --fuse /tmp/mnt --run-dir $RUN --daemon --key-file "$KEY" "$@" >/dev/null || return 1
    DEV=$(losetup -f --show --direct-io=on /tmp/mnt/v 2>/dev/null || losetup -f --show /tmp/mnt/v) || return 1
  fi
}
unserve() { # frontend
  if [ "$1" = nbd ]; then nbd-client -d /dev/nbd0 >/dev/null 2>&1; else losetup -d "$DEV"; fi
  "$CB" close v --run-dir $RUN
}
dmopen() { # image [options]  -> /dev/mapper/t
  local img=$1; shift
  LOOP=$(losetup -f --show "$img") && cryptsetup open --key-file "$KEY" "$@" "$LOOP" t
}
dmclose() { cryptsetup close t; losetup -d "$LOOP"; }

one() { # frontend type cipher keybits sector
  local fe=$1 type=$2 cipher=$3 kb=$4 ss=$5 name="$1: $2 $3/$4 sector $5"
  NBD_BS=$ss
  rm -f img; truncate -s 40M img
  local fmt=(--type "$type" --cipher "$cipher" --key-size "$kb") open=()
  if [ "$type" = plain ]; then
    # plain mode has no header; a raw key file is the volume key for both tools
    open=(--type plain --cipher "$cipher" --key-size "$kb" --sector-size "$ss")
    KEY=raw.key; head -c $((kb / 8)) /dev/urandom > raw.key
  else
    KEY=pw
    [ "$type" = luks2 ] && fmt+=(--sector-size "$ss")
    "$CB" format -q "${fmt[@]}" --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --key-file pw img \
      || { fail=$((fail+1)); echo "FAIL $name: format"; return; }
  fi
  head -c $SZ /dev/urandom > a.bin; head -c $SZ /dev/urandom > b.bin
  # 1. cryptblk frontend writes raw data at an odd (but sector-aligned) offset, dm-crypt reads
  serve "$fe" img "${open[@]}" || { fail=$((fail+1)); echo "FAIL $name: serve"; "$CB" close v --run-dir $RUN 2>/dev/null; return; }
  dd if=a.bin of="$DEV" bs=64k seek=3 oflag=direct conv=fsync status=none
  check "$name: size matches" test "$(blockdev --getsize64 "$DEV")" -gt $((SZ * 2))
  unserve "$fe"
  dmopen img "${open[@]}"
  check "$name: frontend writes, dm-crypt reads" cmp -n $SZ -i 0:$((3 * 65536)) a.bin /dev/mapper/t
  # 2. dm-crypt writes, the frontend reads
  dd if=b.bin of=/dev/mapper/t bs=1M seek=1 oflag=direct conv=fsync status=none
  dmclose
  serve "$fe" img "${open[@]}" --readonly || { fail=$((fail+1)); echo "FAIL $name: serve ro"; return; }
  check "$name: dm-crypt writes, frontend reads" cmp -n $SZ -i 0:$((1 << 20)) b.bin "$DEV"
  unserve "$fe"
}
fs() { # frontend: mkfs.ext4 through the frontend, fsck and compare through dm-crypt
  local fe=$1 name="$1: ext4 (4096-byte sectors, client blocks of 512)"
  KEY=pw; NBD_BS=
  rm -f img; truncate -s 64M img
  "$CB" format -q --type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --key-file pw img
  serve "$fe" img || { fail=$((fail+1)); echo "FAIL $name: serve"; return; }
  mkdir -p /tmp/fs; : > sums
  check "$name: mkfs and mount through the frontend" bash -c "mkfs.ext4 -q -b 4096 $DEV && mount $DEV /tmp/fs"
  if mountpoint -q /tmp/fs; then
    cp -r /usr/share/doc/cryptsetup* /usr/share/doc/fio /tmp/fs/
    (cd /tmp/fs && find . -type f -print0 | sort -z | xargs -0 sha256sum) > sums
    umount /tmp/fs
  fi
  unserve "$fe"
  dmopen img
  check "$name: fsck clean through dm-crypt" fsck.ext4 -fn /dev/mapper/t
  check "$name: tree is not empty" test "$(wc -l < sums)" -gt 5
  check "$name: mounts through dm-crypt" mount -o ro /dev/mapper/t /tmp/fs
  check "$name: tree reads back through dm-crypt" bash -c 'mountpoint -q /tmp/fs && cd /tmp/fs && sha256sum --quiet -c /tmp/sums'
  umount /tmp/fs 2>/dev/null; dmclose
}
# NBD over TLS with the kernel's own client: nbd-client's -certfile/-keyfile/-cacertfile
# against --tls required with client certificates checked (--tls-ca); a client without a
# certificate is refused, and nothing reaches the device.
tls() {
  local name="nbd over TLS (nbd-client -certfile, client certificate checked)" P=/tmp/pki
  KEY=pw
  rm -rf $P img; mkdir -p $P; truncate -s 40M img
  local ec=(-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes)
  openssl req -x509 -days 2 -subj "/CN=vm test CA" "${ec[@]}" -keyout $P/ca-key.pem -out $P/ca-cert.pem \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
  for who in server client; do
    if [ $who = server ]; then printf 'subjectAltName=DNS:localhost\nextendedKeyUsage=serverAuth\n'
    else printf 'extendedKeyUsage=clientAuth\n'; fi > $P/$who.ext
    openssl req -subj "/CN=$who" "${ec[@]}" -keyout $P/$who-key.pem -out $P/$who.csr 2>/dev/null
    openssl x509 -req -days 2 -in $P/$who.csr -CA $P/ca-cert.pem -CAkey $P/ca-key.pem -CAcreateserial \
      -extfile $P/$who.ext -out $P/$who-cert.pem 2>/dev/null
  done
  "$CB" format -q --type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --key-file pw img
  head -c $SZ /dev/urandom > a.bin
  "$CB" open img v --nbd unix:/tmp/t.sock --run-dir $RUN --daemon --key-file pw --tls required \
    --tls-cert $P/server-cert.pem --tls-key $P/server-key.pem --tls-ca $P/ca-cert.pem >/dev/null \
    || { fail=$((fail+1)); echo "FAIL $name: serve"; return; }
  check "$name: a client without a certificate is refused" bash -c \
    "! timeout 60 nbd-client -unix /tmp/t.sock /dev/nbd1 -N v -cacertfile $P/ca-cert.pem -tlshostname localhost >/dev/null 2>&1"
  nbd-client -d /dev/nbd1 >/dev/null 2>&1
  check "$name: connects" bash -c "timeout 60 nbd-client -unix /tmp/t.sock /dev/nbd1 -N v -certfile $P/client-cert.pem \
    -keyfile $P/client-key.pem -cacertfile $P/ca-cert.pem -tlshostname localhost >/dev/null"
  dd if=a.bin of=/dev/nbd1 bs=64k oflag=direct conv=fsync status=none
  check "$name: reads back what it wrote" cmp -n $SZ a.bin /dev/nbd1
  nbd-client -d /dev/nbd1 >/dev/null 2>&1
  "$CB" close v --run-dir $RUN
  dmopen img
  check "$name: frontend writes, dm-crypt reads" cmp -n $SZ a.bin /dev/mapper/t
  dmclose
}
# Each cipher/sector combination is covered both ways by dmcrypt-interop.sh (through the
# same Volume code); here each frontend gets a spread of them, kept short for the emulator.
# Sections: nbd fuse tls (default: all).
for section in ${SECTIONS:-nbd fuse tls}; do
  echo "== frontends: $section (at ${SECONDS}s)"
  case $section in
    nbd)
      one nbd luks1 aes-xts-plain64 512 512
      one nbd luks2 aes-xts-plain64 512 4096
      one nbd plain aes-xts-plain64 256 512
      fs nbd ;;
    fuse)
      one fuse luks2 aes-cbc-essiv:sha256 256 512
      one fuse luks2 aes-xts-plain64 512 4096
      fs fuse ;;
    tls) tls ;;
    *) fail=$((fail+1)); echo "FAIL unknown section '$section'" ;;
  esac
done
echo "frontends: $pass passed, $fail failed (${SECONDS}s)"
[ "$fail" -eq 0 ] && [ "$pass" -gt 0 ]
