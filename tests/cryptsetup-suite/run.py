#!/usr/bin/env python3
"""Runs cryptsetup's own test scripts (from its source package) against cryptsetup and
against cryptblk in its drop-in role, case by case, and compares.

The scripts stop at their first failure; here each `fail` is recorded and the script goes
on, so one run scores every case. A case is a line of the script's main body (a line
inside a function counts for the main-body line that called it) that mentions
$CRYPTSETUP, `fail` or `RUN`, and that ran. It fails when `fail` (or the validation
script's `fail_count`) was called for it.

Nothing here needs device-mapper, a loop device or root: $LOOPDEV is the image file
itself (`losetup` attaches nothing), `dmsetup` answers that there is no device-mapper.
Lines that need a mapping therefore fail with cryptsetup here. With cryptblk they run
against its own frontend (`open` serves the volume over NBD): for those lines the script's
own expectation is the reference (each line states its expected result), and each must
pass unless dm-lines.txt lists it as not runnable here, with why (a /dev/mapper block
device to read or stack on, dmsetup's own targets, scsi_debug, a loop device's sector
size).

The verdict: every case cryptsetup passes must pass with cryptblk, except those named
in known-gaps.txt (each with why); every dm-needing line cryptblk reaches must pass,
except those named in dm-lines.txt; an entry of either list that passes now must be taken
off it. Exit 0 when that holds, 1 when it does not, 2 when the run itself could not be
made.

cryptblk is run as `cryptsetup` (a link of that name), as a script would find it.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent

# The scripts this harness runs, and the per-invocation limit (a command that waits for a
# terminal that is not there must not stall the suite).
SUITES = ["luks2-validation-test", "compat-test", "compat-test2", "password-hash-test",
          "api-images-test"]

# Scripts of ours (beside this file) run the same way, in a copy of cryptsetup's tests/
# folder: api-images-test says with the command line what cryptsetup's C API tests check
# on their images.
OWN_SCRIPTS = {"api-images-test"}
CALL_TIMEOUT_S = 120

# Scripts that cryptsetup itself cannot run without device-mapper here, and whose every
# case states the expected result itself: they run with cryptblk only, and each case that
# runs must pass. password-hash-test maps plain volumes and reads each mapping's key with
# `dmsetup table --showkeys`, against the key the script expects.
SELF_CHECKED = {"password-hash-test"}

# For the self-checked plain-mode script (cryptblk only): `create` records its input, and
# `dmsetup table NAME --showkeys` answers with the key of that mapping, derived by
# `dump --type plain --dump-volume-key` from the same options and the same input (the
# same code path as `open`'s: unlock.rs plain_params and plain_secret). The zero target
# `dmsetup create` would make is a zero-filled file.
PLAIN_KEYS = r"""
__suite_run_create() {
  # `create [OPTIONS] NAME DEVICE`, options anywhere (those the script uses).
  local opts=() pos=() a
  local args=("${@:2}") i=0
  while [ $i -lt ${#args[@]} ]; do
    a=${args[$i]}
    case "$a" in
      -c|-h|-s|-l|-d|--keyfile-offset) opts+=("$a" "${args[$((i+1))]}"); i=$((i+2)); continue ;;
      -*) opts+=("$a") ;;
      *) pos+=("$a") ;;
    esac
    i=$((i+1))
  done
  local name=${pos[0]} dev=${pos[1]}
  head -c 8388609 > "$SUITE_MAPPER/.stdin"
  "$SUITE_REAL" "$@" < "$SUITE_MAPPER/.stdin" || { local rc=$?; rm -f "$SUITE_MAPPER/.stdin"; return $rc; }
  rm -f "$SUITE_MAPPER/$name.key"
  "$SUITE_REAL" dump --type plain --dump-volume-key -q --volume-key-file "$SUITE_MAPPER/$name.key" \
      "${opts[@]}" "$dev" < "$SUITE_MAPPER/.stdin" >/dev/null
  local rc=$?
  rm -f "$SUITE_MAPPER/.stdin"
  return $rc
}
dmsetup() {
  case "$1" in
    create) truncate -s $((10240 * 512)) "$SUITE_MAPPER/$2" ;;
    table) [ -f "$SUITE_MAPPER/$2.key" ] || return 1
           echo "0 10240 crypt cipher $(xxd -p -c 256 "$SUITE_MAPPER/$2.key") 0 dev 0" ;;
    remove) shift; [ "$1" = --retry ] && shift
            "$SUITE_REAL" close "$1" >/dev/null 2>&1; rm -f "$SUITE_MAPPER/$1.key" "$SUITE_MAPPER/$1" ;;
  esac
}
id() { [ "$1" = -u ] && echo 0 || command id "$@"; }
cleanup() { [ "$1" = 0 ] || { fail "cleanup $1"; return 1; }; __suite_orig_cleanup 0; }
"""

# Sourced (BASH_ENV) before the script: records each main-body line that runs and each
# failure, by the main-body line it belongs to; stands in for losetup and dmsetup.
PRELUDE = r"""
exec 9>>"$SUITE_TRACE"
__suite_top() { local n=${#BASH_LINENO[@]}; echo "${BASH_LINENO[n-2]}"; }
fail() { echo "F $(__suite_top) ${1//$'\n'/ }" >&9; return 1; }
fail_count() { echo "F $(__suite_top) ${1//$'\n'/ }" >&9; FAILS=$((FAILS+1)); }
skip() { echo "S $(__suite_top) ${1//$'\n'/ }" >&9; return 1; }
# scsi_debug (a kernel module) is not loaded here: the script would exit.
add_scsi_device() { skip "needs the scsi_debug kernel module"; }
losetup() {
  case "$1" in
    -f) echo "$PWD/$IMG" ;;
    -d) ;;
    "") ;;
    *) [ $# -eq 1 ] && echo "$1: [0]:0 ($1)" ;;
  esac
  return 0
}
# `dmsetup targets` (the scripts read dm-crypt's version to pick their branches): what
# cryptblk's frontends stand in for is a dm-crypt with 4096-byte sectors and the key in
# the server's memory, never in the kernel keyring; as dm-crypt 1.14.5, the first with
# sector sizes and the last without keyring keys, reports itself. Anything else: there is
# no device-mapper here.
dmsetup() {
  [ "$1" = targets ] && { printf 'crypt            v1.14.5\n'; return 0; }
  echo "dmsetup: no device-mapper in this harness" >&2; return 1
}
modprobe() { return 1; }
rmmod() { return 1; }
udevadm() { return 0; }
# A name `open` serves stays served until closed; the scripts close their mappings with
# dmsetup, which is not there: each test case starts with none.
prepare() { __suite_close_all; __suite_prepare "$@"; }
__suite_close_all() {
  [ -n "$SUITE_CLOSE" ] || return 0
  local n
  for n in $("$SUITE_REAL" list 2>/dev/null | awk '{print $1}'); do
    # A volume left suspended refuses `close` (its held I/O waits for luksResume): the
    # harness then ends its server the way `dmsetup remove --force` would end a mapping.
    "$SUITE_REAL" close "$n" >/dev/null 2>&1 && continue
    local pid; pid=$(cat "$XDG_RUNTIME_DIR/cryptblk/$n.pid" 2>/dev/null) || continue
    kill -9 "$pid" 2>/dev/null
    while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
    "$SUITE_REAL" close "$n" >/dev/null 2>&1
  done
}
trap 'echo "L $LINENO" >&9' DEBUG
"""

DEF_RE = re.compile(
    r"^(\s*)(function\s+)?(fail|fail_count|skip|prepare|add_scsi_device|cleanup)(\s*\(\))",
    re.M)
CASE_RE = re.compile(r"\$CRYPTSETUP|\bfail\b|^\s*RUN\b|^\s*crypt_key\b")


def transform(text, name):
    """The script with its own fail/skip/prepare renamed, so the prelude's stand; line
    numbers unchanged. In the self-checked plain-mode script, `create` goes through the
    prelude's recorder, the zero target is a file, and a case the script would let pass
    as "N/A" (a hash the tool could not use) fails."""

    def rename(m):
        func = m.group(3)
        if func == "cleanup" and name not in SELF_CHECKED:
            return m.group(0)
        new = "__suite_prepare" if func == "prepare" else "__suite_orig_" + func
        return f"{m.group(1)}{m.group(2) or ''}{new}{m.group(4)}"

    text = DEF_RE.sub(rename, text)
    if name in SELF_CHECKED:
        text = text.replace("/dev/mapper/$DEV_NAME", "$SUITE_MAPPER/$DEV_NAME")
        text = re.sub(r"\$CRYPTSETUP create\b", "__suite_run_create create", text)
        text = text.replace('echo " [N/A] ($ret, SKIPPED)"', 'fail "N/A ($ret)"')
    return text


def function_lines(text):
    """Line numbers inside function bodies (they count for the line that called them)."""
    inside, depth, lines = False, 0, set()
    for no, line in enumerate(text.splitlines(), 1):
        if not inside and re.match(r"^\s*(function\s+\w[\w-]*|\w[\w-]*\s*\(\))", line):
            inside, depth = True, 0
        if inside:
            lines.add(no)
            depth += line.count("{") - line.count("}")
            if depth <= 0 and "}" in line:
                inside = False
    return lines


def run_suite(name, src, tool, real, out):
    """Runs one script with `real` as $CRYPTSETUP; returns {line: (status, why)}."""
    text = (HERE / name if name in OWN_SCRIPTS else src / name).read_text()
    work = Path(tempfile.mkdtemp(prefix=f"cs-{name}-{tool}-", dir=out))
    tests = work / "tests"
    shutil.copytree(src, tests, symlinks=True)
    (tests / name).write_text(transform(text, name))
    bindir = work / "bin"
    bindir.mkdir()
    realdir = work / "real"
    realdir.mkdir()
    (realdir / "cryptsetup").symlink_to(real)
    wrapper = bindir / "cryptsetup"
    wrapper.write_text(
        f"#!/bin/sh\nexec timeout -k 5 {CALL_TIMEOUT_S} {realdir / 'cryptsetup'} \"$@\"\n"
    )
    wrapper.chmod(0o755)
    prelude = work / "prelude.sh"
    prelude.write_text(PRELUDE + (PLAIN_KEYS if name in SELF_CHECKED else ""))
    mapper = work / "mapper"
    mapper.mkdir(mode=0o700)
    trace = work / "trace"
    # The run directory holds the served volumes' sockets, whose paths must fit a unix
    # socket address (108 bytes): it lives under /tmp, not under the checkout (whose path
    # can be any length), and goes when the script is done.
    rundir = Path(tempfile.mkdtemp(prefix="cbrun-", dir="/tmp"))
    env = dict(os.environ)
    env.update(
        {
            "BASH_ENV": str(prelude),
            "SUITE_TRACE": str(trace),
            "SUITE_REAL": str(realdir / "cryptsetup"),
            "SUITE_CLOSE": "1" if tool == "cryptblk" else "",
            "SUITE_MAPPER": str(mapper),
            "CRYPTSETUP_PATH": str(bindir),
            "XDG_RUNTIME_DIR": str(rundir),
            "LANG": "C",
        }
    )
    env.pop("VALG", None)
    start = time.monotonic()
    with open(work / "output", "wb") as log:
        proc = subprocess.run(
            ["bash", f"./{name}"],
            cwd=tests,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=1800,
        )
    secs = time.monotonic() - start
    if tool == "cryptblk":
        # Whatever the script left served.
        subprocess.run(
            ["bash", "-c", "source \"$BASH_ENV\" 9>/dev/null; __suite_close_all"],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
        )
    shutil.rmtree(rundir, ignore_errors=True)
    in_function = function_lines(text)
    lines = text.splitlines()
    ran, failed, skipped = set(), {}, {}
    for entry in trace.read_text(errors="replace").splitlines():
        kind, _, rest = entry.partition(" ")
        no, _, why = rest.partition(" ")
        if not no.isdigit():
            continue
        no = int(no)
        if kind == "L":
            ran.add(no)
        elif kind == "F":
            failed.setdefault(no, why)
        elif kind == "S":
            skipped.setdefault(no, why)
    cases = {}
    for no in sorted(ran | set(failed)):
        if no in in_function or no > len(lines) or not CASE_RE.search(lines[no - 1]):
            continue
        if no in failed:
            cases[no] = ("fail", failed[no])
        elif no in skipped:
            cases[no] = ("skip", skipped[no])
        else:
            cases[no] = ("pass", "")
    shutil.rmtree(work / "tests", ignore_errors=True)
    return cases, secs, proc.returncode, lines


def load_gaps(name="known-gaps.txt"):
    """known-gaps.txt, dm-lines.txt: `SUITE:LINE  why` per line; # comments."""
    gaps = {}
    path = HERE / name
    if path.exists():
        for line in path.read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            key, _, why = line.partition(" ")
            gaps[key] = why.strip()
    return gaps


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", type=Path, default=ROOT / "target/cryptsetup-src/tests",
                    help="cryptsetup's tests/ folder (scripts/fetch-cryptsetup-images.sh)")
    ap.add_argument("--cryptblk", type=Path, default=ROOT / "target/ci/cryptblk")
    ap.add_argument("--cryptsetup", type=Path,
                    default=Path(shutil.which("cryptsetup") or "/usr/sbin/cryptsetup"))
    ap.add_argument("--out", type=Path, default=ROOT / "target/cryptsetup-suite")
    ap.add_argument("suites", nargs="*", default=SUITES)
    args = ap.parse_args()
    for what, p in (("cryptsetup's test scripts", args.src / "compat-test2"),
                    ("cryptblk", args.cryptblk), ("cryptsetup", args.cryptsetup)):
        if not p.exists():
            print(f"cryptsetup-suite: NOT RUN: {what} not found at {p} "
                  "(scripts/fetch-cryptsetup-images.sh fetches the scripts)", file=sys.stderr)
            return 2
    args.out.mkdir(parents=True, exist_ok=True)
    gaps = load_gaps()
    dm_lines = load_gaps("dm-lines.txt")
    report, bad, stale, summary, dm_summary = [], [], [], [], []
    # Every (script, tool) run is independent (its own copy of the tests folder, its own
    # run directory), and each is one shell at a time: SUITE_JOBS (default the CPU count)
    # at once, longest first by the last run's times, halve the stage on two CPUs.
    runs = [(suite, "cryptblk", args.cryptblk) for suite in args.suites]
    runs += [(suite, "cryptsetup", args.cryptsetup) for suite in args.suites
             if suite not in SELF_CHECKED]
    times_file = args.out / "times.json"
    try:
        last = json.loads(times_file.read_text())
    except (OSError, ValueError):
        # A clean clone: the order of a run on two CPUs (session 33).
        last = {"compat-test cryptsetup": 49, "compat-test cryptblk": 47,
                "compat-test2 cryptsetup": 37, "api-images-test cryptsetup": 23,
                "compat-test2 cryptblk": 17}
    runs.sort(key=lambda r: -last.get(f"{r[0]} {r[1]}", 10.0))
    jobs = int(os.environ.get("SUITE_JOBS") or os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {(suite, tool): pool.submit(run_suite, suite, args.src, tool,
                                              binary.resolve(), args.out)
                   for suite, tool, binary in runs}
        results = {key: f.result() for key, f in futures.items()}
    times_file.write_text(json.dumps({f"{s} {t}": r[1] for (s, t), r in results.items()},
                                     indent=1))
    for suite in args.suites:
        got, got_s, _, lines = results[(suite, "cryptblk")]
        if suite in SELF_CHECKED:
            # The script's expectations are the reference: every case of its main body
            # must run and pass.
            in_function = function_lines("\n".join(lines))
            ref, ref_s = {
                n: ("pass", "") for n, text in enumerate(lines, 1)
                if n not in in_function and CASE_RE.search(text)
                and not text.lstrip().startswith("#")
            }, 0.0
        else:
            ref, ref_s, _, _ = results[(suite, "cryptsetup")]
        ref_pass = {n for n, (s, _) in ref.items() if s == "pass"}
        got_pass = {n for n, (s, _) in got.items() if s == "pass"}
        not_run = sorted(n for n, (s, _) in ref.items() if s != "pass")
        both = len(ref_pass & got_pass)
        summary.append((suite, both, len(ref_pass), len(ref), len(got_pass), ref_s, got_s))
        for n in sorted(ref_pass - got_pass):
            key = f"{suite}:{n}"
            status, why = got.get(n, ("not reached", ""))
            text = lines[n - 1].strip()
            entry = {"case": key, "cryptblk": status, "why": why, "line": text}
            report.append(entry)
            if key not in gaps:
                bad.append(entry)
        for n in sorted(ref_pass & got_pass):
            if f"{suite}:{n}" in gaps:
                stale.append(f"{suite}:{n}")
        if suite not in SELF_CHECKED:
            # Lines cryptsetup cannot run here (device-mapper): cryptblk runs them on its
            # frontend, against the script's own expectation.
            dm = [n for n in not_run if not lines[n - 1].lstrip().startswith("#")]
            dm_pass = [n for n in dm if got.get(n, ("",))[0] == "pass"]
            listed = [n for n in dm if f"{suite}:{n}" in dm_lines]
            if dm:
                dm_summary.append((suite, len(dm_pass), len(dm), len(listed)))
            for n in dm:
                key = f"{suite}:{n}"
                status, why = got.get(n, ("not reached", ""))
                if status == "pass":
                    if key in dm_lines:
                        stale.append(key)
                    continue
                entry = {"case": key, "cryptblk": status, "why": why,
                         "line": lines[n - 1].strip(), "dm": True}
                report.append(entry)
                if key not in dm_lines:
                    bad.append(entry)
        (args.out / f"{suite}.json").write_text(json.dumps({
            "cryptsetup": {n: s for n, (s, _) in ref.items()},
            "cryptblk": {n: s for n, (s, _) in got.items()},
            "needs_dm_or_skipped_with_cryptsetup": not_run,
        }, indent=1))
    print("| suite | cryptblk passes | of the cases cryptsetup passes | cases run | "
          "cryptsetup s | cryptblk s |")
    print("|---|---|---|---|---|---|")
    for suite, both, ref_n, total, got_n, ref_s, got_s in summary:
        print(f"| {suite} | {both} | {ref_n} | {total} | {ref_s:.0f} | {got_s:.0f} |")
    if dm_summary:
        print()
        print("| suite: lines needing device-mapper | cryptblk passes on its frontend | lines "
              "| listed as not runnable here (dm-lines.txt) |")
        print("|---|---|---|---|")
        for suite, n_pass, n, n_listed in dm_summary:
            print(f"| {suite} | {n_pass} | {n} | {n_listed} |")
    for e in report:
        if e.get("dm"):
            if e["case"] in dm_lines:
                continue
            mark = "NEW FAILURE (dm line)"
        else:
            mark = "known gap" if e["case"] in gaps else "NEW FAILURE"
        print(f"{mark}: {e['case']} ({e['cryptblk']}{': ' + e['why'] if e['why'] else ''}): "
              f"{e['line']}")
    for key in stale:
        print(f"STALE GAP: {key} passes now: take it off tests/cryptsetup-suite/known-gaps.txt "
              "or dm-lines.txt")
    (args.out / "report.json").write_text(json.dumps(report, indent=1))
    if bad or stale:
        print(f"cryptsetup-suite: {len(bad)} case(s) cryptsetup passes (or dm lines) fail with cryptblk "
              f"and are not known gaps; {len(stale)} stale gap(s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
