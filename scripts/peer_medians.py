"""The median table the NBD/vhost-user-blk benchmark scripts print: each line of their
rounds is `NAME FIG FIG FIG FIG FIG` for the five workloads of scripts/peer-bench.sh
(other lines are skipped); `medians` gives each name's median per workload, `table` prints
them as a Markdown table, `ratios` one name's figures divided by another's."""
import statistics

WORKLOADS = ["4k-rw-qd1", "4k-randread-qd16", "4k-randwrite-qd16", "128k-read-qd8", "128k-write-qd8"]


def medians(path):
    runs = {}
    for line in open(path):
        f = line.split()
        if len(f) == 6 and f[0] != "server":
            runs.setdefault(f[0], []).append([float(x) if x != "ERR" else 0.0 for x in f[1:]])
    return {k: [statistics.median(c) for c in zip(*v)] for k, v in runs.items()}


def table(rows, unit="MB/s"):
    print(f"\n| server (median {unit}) | " + " | ".join(WORKLOADS) + " |")
    print("|---" * (len(WORKLOADS) + 1) + "|")
    for k, v in rows.items():
        print(f"| {k} | " + " | ".join(f"{x:.0f}" for x in v) + " |")


def ratios(rows, a, b):
    """`a`'s figures over `b`'s, per workload (NaN where either is missing or zero)."""
    if not rows.get(a) or not rows.get(b):
        return [float("nan")] * len(WORKLOADS)
    return [x / y if y else float("nan") for x, y in zip(rows[a], rows[b])]
