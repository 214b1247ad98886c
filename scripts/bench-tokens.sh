#!/bin/bash
# Token unlock time (issue 36): process start to key, cryptblk beside clevis, same volume,
# same run. A tang server (tangd behind socat) and a software TPM (swtpm) on loopback; one
# LUKS2 image bound by `clevis luks bind` with the tang pin, the tpm2 pin (PCR 7) and sss
# (tang + tpm2, both needed), and by `systemd-cryptenroll --tpm2-device` (PCR 7).
# clevis: `clevis luks pass -d IMG -s SLOT` (prints the passphrase, the keyslot untouched);
# cryptblk: `cryptblk test-passphrase --token-only --token-id N IMG` (also opens the
# keyslot: more work). Every keyslot is PBKDF2 with 1,000 iterations (clevis and systemd
# enroll token keyslots so), about a millisecond, so no PBKDF cost hides the rest.
# 10 alternating rounds, median seconds and the ratio. Then a tang server that accepts and
# never answers: cryptblk with --token-timeout 2 and the passphrase fallback, clevis killed
# after 30 s.
# usage: scripts/bench-tokens.sh   (needs clevis, clevis-tpm2, tang, socat, swtpm,
#        tpm2-tools, systemd-cryptenroll: scripts/setup.sh installs them)
set -eu
B=${CRYPTBLK:-$PWD/target/release/cryptblk}
D=$(mktemp -d) # 0700, ours
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; rm -rf "$D"; }
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
TANG=$(port)
mkdir $D/db && /usr/libexec/tangd-keygen $D/db
socat TCP-LISTEN:$TANG,bind=127.0.0.1,reuseaddr,fork EXEC:"/usr/libexec/tangd $D/db" 2>/dev/null &
pids+=($!)
while :; do TPM=$(port); [ $((TPM + 1)) -lt 65536 ] && python3 -c "import socket; socket.socket().bind(('127.0.0.1',$((TPM + 1))))" 2>/dev/null && break; done
mkdir $D/tpm
swtpm_on() {
  swtpm socket --tpm2 --tpmstate dir=$D/tpm --server type=tcp,port=$TPM,bindaddr=127.0.0.1 \
    --ctrl type=tcp,port=$((TPM + 1)),bindaddr=127.0.0.1 --flags not-need-init,startup-clear &
  pids[1]=$!
  sleep 0.5
}
# An orderly reboot (TPM2_Shutdown first: a TPM counts a power cut as a possible attack
# against its dictionary-attack protection): the enrolling tools leave sessions loaded, and
# swtpm has no resource manager to flush them.
swtpm_reboot() { tpm2_shutdown; kill ${pids[1]}; wait ${pids[1]} 2>/dev/null || true; swtpm_on; }
swtpm_on
export TPM2TOOLS_TCTI=swtpm:host=127.0.0.1,port=$TPM
IMG=$D/v.img
printf 'recovery passphrase' > $D/pw
truncate -s 32M $IMG
cryptsetup luksFormat -q --type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --key-file $D/pw $IMG
PCR7='{"pcr_bank":"sha256","pcr_ids":"7"}'
clevis luks bind -y -d $IMG -k $D/pw tang "{\"url\":\"http://127.0.0.1:$TANG\"}" </dev/null       # token 0, slot 1
clevis luks bind -y -d $IMG -k $D/pw tpm2 "$PCR7" </dev/null                                        # token 1, slot 2
swtpm_reboot
clevis luks bind -y -d $IMG -k $D/pw sss "{\"t\":2,\"pins\":{\"tang\":[{\"url\":\"http://127.0.0.1:$TANG\"}],\"tpm2\":$PCR7}}" </dev/null # token 2, slot 3
swtpm_reboot
PASSWORD=$(cat $D/pw) systemd-cryptenroll --tpm2-device=$TPM2TOOLS_TCTI --tpm2-pcrs=7 $IMG >/dev/null 2>&1 # token 3, slot 4
swtpm_reboot
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) CPUs; clevis $(dpkg-query -W -f '${Version}' clevis 2>/dev/null), $($B --version)"
python3 - "$B" "$IMG" "$TPM2TOOLS_TCTI" <<'EOF'
import statistics, subprocess, sys, time
b, img, tcti = sys.argv[1:]
def t(cmd):
    s = time.perf_counter()
    r = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    e = time.perf_counter() - s
    assert r.returncode == 0, (cmd, subprocess.run(cmd, capture_output=True).stderr)
    # clevis's tpm2-tools leave their policy session loaded, and swtpm has no resource
    # manager (a kernel /dev/tpmrm0 would flush it): flush it, untimed.
    subprocess.run(["tpm2_flushcontext", "-l"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return e
cases = [("clevis tang", 0, 1), ("clevis tpm2 (PCR 7)", 1, 2), ("clevis sss (tang + tpm2)", 2, 3),
         ("systemd-tpm2 (PCR 7)", 3, 4)]
print("| token | clevis luks pass s | cryptblk test-passphrase --token-only s | clevis ÷ cryptblk |")
print("|---|---|---|---|")
for name, token, slot in cases:
    cb = [b, "test-passphrase", "--token-only", "--token-id", str(token), "--tpm2-device", tcti, img]
    cl = ["clevis", "luks", "pass", "-d", img, "-s", str(slot)] if name.startswith("clevis") else None
    a, c = [], []
    for _ in range(10):
        c.append(t(cb))
        if cl: a.append(t(cl))
    mc = statistics.median(c)
    if cl:
        ma = statistics.median(a)
        print(f"| {name} | {ma:.3f} | {mc:.3f} | {ma / mc:.1f}x |")
    else:
        print(f"| {name} | (no clevis equivalent; cryptsetup's plugin needs /dev/tpmrm0) | {mc:.3f} | |")
EOF
# A tang server that accepts and never answers.
kill ${pids[0]}; wait ${pids[0]} 2>/dev/null || true
socat TCP-LISTEN:$TANG,bind=127.0.0.1,reuseaddr,fork EXEC:"sleep 600" 2>/dev/null &
pids[0]=$!
sleep 0.3
s=$(date +%s.%N)
$B test-passphrase --token-id 0 --token-timeout 2 $IMG < $D/pw >/dev/null 2>&1
cb=$(echo "$(date +%s.%N) - $s" | bc)
s=$(date +%s.%N)
timeout 30 clevis luks pass -d $IMG -s 1 >/dev/null 2>&1 && st="answered" || st="killed at 30 s"
cl=$(echo "$(date +%s.%N) - $s" | bc)
echo
echo "| silent tang server | seconds |"
echo "|---|---|"
printf '| cryptblk, --token-timeout 2, then the passphrase: opened | %.2f |\n' $cb
printf '| clevis luks pass (%s) | %.2f |\n' "$st" $cl
