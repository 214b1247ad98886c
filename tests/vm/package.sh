#!/usr/bin/env bash
# Runs INSIDE the test VM, as root, whose root is a throwaway overlay of a Debian 12
# system: the Debian package (scripts/build-deb.sh) installed with dpkg, what it installs
# used as a user would (the binary and its version, man, bash and fish completion, the
# systemd units checked by systemd-analyze, the generator, attach-all/detach-all from a
# crypttab), then purged: nothing it installed is left.
#   package.sh DEB
set -uo pipefail
DEB=${1:?deb}
pass=0 fail=0
check() { # name, command...
  local name=$1; shift
  if "$@"; then pass=$((pass+1)); echo "ok   $name"; else fail=$((fail+1)); echo "FAIL $name"; fi
}
W=$(mktemp -d)
cd "$W"
version=$(dpkg-deb -f "$DEB" Version)
check "dpkg -i installs it" dpkg -i "$DEB"
check "cryptblk is on PATH at /usr/bin" test "$(command -v cryptblk)" = /usr/bin/cryptblk
check "--version names the package's version and a commit" \
  bash -c "cryptblk --version | grep -Eq '^cryptblk $version \\(commit [0-9a-f]{12}\\)\$'"
check "man -w finds cryptblk(8)" test "$(man -w cryptblk)" = /usr/share/man/man8/cryptblk.8.gz
check "man -w finds cryptblk-open(8)" test "$(man -w cryptblk-open)" = /usr/share/man/man8/cryptblk-open.8.gz
check "man cryptblk renders its EXIT STATUS" bash -c 'MANPAGER=cat MANWIDTH=100 man cryptblk 2>/dev/null | grep -q "EXIT STATUS"'
check "the bash completion registers (complete -p)" \
  bash -c 'source /usr/share/bash-completion/completions/cryptblk && complete -p cryptblk | grep -q _clap_complete_cryptblk'
check "... and completes a command" bash -c '
  source /usr/share/bash-completion/completions/cryptblk
  COMP_WORDS=(cryptblk attach); COMP_CWORD=1; COMP_LINE="cryptblk attach"; COMP_POINT=${#COMP_LINE}
  _clap_complete_cryptblk cryptblk attach cryptblk
  [ "${COMPREPLY[*]}" = attach-all ]'
# scripts/setup.sh installs fish on the host (the guest's root).
check "fish completes a command" bash -c "fish --no-config -c 'source /usr/share/fish/vendor_completions.d/cryptblk.fish; complete -C \"cryptblk detach\"' | grep -q '^detach-all'"
mkdir units
ln -s /usr/lib/systemd/system/cryptblk@.service units/cryptblk@vol.service
check "systemd-analyze verify accepts the installed units, without a warning" bash -c '
  out=$(SYSTEMD_UNIT_PATH=$PWD/units: systemd-analyze verify --man=no units/cryptblk@vol.service /usr/lib/systemd/system/cryptblk.target 2>&1)
  [ -z "$out" ] || { echo "$out"; false; }'
# A volume in a crypttab: the generator pulls it in; attach-all serves it, detach-all ends it.
printf 'package passphrase' > key
truncate -s 32M v.img
cryptblk format -q --type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --key-file key v.img
printf 'vol %s %s luks,nbd=unix:%s\n' "$W/v.img" "$W/key" "$W/vol.sock" > tab
mkdir gen
check "the generator (installed link) pulls in cryptblk@vol.service" bash -c "
  CRYPTBLK_CRYPTTAB=$W/tab /usr/lib/systemd/system-generators/cryptblk-generator $W/gen $W/gen $W/gen &&
  test \"\$(readlink gen/cryptblk.target.requires/cryptblk@vol.service)\" = /usr/lib/systemd/system/cryptblk@.service"
check "attach-all serves the entry" cryptblk attach-all --crypttab tab --run-dir "$W/run"
check "... which answers status" bash -c "cryptblk status vol --run-dir $W/run > /dev/null"
check "detach-all closes it" cryptblk detach-all --crypttab tab --run-dir "$W/run"
dpkg -L cryptblk > installed
check "dpkg --purge removes it" dpkg --purge cryptblk
check "no file it installed is left" bash -c 'while read -r f; do [ -d "$f" ] || [ ! -e "$f" -a ! -L "$f" ] || { echo "left: $f"; exit 1; }; done < installed'
check "nor its generator link, units, man pages, documentation" bash -c '! ls -d /usr/lib/systemd/system-generators/cryptblk-generator /usr/lib/systemd/system/cryptblk@.service /usr/share/man/man8/cryptblk.8.gz /usr/share/doc/cryptblk 2>/dev/null'
check "dpkg knows it no more" bash -c '! dpkg -s cryptblk > /dev/null 2>&1'
echo "package: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
