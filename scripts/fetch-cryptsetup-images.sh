#!/usr/bin/env bash
# Fetches cryptsetup's own test images (tests/*-images.tar.xz of its source: LUKS1 with
# every cipher, TrueCrypt/VeraCrypt, BitLocker, FileVault2, with their passphrases and
# expected contents) from the distribution's source package, the one matching the
# installed cryptsetup, into target/cryptsetup-tests/ (not committed: they are
# cryptsetup's). Idempotent; the tests that use them fail, saying to run this, without.
#
# The system's apt sources are never changed: the deb-src entries live in a private apt
# state directory made from the system's own deb entries (apt-get indextargets).
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=target/cryptsetup-tests
STAMP=$DEST/.complete
# The whole tests/ folder of the same source: cryptsetup's own test scripts, with their
# images and header generators (tests/cryptsetup-suite/run.py runs them).
SRC_DEST=target/cryptsetup-src
SRC_STAMP=$SRC_DEST/.complete
# cryptsetup 2.7's TrueCrypt/VeraCrypt images (Debian 13's source), over 2.6.1's: they add
# VeraCrypt 1.26's BLAKE2s-256 PRF, which 2.6.1 does not know.
NEW_STAMP=$DEST/.complete-2.7
[ -f "$STAMP" ] && [ -f "$SRC_STAMP" ] && [ -f "$NEW_STAMP" ] && exit 0
have() { command -v "$1" >/dev/null 2>&1; }
have apt-get || { echo "fetch-cryptsetup-images: needs apt-get (Debian/Ubuntu)" >&2; exit 1; }
have xz || { echo "fetch-cryptsetup-images: needs xz" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/src"
# deb-src lines for every repository the system takes binaries from (apt lists them only
# once it has fetched their indexes: on a fresh machine, update first).
deb_src() {
  apt-get indextargets --format '$(REPO_URI) $(RELEASE) $(COMPONENT) $(TARGET_OF)' |
    awk '$4 == "deb" {print $1, $2, $3}' | sort -u |
    while read -r uri suite comp; do
      echo "deb-src $uri $suite $comp"
    done > "$work/sources.list"
}
deb_src
if [ ! -s "$work/sources.list" ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq >&2
  deb_src
fi
[ -s "$work/sources.list" ] || { echo "fetch-cryptsetup-images: no apt repositories found" >&2; exit 1; }
APT=(-o "Dir::Etc::SourceList=$work/sources.list" -o "Dir::Etc::SourceParts=$work/none"
  -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache" -o "APT::Sandbox::User=root"
  -o "Debug::NoLocking=1" -qq)
apt-get "${APT[@]}" update >&2
version=$(dpkg-query -W -f='${Version}' cryptsetup-bin 2>/dev/null || true)
pkg=cryptsetup
[ -n "$version" ] && pkg="cryptsetup=$version"
(cd "$work/src" && apt-get "${APT[@]}" source --download-only "$pkg" >&2 ||
  apt-get "${APT[@]}" source --download-only cryptsetup >&2)
orig=$(ls "$work"/src/cryptsetup_*.orig.tar.* | head -n1)
mkdir -p "$DEST"
tar -xf "$orig" -C "$work/src" --wildcards '*/tests/*'
for t in "$work"/src/*/tests/*-images.tar.xz "$work"/src/*/tests/conversion_imgs.tar.xz; do
  tar -xJf "$t" -C "$DEST" --no-same-owner
done
chmod -R u+rwX,go-w "$DEST"
basename "$orig" > "$STAMP"
rm -rf "$SRC_DEST"
mkdir -p "$SRC_DEST"
cp -a "$work"/src/*/tests "$SRC_DEST/tests"
chmod -R u+rwX,go-w "$SRC_DEST"
basename "$orig" > "$SRC_STAMP"
# The newer source from the same Debian mirror, through a list of its own (the fallback
# above must never pick it).
mirror=$(awk '$1 == "deb-src" && $2 ~ /debian\/?$/ {print $2; exit}' "$work/sources.list")
[ -n "$mirror" ] || { echo "fetch-cryptsetup-images: no Debian mirror for trixie's source" >&2; exit 1; }
mkdir -p "$work/lists-new/partial" "$work/new"
echo "deb-src $mirror trixie main" > "$work/sources-new.list"
APT_NEW=("${APT[@]}" -o "Dir::Etc::SourceList=$work/sources-new.list" -o "Dir::State::Lists=$work/lists-new")
apt-get "${APT_NEW[@]}" update >&2
(cd "$work/new" && apt-get "${APT_NEW[@]}" source --download-only cryptsetup >&2)
new_orig=$(ls "$work"/new/cryptsetup_*.orig.tar.* | head -n1)
tar -xf "$new_orig" -C "$work/new" --wildcards '*/tests/tcrypt-images.tar.xz'
tar -xJf "$work"/new/*/tests/tcrypt-images.tar.xz -C "$DEST" --no-same-owner
chmod -R u+rwX,go-w "$DEST"
basename "$new_orig" > "$NEW_STAMP"
echo "fetch-cryptsetup-images: $(cat "$STAMP") -> $DEST ($(ls "$DEST" | tr '\n' ' ')), tcrypt images of $(cat "$NEW_STAMP")" >&2
