#!/usr/bin/env bash
# Builds the Debian package from a built cryptblk binary:
#   scripts/build-deb.sh [BINARY] [OUT_DIR]   (default target/release/cryptblk, target/debian)
# -> OUT_DIR/cryptblk_VERSION_ARCH.deb. `make deb` builds the release binary and calls it.
#
# The package holds the binary, the man pages and the bash/zsh/fish completion it
# generates itself (`generate-man`, COMPLETE=SHELL), the systemd units and the generator
# link, the README and an example /etc/cryptblktab as documentation. Depends is what the
# binary links (found with dpkg-shlibdeps); what cryptblk loads at run time only when a
# feature is used (librbd, the TPM2 TSS, libfido2, p11-kit) and the tools it works with are
# Suggests. Built with dpkg-deb alone: no debhelper, no network.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-target/release/cryptblk}
OUT=${2:-target/debian}
[ -x "$BIN" ] || { echo "build-deb: no binary at $BIN (cargo build --release -p cryptblk)" >&2; exit 2; }
command -v dpkg-deb > /dev/null || { echo "build-deb: needs dpkg-deb (a Debian system)" >&2; exit 2; }
VERSION=$("$BIN" --version | awk '{print $2}')
ARCH=$(dpkg --print-architecture)
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
R=$STAGE/root
install -d -m 0755 "$R/DEBIAN" "$R/usr/bin" "$R/usr/lib/systemd/system" \
  "$R/usr/lib/systemd/system-generators" "$R/usr/share/man/man8" \
  "$R/usr/share/bash-completion/completions" "$R/usr/share/zsh/vendor-completions" \
  "$R/usr/share/fish/vendor_completions.d" "$R/usr/share/doc/cryptblk/examples"
install -m 0755 "$BIN" "$R/usr/bin/cryptblk"
strip --strip-unneeded "$R/usr/bin/cryptblk" 2> /dev/null || true
install -m 0644 packaging/systemd/cryptblk@.service packaging/systemd/cryptblk.target \
  "$R/usr/lib/systemd/system/"
ln -s ../../../bin/cryptblk "$R/usr/lib/systemd/system-generators/cryptblk-generator"
"$BIN" generate-man "$STAGE/man"
for f in "$STAGE"/man/*.8; do gzip -9n < "$f" > "$R/usr/share/man/man8/$(basename "$f").gz"; done
# The registration scripts call back into the installed binary.
comp() { COMPLETE=$1 bash -c 'exec -a /usr/bin/cryptblk "$0"' "$BIN"; }
comp bash > "$R/usr/share/bash-completion/completions/cryptblk"
comp zsh > "$R/usr/share/zsh/vendor-completions/_cryptblk"
comp fish > "$R/usr/share/fish/vendor_completions.d/cryptblk.fish"
chmod 0644 "$R"/usr/share/*/completions/* "$R"/usr/share/zsh/vendor-completions/* \
  "$R"/usr/share/fish/vendor_completions.d/*
gzip -9n < README.md > "$R/usr/share/doc/cryptblk/README.md.gz"
gzip -9n < docs/security.md > "$R/usr/share/doc/cryptblk/security.md.gz"
install -m 0644 packaging/cryptblktab.example "$R/usr/share/doc/cryptblk/examples/cryptblktab"
cat > "$R/usr/share/doc/cryptblk/copyright" << 'EOF'
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: cryptblk

Files: *
Copyright: the cryptblk authors
License: MIT or Apache-2.0
 On Debian systems the Apache License 2.0 is in /usr/share/common-licenses/Apache-2.0.
EOF
# What the binary links, as Debian package dependencies.
mkdir -p "$STAGE/debian"
printf 'Source: cryptblk\n\nPackage: cryptblk\nArchitecture: any\n' > "$STAGE/debian/control"
DEPENDS=$(cd "$STAGE" && dpkg-shlibdeps -O "root/usr/bin/cryptblk" 2> /dev/null | sed -n 's/^shlibs:Depends=//p')
[ -n "$DEPENDS" ] || { echo "build-deb: dpkg-shlibdeps found no dependencies" >&2; exit 1; }
SIZE=$(du -sk --exclude=DEBIAN "$R" | cut -f1)
cat > "$R/DEBIAN/control" << EOF
Package: cryptblk
Version: $VERSION
Architecture: $ARCH
Maintainer: cryptblk developers <cryptblk@localhost>
Installed-Size: $SIZE
Depends: $DEPENDS
Suggests: systemd, nbd-client, fuse3, librbd1, libtss2-esys-3.0.2-0, libtss2-tctildr0, libfido2-1, p11-kit, cryptsetup-bin
Section: admin
Priority: optional
Homepage: https://github.com/cryptblk/cryptblk
Description: userspace disk encryption compatible with cryptsetup and dm-crypt
 cryptblk formats, opens and serves LUKS1/LUKS2, plain, loop-AES,
 TrueCrypt/VeraCrypt, BitLocker and FileVault 2 volumes, and LUKS2 with
 integrity, bit for bit as cryptsetup and the kernel do, without the kernel's
 dm-crypt: the plaintext is served over NBD, FUSE, ublk or vhost-user-blk.
 Volumes listed in /etc/cryptblktab are opened at boot by cryptblk@.service.
EOF
# systemd picks up the units and the generator's output.
cat > "$R/DEBIAN/postinst" << 'EOF'
#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi
EOF
cat > "$R/DEBIAN/postrm" << 'EOF'
#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi
EOF
chmod 0755 "$R/DEBIAN/postinst" "$R/DEBIAN/postrm"
(cd "$R" && find usr -type f -print0 | sort -z | xargs -0 md5sum) > "$R/DEBIAN/md5sums"
mkdir -p "$OUT"
DEB=$OUT/cryptblk_${VERSION}_${ARCH}.deb
dpkg-deb --root-owner-group -Zxz --build "$R" "$DEB" > /dev/null
echo "$DEB"
