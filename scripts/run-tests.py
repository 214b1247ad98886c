#!/usr/bin/env python3
"""Runs the workspace's test binaries, several at once: the CI's test stage.

`cargo test` runs one test binary after another; most of this project's tests wait on
other processes (cryptsetup, fio, a Ceph cluster, a served volume) as much as they compute,
so on a small machine two binaries side by side finish far sooner than one after the
other. This builds every test binary (`cargo test --no-run`, the given cargo arguments),
then runs them JOBS at a time (default: the CPU count), the longest first (by the times the
last run recorded in target/test-times.json, else by a built-in order), each as cargo would
(its package's directory as the working directory, cargo's environment), each binary's
output shown whole once it ends, then the doc tests. A failure fails the run, after every
binary has run, and lists the failed ones.

usage: scripts/run-tests.py [CARGO TEST ARGS...] [-- TEST BINARY ARGS...]
   e.g. scripts/run-tests.py --profile ci --workspace
env:   TEST_JOBS (binaries at once), CARGO (cargo)
"""

import json
import os
import subprocess
import sys
import threading
import time

# Binaries known to take long, for the first run (no recorded times): started first.
SLOW_FIRST = ["reencryption", "serving", "formats", "format", "bench", "volume"]


def main():
    args = sys.argv[1:]
    passthrough = []
    if "--" in args:
        i = args.index("--")
        args, passthrough = args[:i], args[i + 1 :]
    cargo = os.environ.get("CARGO", "cargo")
    build = subprocess.run(
        [cargo, "test", "--no-run", "--message-format=json-render-diagnostics", *args],
        stdout=subprocess.PIPE,
        text=True,
    )
    if build.returncode != 0:
        sys.exit(build.returncode)
    binaries = []
    for line in build.stdout.splitlines():
        try:
            m = json.loads(line)
        except json.JSONDecodeError:
            continue
        if m.get("reason") != "compiler-artifact" or not m.get("executable"):
            continue
        if not m.get("profile", {}).get("test"):
            continue
        target = m["target"]
        pkg_dir = os.path.dirname(m["manifest_path"])
        name = f"{m['package_id'].split('#')[0].split('/')[-1]} {target['kind'][0]} {target['name']}"
        binaries.append((name, target["name"], pkg_dir, m["executable"], m["manifest_path"]))
    root = os.getcwd()
    times_path = os.path.join(root, "target", "test-times.json")
    try:
        times = json.load(open(times_path))
    except (OSError, ValueError):
        times = {}

    def expected(b):
        if b[0] in times:
            return times[b[0]]
        return 1000 - SLOW_FIRST.index(b[1]) if b[1] in SLOW_FIRST else 0

    binaries.sort(key=expected, reverse=True)
    jobs = int(os.environ.get("TEST_JOBS", os.cpu_count() or 2))
    print(f"run-tests: {len(binaries)} test binaries, {jobs} at once", flush=True)
    queue = list(binaries)
    lock = threading.Lock()
    failed = []
    took = {}
    start = time.monotonic()

    def run(b):
        name, _, pkg_dir, exe, manifest = b
        env = dict(os.environ)
        # What cargo sets for a test it runs (some tests read it at run time).
        env["CARGO_MANIFEST_DIR"] = pkg_dir
        env["CARGO_MANIFEST_PATH"] = manifest
        t0 = time.monotonic()
        p = subprocess.run(
            [exe, *passthrough],
            cwd=pkg_dir,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
        dt = time.monotonic() - t0
        with lock:
            took[name] = round(dt, 1)
            print(f"     Running {name} ({os.path.relpath(exe, root)}): {dt:.1f} s, "
                  f"ended at {time.monotonic() - start:.0f} s", flush=True)
            print(p.stdout, end="", flush=True)
            if p.returncode != 0:
                failed.append(name)

    def worker():
        while True:
            with lock:
                if not queue:
                    return
                b = queue.pop(0)
            run(b)

    threads = [threading.Thread(target=worker) for _ in range(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    times.update(took)
    try:
        with open(times_path, "w") as f:
            json.dump(times, f, indent=1, sort_keys=True)
    except OSError:
        pass
    doc = subprocess.run([cargo, "test", "--doc", *[a for a in args if a != "--no-fail-fast"]])
    if doc.returncode != 0:
        failed.append("doc tests")
    print(f"run-tests: {len(binaries)} binaries in {time.monotonic() - start:.0f} s", flush=True)
    if failed:
        print("run-tests: FAILED: " + ", ".join(failed), flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
