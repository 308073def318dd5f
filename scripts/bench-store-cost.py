#!/usr/bin/env python3
"""scripts/bench-store-cost's rows, tables and chart (standard library only).

  row JSON                       a CSV row from `swin-bench store-cost --json`
  overran JSON                   exit 0 when that run overran its period (or skipped ticks)
  limitador N K SECS "CPU INCR" "CPU INCR" LOAD_JSON RSS_KB
                                 a CSV row for N limitador-servers: Redis CPU and INCRBY
                                 calls (the counters flushed) before and after SECS
  report CSV SVG                 the Markdown table, the limit per store, and the chart
"""

import csv
import json
import math
import sys

COLUMNS = ["system", "store", "nodes", "keys", "syncs", "ticks", "overran", "failed",
           "sync_p50_ms", "sync_p99_ms", "sync_max_ms", "synced_keys_per_sec",
           "store_cpu_per_sec", "store_us_per_synced_key", "nodes_cpu_per_sec",
           "floor_us_per_synced_key", "to_floor"]
COLOURS = {"redis": "#d62728", "redis-cluster": "#1f77b4", "postgres": "#2ca02c",
           "limitador": "#7f7f7f"}
LABELS = {"redis": "swin, Redis", "redis-cluster": "swin, Redis Cluster (3 primaries)",
          "postgres": "swin, PostgreSQL", "limitador": "Limitador redis_cached, Redis"}


def out(values):
    csv.writer(sys.stdout, lineterminator="\n").writerow(values)


def row(r):
    out(["swin", r["store"], r["nodes"], r["keys"], r["syncs"], r["ticks"], r["overran"],
         r["failed"], f'{r["sync_p50_ms"]:.1f}', f'{r["sync_p99_ms"]:.1f}',
         f'{r["sync_max_ms"]:.1f}', f'{r["synced_keys_per_sec"]:.0f}',
         f'{r["store_cpu_per_sec"]:.3f}', f'{r["store_us_per_synced_key"]:.2f}',
         f'{r["nodes_cpu_per_sec"]:.3f}',
         "" if r.get("floor_us_per_synced_key") is None else f'{r["floor_us_per_synced_key"]:.2f}',
         "" if r.get("to_floor") is None else f'{r["to_floor"]:.2f}'])


def overran(r):
    # a sync longer than its period, or ticks skipped behind one, or failed syncs
    return r["overran"] > 0 or r["failed"] > 0 or r["syncs"] < 0.95 * r["ticks"]


def limitador(n, k, secs, before, after, load_json, rss):
    (c0, i0), (c1, i1) = [map(float, s.split()) for s in (before, after)]
    secs = float(secs)
    flushed = (i1 - i0) / secs
    cpu = (c1 - c0) / secs
    load = json.load(open(load_json))
    us = cpu / flushed * 1e6 if flushed else 0.0
    # syncs: requests/s sent; ticks: one request per counter and second asked; the RSS
    # of one limitador-server (kB) where swin reports its own CPU
    out(["limitador", "redis", n, k, round(load["requests_per_sec"]), int(n) * int(k), "", "",
         "", "", "", f"{flushed:.0f}", f"{cpu:.3f}", f"{us:.2f}", f"rss {rss} kB", "", ""])


def table(rows):
    print("| System, store | N | K | N×K | sync p50 ms | sync p99 ms | overran? "
          "| store CPU s/s | store µs per synced key | floor µs | ÷ floor |")
    print("|---|---:|---:|---:|---:|---:|:---:|---:|---:|---:|---:|")
    for r in rows:
        nk = int(r["nodes"]) * int(r["keys"])
        if r["system"] == "limitador":
            print(f'| {LABELS["limitador"]} | {r["nodes"]} | {r["keys"]} | {nk:,} | – | – | – '
                  f'| {r["store_cpu_per_sec"]} | {r["store_us_per_synced_key"]} '
                  f'(per counter flushed; {int(float(r["synced_keys_per_sec"])):,}/s) | – | – |')
            continue
        over = "yes" if is_over(r) else "no"
        print(f'| {LABELS[r["store"]]} | {r["nodes"]} | {r["keys"]} | {nk:,} | {r["sync_p50_ms"]} '
              f'| {r["sync_p99_ms"]} | {over} | {r["store_cpu_per_sec"]} '
              f'| {r["store_us_per_synced_key"]} | {r.get("floor_us_per_synced_key") or "–"} '
              f'| {r.get("to_floor") or "–"} |')


def is_over(r):
    return (int(r["overran"]) > 0 or int(r["failed"]) > 0
            or int(r["syncs"]) < 0.95 * int(r["ticks"]))


def limits(rows):
    print()
    for store in ["redis", "redis-cluster", "postgres"]:
        ok = [r for r in rows if r["system"] == "swin" and r["store"] == store and not is_over(r)]
        bad = [r for r in rows if r["system"] == "swin" and r["store"] == store and is_over(r)]
        if not ok and not bad:
            continue
        best = max(ok, key=lambda r: int(r["nodes"]) * int(r["keys"]), default=None)
        first_bad = min(bad, key=lambda r: int(r["nodes"]) * int(r["keys"]), default=None)
        said = (f'N={best["nodes"]} × K={best["keys"]} = {int(best["nodes"]) * int(best["keys"]):,}'
                if best else "none")
        more = (f'; first overrun at N={first_bad["nodes"]} × K={first_bad["keys"]}'
                if first_bad else "; none overran")
        print(f"- {LABELS[store]}: largest without an overrun {said}{more}")


def svg(rows, path):
    """Store CPU (s per s) against keys synced per second, log-log; overran: hollow."""
    w, h, left, bottom, top, right = 760, 460, 70, 50, 20, 250
    pts = [(float(r["synced_keys_per_sec"]), float(r["store_cpu_per_sec"]), r) for r in rows
           if float(r["synced_keys_per_sec"]) > 0 and float(r["store_cpu_per_sec"]) > 0]
    x0, x1, y0, y1 = 1, 7, -4, 1  # decades: 10 .. 10^7 keys/s, 10^-4 .. 10 s/s
    sx = lambda x: left + (math.log10(x) - x0) / (x1 - x0) * (w - left - right)
    sy = lambda y: h - bottom - (math.log10(y) - y0) / (y1 - y0) * (h - top - bottom)
    s = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
         f'font-family="sans-serif" font-size="12"><rect width="100%" height="100%" fill="white"/>']
    for d in range(x0, x1 + 1):
        x = sx(10 ** d)
        s.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{h - bottom}" stroke="#ddd"/>'
                 f'<text x="{x:.1f}" y="{h - bottom + 16}" text-anchor="middle">1e{d}</text>')
    for d in range(y0, y1 + 1):
        y = sy(10 ** d)
        s.append(f'<line x1="{left}" y1="{y:.1f}" x2="{w - right}" y2="{y:.1f}" stroke="#ddd"/>'
                 f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">1e{d}</text>')
    s.append(f'<text x="{(left + w - right) / 2}" y="{h - 12}" text-anchor="middle">'
             'keys synced per second (N × K at sync_rate 1; Limitador: counters flushed)</text>')
    s.append(f'<text transform="translate(16,{(top + h - bottom) / 2}) rotate(-90)" '
             'text-anchor="middle">store CPU, seconds per second</text>')
    for key in COLOURS:
        mine = sorted((p for p in pts if series(p[2]) == key), key=lambda p: p[0])
        c = COLOURS[key]
        if len(mine) > 1:
            line = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y, _ in mine)
            s.append(f'<polyline points="{line}" fill="none" stroke="{c}" stroke-width="1.5"/>')
        for x, y, r in mine:
            fill = "white" if r["system"] == "swin" and is_over(r) else c
            s.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="4" fill="{fill}" stroke="{c}"/>')
    for i, key in enumerate(COLOURS):
        y = top + 14 + 20 * i
        s.append(f'<circle cx="{w - right + 20}" cy="{y - 4}" r="4" fill="{COLOURS[key]}"/>'
                 f'<text x="{w - right + 30}" y="{y}">{LABELS[key]}</text>')
    s.append(f'<text x="{w - right + 12}" y="{top + 110}">hollow: a sync overran its period</text>')
    s.append("</svg>")
    open(path, "w").write("\n".join(s) + "\n")


def series(r):
    return "limitador" if r["system"] == "limitador" else r["store"]


def main():
    cmd = sys.argv[1]
    if cmd == "row":
        row(json.loads(sys.argv[2]))
    elif cmd == "overran":
        sys.exit(0 if overran(json.loads(sys.argv[2])) else 1)
    elif cmd == "limitador":
        limitador(*sys.argv[2:9])
    elif cmd == "report":
        rows = list(csv.DictReader(open(sys.argv[2])))
        table(rows)
        limits(rows)
        svg(rows, sys.argv[3])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
