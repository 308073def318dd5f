"""How fast, and how fast under load: each target's peak (closed loop, 32 connections),
then open-loop latency at 25, 50 and 75 % of the swin mode's peak, Limitador and the
bare axum floor at the same offered rates. Rounds alternate targets; medians."""

from common import (NEVER, DURATION, ROUNDS, WORK, Process, BIN, drop_redis, limitador, load, median,
                    node, redis_store, say)
import os

FRACTIONS = (0.25, 0.5, 0.75)
HTTP_PORT, GRPC_PORT = 7560, 7561
KEYS = "uniform:10000"


def swin_config(sync_rate, store=True, strict=False, grpc=False):
    prefix = f"swin-figures-{os.getpid()}"
    text = f'data_dir = "{WORK}/data"\n'
    if grpc:
        text += f'grpc_listen = "127.0.0.1:{GRPC_PORT}"\n'
    if store:
        text += "[stores.main]\n" + redis_store(prefix)
    text += f'[[namespaces]]\nname = "api"\nwindow_sizes = [60]\nsync_rate = {sync_rate}\n{NEVER}\n'
    if store:
        text += 'store = "main"\n'
    if strict:
        text += 'admission = "strict"\n'
    if grpc:
        text += ('[[namespaces.descriptors]]\nkey = "k"\n'
                 'rate_limit = { unit = "minute", requests_per_unit = 1000000000 }\n')
    return text


HIT = ("--hit", "--namespace", "api")
GRPC = ("--grpc", "k={key}", "--namespace", "api", "--target", f"127.0.0.1:{GRPC_PORT}")
LIM = ("--limitador", "--namespace", "api")

# name -> (label, start(), load arguments, the swin target whose rates it is run at)
TARGETS = {
    "axum": ("bare axum, constant /hit answer (the floor)",
             lambda: Process([f"{BIN}/swin-bench", "baseline", "--listen", f"127.0.0.1:{HTTP_PORT}"], port=HTTP_PORT),
             HIT, "local"),
    "local": ("swin /hit, local memory", lambda: node(swin_config(-1, store=False), HTTP_PORT), HIT, None),
    "periodic": ("swin /hit, periodic Redis (1 s)", lambda: node(swin_config(1), HTTP_PORT), HIT, None),
    "sync": ("swin /hit, synchronous Redis", lambda: node(swin_config(0), HTTP_PORT), HIT, None),
    "strict": ("swin /hit, strict Redis", lambda: node(swin_config(1, strict=True), HTTP_PORT), HIT, None),
    "grpc": ("swin gRPC ShouldRateLimit, local memory",
             lambda: node(swin_config(-1, store=False, grpc=True), HTTP_PORT), GRPC, None),
    "grpc-periodic": ("swin gRPC ShouldRateLimit, periodic Redis (1 s)",
                      lambda: node(swin_config(1, grpc=True), HTTP_PORT), GRPC, None),
    "grpc-sync": ("swin gRPC ShouldRateLimit, synchronous Redis",
                  lambda: node(swin_config(0, grpc=True), HTTP_PORT), GRPC, None),
    "lim-memory": ("Limitador HTTP, memory", lambda: limitador("memory", HTTP_PORT), LIM, "local"),
    "lim-redis_cached": ("Limitador HTTP, redis_cached (1 s)", lambda: limitador("redis_cached", HTTP_PORT),
                         LIM, "periodic"),
    "lim-redis": ("Limitador HTTP, redis", lambda: limitador("redis", HTTP_PORT), LIM, "sync"),
    "lim-rls-memory": ("Limitador RLS, memory", lambda: limitador("memory", HTTP_PORT, GRPC_PORT), GRPC[:-2], "grpc"),
    "lim-rls-redis_cached": ("Limitador RLS, redis_cached (1 s)",
                             lambda: limitador("redis_cached", HTTP_PORT, GRPC_PORT), GRPC[:-2], "grpc-periodic"),
    "lim-rls-redis": ("Limitador RLS, redis", lambda: limitador("redis", HTTP_PORT, GRPC_PORT), GRPC[:-2],
                      "grpc-sync"),
}
# Limitador's RLS door listens on GRPC_PORT too
for _name in ("lim-rls-memory", "lim-rls-redis_cached", "lim-rls-redis"):
    _t = TARGETS[_name]
    TARGETS[_name] = (_t[0], _t[1], GRPC, _t[3])


def target_of(args):
    return () if "--target" in args else ("--target", f"127.0.0.1:{HTTP_PORT}")


def run_on(name, runs):
    """Starts target `name`, warms it for 1 s, runs each of `runs` (extra arguments), stops
    it: the reports in order."""
    _, start, args, _ = TARGETS[name]
    proc = start()
    try:
        base = (*args, *target_of(args), "--keys", KEYS, "--connections", 32)
        load(*base, "--duration", 1)
        return [load(*base, "--duration", DURATION, *extra) for extra in runs]
    finally:
        proc.stop()
        drop_redis(f"swin-figures-{os.getpid()}:*")
        drop_redis("namespace:{api}*")   # Limitador's keys


def measure(names):
    peaks = {n: [] for n in names}
    for r in range(ROUNDS):
        for n in names:
            rep = run_on(n, [()])[0]
            peaks[n].append(round(rep["requests_per_sec"]))
            say(f"  peak round {r + 1}: {n} {peaks[n][-1]}/s")
    peak = {n: median(v) for n, v in peaks.items()}
    points = {n: {str(f): [] for f in FRACTIONS} for n in names}
    for r in range(ROUNDS):
        for n in names:
            at = TARGETS[n][3] or n
            if at not in peak:
                continue
            rates = [round(peak[at] * f) for f in FRACTIONS]
            reps = run_on(n, [("--rate", rate) for rate in rates])
            for f, rate, rep in zip(FRACTIONS, rates, reps):
                lat = rep["latency_ms"]
                points[n][str(f)].append({"offered": rate, "answered_per_sec": round(rep["requests_per_sec"]),
                                          "p50": lat["p50"], "p99": lat["p99"], "p999": lat["p999"],
                                          "unanswered": rep["unanswered"], "errors": rep["errors"],
                                          "statuses": rep["statuses"]})
                say(f"  latency round {r + 1}: {n} at {rate}/s p50 {lat['p50']} p99 {lat['p99']} p99.9 {lat['p999']}")
    return {"peaks": peaks, "points": points,
            "labels": {n: TARGETS[n][0] for n in names}, "rates_of": {n: TARGETS[n][3] or n for n in names},
            "duration_s": DURATION, "rounds": ROUNDS, "connections": 32, "keys": KEYS}


def summary(points):
    """Per target and fraction: the medians over rounds."""
    out = {}
    for n, by in points.items():
        out[n] = {}
        for f, runs in by.items():
            if runs:
                out[n][f] = {k: median([r[k] for r in runs]) for k in ("offered", "p50", "p99", "p999")}
    return out


PAIRS = [("local", ["lim-memory", "axum"]), ("periodic", ["lim-redis_cached"]), ("sync", ["lim-redis"]),
         ("strict", ["lim-redis"]), ("grpc", ["lim-rls-memory"]), ("grpc-periodic", ["lim-rls-redis_cached"]),
         ("grpc-sync", ["lim-rls-redis"])]


# the order of the tables and charts: each swin mode beside the Limitador it is measured with
ORDER = ["axum", "local", "lim-memory", "periodic", "lim-redis_cached", "sync", "lim-redis", "strict", "grpc",
         "lim-rls-memory", "grpc-periodic", "lim-rls-redis_cached", "grpc-sync", "lim-rls-redis"]


def ordered(names):
    return sorted(names, key=lambda n: ORDER.index(n) if n in ORDER else len(ORDER))


def tables(data):
    peaks = {n: median(v) for n, v in data["peaks"].items()}
    lines = [f"## How fast: decisions per second at the peak (closed loop, 32 connections, "
             f"{data['keys']} keys, {data['duration_s']:g} s runs, medians of {data['rounds']} alternating rounds)", "",
             "| target | decisions/s | × bare axum | × its Limitador | runs |", "|---|---|---|---|---|"]
    peer = {"local": "lim-memory", "periodic": "lim-redis_cached", "sync": "lim-redis", "strict": "lim-redis",
            "grpc": "lim-rls-memory", "grpc-periodic": "lim-rls-redis_cached", "grpc-sync": "lim-rls-redis"}
    axum = peaks.get("axum")
    for n in ordered(data["peaks"]):
        v = data["peaks"][n]
        x = f"{peaks[n] / axum:.2f}" if axum else ""
        y = f"{peaks[n] / peaks[peer[n]]:.2f}" if n in peer and peer[n] in peaks else ""
        lines.append(f"| {data['labels'][n]} | {peaks[n]:,.0f} | {x} | {y} | {' '.join(map(str, v))} |")
    s = summary(data["points"])
    lines += ["", f"## How fast under load: latency in ms at a fixed offered rate (open loop, from each request's "
              f"due time; 25/50/75 % of the swin mode's peak; medians of {data['rounds']} rounds)", "",
              "| mode | load | offered/s | swin p50 / p99 / p99.9 | beside it, at the same rate: p50 / p99 / p99.9 |",
              "|---|---|---|---|---|"]
    for mode, others in PAIRS:
        if mode not in s:
            continue
        for f, m in s[mode].items():
            beside = "; ".join(f"{data['labels'][o]}: {s[o][f]['p50']:.2f} / {s[o][f]['p99']:.2f} / {s[o][f]['p999']:.2f}"
                               for o in others if o in s and f in s[o])
            lines.append(f"| {data['labels'][mode]} | {float(f):.0%} | {m['offered']:,.0f} | "
                         f"{m['p50']:.2f} / {m['p99']:.2f} / {m['p999']:.2f} | {beside} |")
    return "\n".join(lines) + "\n"
