#!/usr/bin/env python3
"""The checks of scripts/bench-tokens, on what a run left: the example's summary and its
log of requests, the store's counts in Redis, the nodes' /metrics and the lossy
proxy's counts. Prints markdown tables. Exits 1 when a claim fails.

(a) Tokens charged = tokens used, key by key, exactly: for every key, the store's count
    (every window of the key's hash in Redis, summed) equals the tokens the stand-in
    model used on the requests over that key, by the model's own count.
(b) Per window, tokens admitted <= limit + the largest overrun in flight: for every key k
    and every 60 s window w the store holds for it, the store's count of k in w is at
    most the limit plus the largest overrun among the requests over k in flight in w. A
    request's overrun is what its commit charged past its reservation's total (used -
    (estimate + extends granted), when above 0: its debt); it is in flight in w when the
    span from its reserve sent to its commit answered (the client's clock, the store's
    host) meets [w, w + 60 s). Printed: the worst margin (bound - count) over all keys
    and windows; the same with the sum of the overruns in flight instead of the largest.
(c) Nothing charged twice: the reserves, extends and commits the nodes counted (their
    swin_reservation_operations_total, summed over the nodes) equal the distinct calls
    the clients made, and (LOSS=proxy) every request sent again after the proxy lost its
    answer was answered by a replay (`Idempotent-Replayed: true`: per route, replayed =
    dropped); with (a), every Idempotency-Key's effect is counted once.
"""

import json
import os
import re
import subprocess
import sys

WINDOW = 60.0


def store_counts(redis, prefix, ns, key):
    """{window start in seconds: count} of the key's 60 s hash in Redis."""
    h = "%s:{%d:%s:%s}:60" % (prefix, len(ns), ns, key)
    out = subprocess.run(
        ["redis-cli", "-u", redis, "--raw", "HGETALL", h],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    counts = {}
    for field, value in zip(out[0::2], out[1::2]):
        if field.isdigit():  # window starts; other fields are the script's records
            start = int(field)
            counts[start / 1000.0 if start > 10**11 else float(start)] = float(value)
    return counts


def metrics(paths, name):
    """{labels: value} of a counter, summed over the nodes' /metrics texts."""
    out = {}
    pat = re.compile(r"^%s\{([^}]*)\} ([0-9.e+]+)$" % re.escape(name))
    for p in paths:
        for line in open(p):
            m = pat.match(line.strip())
            if m:
                labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
                k = labels.get("outcome") or labels.get("part")
                out[k] = out.get(k, 0.0) + float(m.group(2))
    return out


def main():
    run_path, log_path, proxy_path, limit, prefix, redis, secs = sys.argv[1:8]
    metric_paths = sys.argv[8:]
    run = json.load(open(run_path))
    logged = [json.loads(l) for l in open(log_path)]
    calls = [c for c in logged if not c.get("denied")]  # served: reserved, then committed
    limit, secs = float(limit), float(secs)
    proxy = json.load(open(proxy_path)) if proxy_path != "-" else None
    ok = True

    # (a) the store's count of each key against the model's own count
    used_by_key = run["tokens_used_by_key"]
    counts = {k: store_counts(redis, prefix, "llm", k) for k in used_by_key}
    wrong = [
        (k, u, sum(counts[k].values()))
        for k, u in used_by_key.items()
        if sum(counts[k].values()) != u
    ]
    ok &= not wrong
    # with CALL_KEYS, each reservation's own key: what it charged against what it used,
    # and whether its commit's answer said the give-back fell short (what is owed)
    own = [c for c in calls if any(k.startswith("call:") for k in c["keys"])]
    own_wrong, own_short, short_settled = [], 0, 0
    for c in own:
        k = [k for k in c["keys"] if k.startswith("call:")][0]
        charged = sum(counts[k].values())
        short = max(0, c["reserved"] - c["used"]) - c["given_back"][k]
        own_short += short > 0
        if charged != c["used"]:
            own_wrong.append((k, c["used"], charged, short))
        elif short > 0:
            short_settled += 1
    tenants = [k for k in used_by_key if k.startswith("tenant:")]

    # (b) each key's count in each window against the limit and the overruns in flight
    def overrun(c):
        return max(0, c["used"] - c["reserved"])

    worst = None  # (margin, key, window, count, largest, sum)
    worst_sum = None
    over_limit = []
    for k, by_window in counts.items():
        mine = [c for c in calls if k in c["keys"]]
        for w, n in by_window.items():
            flying = [
                overrun(c)
                for c in mine
                if c["reserve_sent"] < w + WINDOW and c["commit_answered"] >= w
            ]
            largest, total = max(flying, default=0), sum(flying)
            row = (limit + largest - n, k, w, n, largest, total)
            by_sum = (limit + total - n,) + row[1:]
            worst = row if worst is None else min(worst, row)
            worst_sum = by_sum if worst_sum is None else min(worst_sum, by_sum)
            if n > limit:
                over_limit.append(row)
    claim_b = worst[0] >= 0
    ok &= claim_b

    # (c) the operations the nodes counted against the clients' distinct calls
    ops = metrics(metric_paths, "swin_reservation_operations_total")
    cost = metrics(metric_paths, "swin_reservation_cost_total")
    pairs = [
        ("reserves", run["requests"], ops.get("reserved", 0) + ops.get("denied", 0)),
        (
            "extends",
            run["extends"] + run["extends_denied"],
            ops.get("extended", 0) + ops.get("extend_denied", 0),
        ),
        ("commits", run["served"], ops.get("committed", 0)),
        ("commits of a reservation not open", 0, ops.get("not_open", 0)),
    ]
    claim_c = all(a == b for _, a, b in pairs)
    if proxy is not None:
        # every attempt after a lost answer was answered again, not run again
        claim_c &= all(
            r.get("replayed", 0) == r.get("dropped", 0)
            for route, r in proxy.items()
            if route in ("reserve", "extend", "commit")
        )
    ok &= claim_c

    n_keys = len(used_by_key)
    print("| figure | value |\n|---|---|")
    for k in ("requests", "served", "denied", "extends", "extends_denied", "debts", "cut_short"):
        print("| %s | %s |" % (k, run[k]))
    print("| retries (client) | %s |" % run["retries"])
    if proxy is None:
        print("| answers thrown away by the client | %s |" % run["dropped_answers"])
    else:
        dropped = sum(r.get("dropped", 0) for r in proxy.values())
        print("| answers lost by the proxy | %d |" % dropped)
    relay = json.loads(os.environ.get("RELAY") or "null")
    if relay:
        print(
            "| store replies lost by the relays / passed on (connections) | %d / %d (%d) |"
            % (relay["lost"], relay["replies"], relay["connections"])
        )
    if os.environ.get("KILLS", "0") != "0":
        print("| connections to Redis cut by CLIENT KILL | %s |" % os.environ["KILLS"])
    print(
        "| nodes stopped cleanly (exit 0) / node log lines saying spooled | %s / %s |"
        % (os.environ.get("STOPPED", "-"), os.environ.get("SPOOLED", "-"))
    )
    print("| seconds | %.1f |" % secs)
    first = min(c["reserve_sent"] for c in logged)
    last = max(c.get("commit_answered", c.get("reserve_answered", 0)) for c in logged)
    print(
        "| window ends during the run (seconds in) | %s |"
        % (
            " ".join(
                "%.1f" % (b - first)
                for b in range(int(first // WINDOW + 1) * 60, int(last) + 1, 60)
            )
            or "none"
        )
    )
    spanned = int(last // WINDOW) - int(first // WINDOW) + 1
    if spanned > 2:
        # the store keeps a key's current and previous windows: the first ones are gone
        print(
            "| (a), (b), (c) | not checkable: the run spanned %d windows of %d s and the "
            "store keeps 2 (run fewer requests, or AT=5 and under 115 s) |" % (spanned, WINDOW)
        )
        return 2
    ratios = [c["used"] / c["estimate"] for c in calls]
    print("| use / estimate, min – max | %.2f – %.2f |" % (min(ratios), max(ratios)))
    print("| largest overrun (debt) of a request | %d |" % max(map(overrun, calls)))
    print("| tokens used (the model's count) | %d |" % run["tokens_used"])
    print(
        "| tokens charged, tenant keys (the store's counts) | %d |"
        % sum(sum(counts[k].values()) for k in tenants)
    )
    print(
        "| (a) every key (%d) charged exactly its use | %s |"
        % (n_keys, "yes" if not wrong else "NO: %d keys" % len(wrong))
    )
    print(
        "| (b) key-windows checked / past the limit | %d / %d |"
        % (sum(len(c) for c in counts.values()), len(over_limit))
    )
    print(
        "| (b) worst margin: limit + largest overrun in flight − count | "
        "%d (%s, window %d: count %d, largest %d, sum %d) |" % worst
    )
    print(
        "| (b) worst margin with the sum of the overruns in flight | %d (%s, window %d) |"
        % worst_sum[:3]
    )
    print(
        "| (b) holds, with the largest overrun / with the sum of the overruns | %s / %s |"
        % ("yes" if claim_b else "NO", "yes" if worst_sum[0] >= 0 else "NO")
    )
    if own:
        print(
            "| reservations (own key) whose store count ≠ tokens used / served | %d / %d |"
            % (len(own_wrong), len(own))
        )
        print(
            "| of those, the commit's answer said the give-back fell short | %d |"
            % sum(1 for w in own_wrong if w[3] > 0)
        )
        print(
            "| commits whose answer gave back less than asked / then settled exact | %d / %d |"
            % (own_short, short_settled)
        )
        print(
            "| tokens charged − used over the reservations' own keys | %+d |"
            % sum(ch - u for _, u, ch, _ in own_wrong)
        )
    for name, clients, nodes in pairs:
        print("| (c) %s: distinct calls / counted by the nodes | %d / %d |" % (name, clients, nodes))
    net = (
        cost.get("reserved", 0)
        + cost.get("extended", 0)
        + cost.get("charged", 0)
        - cost.get("given_back", 0)
    )
    per = 3 if own else 2
    print(
        "| tokens net by the nodes' cost counts (reserved + extended + charged − given back) "
        "/ in the store, all keys / used × %d keys | %d / %d / %d |"
        % (per, net, sum(sum(c.values()) for c in counts.values()), per * run["tokens_used"])
    )
    print("| (c) holds | %s |" % ("yes" if claim_c else "NO"))
    if proxy is not None:
        print("\n| route | forwarded | dropped | replayed (Idempotent-Replayed) | statuses |")
        print("|---|---|---|---|---|")
        for route, r in sorted(proxy.items()):
            st = " ".join(
                "%s×%d" % (s[7:], n) for s, n in sorted(r.items()) if s.startswith("status_")
            )
            print(
                "| %s | %d | %d | %d | %s |"
                % (route, r.get("forwarded", 0), r.get("dropped", 0), r.get("replayed", 0), st)
            )
    for k, used, charged in [w for w in wrong if not w[0].startswith("call:")][:20]:
        # what the commits over k asked back (reserved - used) and did not get
        short = [
            (c["reserved"] - c["used"]) - c["given_back"][k]
            for c in calls
            if k in c["keys"] and c["used"] < c["reserved"]
        ]
        short = [s for s in short if s > 0]
        by_window = {int(w): n for w, n in counts[k].items()}
        print(
            "(a) %s used %d, charged %d (%+d), by window %s; "
            "%d commits got back %d less than they asked"
            % (k, used, charged, charged - used, by_window, len(short), sum(short))
        )
    for k, used, charged, short in own_wrong[:20]:
        print("(a) %s used %d, charged %d (%+d); its commit's answer: %s" % (
            k, used, charged, charged - used,
            "gave back %d less than asked" % short if short > 0 else "gave back what it asked"))
    for row in sorted(over_limit)[:20]:
        print("(b) %s window %d: count %d, limit + largest overrun in flight %d (margin %d), sum of overruns in flight %d" % (row[1], row[2], row[3], limit + row[4], row[0], row[5]))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
