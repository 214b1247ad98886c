#!/usr/bin/env bash
# Installs what cryptblk's build, tests and demo need, only if missing. Idempotent.
set -euo pipefail
need=()
have() { command -v "$1" >/dev/null 2>&1; }
have cryptsetup || need+=(cryptsetup-bin)
have fio || need+=(fio)
have nbdkit || need+=(nbdkit)
have nbdinfo || need+=(libnbd-bin)
have nbdcopy || need+=(libnbd-bin)
have openssl || need+=(openssl)
have mkfs.ext4 || need+=(e2fsprogs)
have fusermount3 || need+=(fuse3)
have nbd-client || need+=(nbd-client)
have mkfs.xfs || need+=(xfsprogs)
have python3 || need+=(python3)
have strace || need+=(strace)
have dislocker-file || need+=(dislocker)
have tcplay || need+=(tcplay)
# cryptsetup's own test scripts (tests/cryptsetup-suite): its header generators use jq
# and xxd, the scripts xz, and its interactive cases (prompts at a terminal) expect.
have jq || need+=(jq)
have expect || need+=(expect)
have xxd || need+=(xxd)
have xz || need+=(xz-utils)
# Tokens (issue 36): clevis binds volumes to a tang server (tangd, run per connection by
# socat in the tests).
have clevis || need+=(clevis clevis-luks)
[ -x /usr/libexec/tangd ] || need+=(tang)
have socat || need+=(socat)
# TPM2 tokens: a software TPM (swtpm) on loopback, tpm2-tools for clevis's tpm2 pin and
# the tests' PCR extends, and the TSS libraries cryptblk loads at run time.
have swtpm || need+=(swtpm)
have tpm2_pcrextend || need+=(tpm2-tools)
have clevis-encrypt-tpm2 || need+=(clevis-tpm2)
have systemd-cryptenroll || need+=(systemd)
# The packaging checks: man pages rendered by groff, completion asked of fish and
# registered in zsh (bash is there already).
have groff || need+=(groff-base)
have fish || need+=(fish)
have zsh || need+=(zsh)
# The Debian package (scripts/build-deb.sh: dpkg-shlibdeps), checked with man in the VM.
have dpkg-shlibdeps || need+=(dpkg-dev)
have man || need+=(man-db)
# PKCS#11 tokens: SoftHSM 2 as the token, pkcs11-tool (OpenSC) to load its key and
# certificate; cryptblk finds modules through p11-kit, as systemd does.
[ -e /usr/lib/softhsm/libsofthsm2.so ] || need+=(softhsm2)
have pkcs11-tool || need+=(opensc)
ldconfig -p | grep -q libp11-kit.so.0 || need+=(libp11-kit0)
for lib in libtss2-esys.so.0:libtss2-esys-3.0.2-0 libtss2-mu.so.0:libtss2-mu0 \
  libtss2-tctildr.so.0:libtss2-tctildr0 libtss2-tcti-swtpm.so.0:libtss2-tcti-swtpm0; do
  ldconfig -p | grep -q "${lib%%:*}" || need+=("${lib#*:}")
done
# FIDO2 tokens: libfido2, which cryptblk and systemd load at run time (the key itself is a
# software one on a virtual HID device in the test VM: tests/tools/fido2-authenticator).
ldconfig -p | grep -q libfido2.so.1 || need+=(libfido2-1)
# A throwaway Ceph cluster for the RBD tests (tests/ceph/cluster.sh) and librbd's own
# encryption to check against (python3-rbd, for Debian's system Python).
have ceph-mon || need+=(ceph-mon)
have ceph-osd || need+=(ceph-osd)
have ceph || need+=(ceph-common)
/usr/bin/python3 -c 'import rbd, rados' 2>/dev/null || need+=(python3-rbd)
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}" >&2
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $(printf '%s\n' "${need[@]}" | sort -u) >/dev/null
fi
# Python cryptography 44 or later: an AES-XTS and Argon2id independent of cryptblk's, for
# the FileVault 2 and VeraCrypt Argon2id tests (tests/tools/*.py). Debian 12's package
# predates Argon2id, so it comes from PyPI when missing.
if ! python3 -c 'from cryptography.hazmat.primitives.kdf.argon2 import Argon2id' 2>/dev/null; then
  echo "setup: installing Python cryptography>=44 (pip)" >&2
  python3 -m pip --version >/dev/null 2>&1 || {
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-pip >/dev/null
  }
  python3 -m pip install --quiet --upgrade 'cryptography>=44' 2>/dev/null \
    || python3 -m pip install --quiet --upgrade --break-system-packages 'cryptography>=44'
fi
# QEMU: the tools (qemu-img, qemu-io, qemu-nbd) and the system emulator the VM tests boot
# must be one release. Debian's qemu-system-x86 depends on its own qemu-utils and removes
# any other (an image may carry a backported qemu-utils): both are installed together at
# the distribution's candidate version, so every test runs against the same QEMU.
qemu_version=$(apt-cache policy qemu-system-x86 2>/dev/null | awk '/Candidate:/ {print $2}')
if [ -z "$qemu_version" ] || [ "$qemu_version" = "(none)" ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  qemu_version=$(apt-cache policy qemu-system-x86 | awk '/Candidate:/ {print $2}')
fi
installed() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null || true; }
if [ "$(installed qemu-utils)" != "$qemu_version" ] || [ "$(installed qemu-system-x86)" != "$qemu_version" ]; then
  echo "setup: installing qemu-utils and qemu-system-x86 $qemu_version" >&2
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends --allow-downgrades \
    "qemu-utils=$qemu_version" "qemu-system-x86=$qemu_version" >/dev/null
fi
if ! have cargo; then
  echo "setup: cargo not found; install Rust stable (https://rustup.rs) first" >&2
  exit 1
fi
# cryptsetup's own test images (LUKS1 with every cipher, TrueCrypt/VeraCrypt, BitLocker,
# FileVault2) from Debian's cryptsetup source package, into target/cryptsetup-tests/.
bash "$(dirname "$0")/fetch-cryptsetup-images.sh"
