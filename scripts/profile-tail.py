#!/usr/bin/env python3
"""What ran on the cores while the slowest answers waited (scripts/profile-tail).

  profile-tail.py LATENCY_LOG TIMEHIST OFFSET_US NODE_PID BENCH_PID REDIS_PID

LATENCY_LOG: `swin-bench load --latency-log` (due unix µs, latency µs per line);
TIMEHIST: `perf sched timehist` of a trace taken with `-k CLOCK_MONOTONIC`; OFFSET_US:
wall clock minus monotonic clock. The node's two busiest threads are its runtime's
workers; its other threads are the blocking pool (the sync's table work)."""
import bisect
import collections
import sys

lat_path, th_path = sys.argv[1], sys.argv[2]
offset = float(sys.argv[3])
node, bench, redis = sys.argv[4], sys.argv[5], sys.argv[6]

runs = []  # (start s, end s, tid, pid, name)
for line in open(th_path):
    p = line.split()
    if len(p) < 6 or not p[0][0].isdigit():
        continue
    try:
        end, ran = float(p[0]), float(p[-1]) / 1e3
    except ValueError:
        continue
    name = " ".join(p[2:-3])
    tid = pid = ""
    if name.endswith("]") and "[" in name:
        name, ids = name[:-1].rsplit("[", 1)
        tid, _, pid = ids.partition("/")
        pid = pid or tid
    runs.append((end - ran, end, tid, pid, name))
runs.sort()
node_cpu = collections.Counter()
for r in runs:
    if r[3] == node:
        node_cpu[r[2]] += r[1] - r[0]
workers = {t for t, _ in node_cpu.most_common(2)}


def role(r):
    if r[3] == node:
        return "node: runtime workers" if r[2] in workers else "node: blocking pool (sync tables)"
    if r[3] == redis:
        return "redis (the store)"
    if r[3] == bench:
        return "load generator"
    if r[4].startswith("<idle>") or r[2] == "0":
        return "idle"
    return "other processes"


lo, hi = runs[0][0], runs[-1][1]
answers = []
for line in open(lat_path):
    due, took = map(int, line.split())
    start = (due - offset) / 1e6
    if lo + 0.05 <= start and start + took / 1e6 <= hi - 0.05:
        answers.append((start, took))
answers.sort(key=lambda a: a[1])
n = len(answers)
p50, p99 = answers[n // 2][1], answers[int(n * 0.99)][1]
print(f"answers due in the trace: {n}, p50 {p50} µs, p99 {p99} µs")
starts = [r[0] for r in runs]


def shares(selected):
    busy, span = collections.Counter(), 0.0
    for s, took in selected:
        e = s + took / 1e6
        span += e - s
        for r in runs[bisect.bisect_left(starts, s - 0.25):]:
            if r[0] > e:
                break
            o = min(e, r[1]) - max(s, r[0])
            if o > 0:
                busy[role(r)] += o
    return {k: 100 * v / span for k, v in busy.items()}


slow = [a for a in answers if a[1] >= p99]
fast = [a for a in answers if a[1] <= p50]
s_sh, f_sh = shares(slow), shares(fast)
print("share of the two cores while an answer waited (200 % = both cores)")
print(f"  {'':36s} {'slowest 1 %':>12s} {'fastest half':>13s}")
for k in sorted(set(s_sh) | set(f_sh), key=lambda k: -s_sh.get(k, 0)):
    print(f"  {k:36s} {s_sh.get(k, 0):11.1f}% {f_sh.get(k, 0):12.1f}%")

print("slices of CPU (one thread's run between two switches)")
by_role = collections.defaultdict(list)
for r in runs:
    by_role[role(r)].append((r[1] - r[0]) * 1e3)
for k in ["node: runtime workers", "node: blocking pool (sync tables)", "redis (the store)"]:
    v = sorted(by_role.get(k, [0.0]))
    big = [x for x in v if x >= 0.3]
    secs = hi - lo
    print(f"  {k:36s} {sum(v) / secs:6.1f} ms/s, {len(big) / secs:5.1f} slices/s of ≥ 0.3 ms "
          f"(those: {sum(big) / secs:5.1f} ms/s), longest {v[-1]:.2f} ms")

# answers against what the store was doing while they waited
redis_runs = sorted((r[0], r[1]) for r in runs if r[3] == redis and r[1] - r[0] >= 0.0003)
redis_starts = [a for a, _ in redis_runs]


def overlapping(selected):
    hit = 0
    for s, took in selected:
        e = s + took / 1e6
        i = max(0, bisect.bisect_left(redis_starts, s) - 1)
        hit += any(a < e and b > s for a, b in redis_runs[i:bisect.bisect_right(redis_starts, e)])
    return 100 * hit / max(1, len(selected))


print(f"answers overlapping a slice of the store's of ≥ 0.3 ms: slowest 1 % {overlapping(slow):.0f} %, "
      f"fastest half {overlapping(fast):.0f} %")
