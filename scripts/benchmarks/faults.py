"""How exact under each fault: three nodes behind nginx, one key limited to L hits per
window of W seconds, 3 × L offered per window (open loop), for each mode and fault; the
hits admitted in each window of the store's clock against L, and the admitted
(acknowledged) hits that reached the store. Beside Limitador (redis_cached, redis) under
the same faults. Every scenario has a Redis of its own (port 7590), reached by each node
through a socat proxy of its own, so a fault touches nothing else on the machine."""

import os
import shutil
import signal
import subprocess
import time

from common import BIN, WORK, Process, limitador, node, save, say

W = int(os.environ.get("SWIN_FAULT_WINDOW", "5"))          # seconds per window
L = int(os.environ.get("SWIN_FAULT_LIMIT", "500"))         # hits per window
RUN = float(os.environ.get("SWIN_FAULT_RUN", "30"))        # seconds of load
# the fault starts half-way through the second window, while the nodes admit: under 3 × L
# a sliding window admits nothing until the window before has weighed in less (about
# 0.3 of the window in), then admits as it decays; what a killed node took since its
# last push is lost with it
FAULT_AT, FAULT_FOR = W + W / 2, 10.0
STORE_PORT, LB_PORT = 7590, 7570
NODE_PORTS = (7571, 7572, 7573)
PROXY_PORTS = (7591, 7592, 7593)
TOTAL = 3600      # a window whose limit is never reached: its count is every admitted hit

MODES = {
    "periodic 1 s": "sync_rate = 1",
    "periodic 100 ms": "sync_rate = 0.1",
    "synchronous": "sync_rate = 0",
    "strict": 'sync_rate = 1\nadmission = "strict"\non_store_failure = "deny"',
}
LIMITADOR = {"Limitador redis_cached (1 s)": "redis_cached", "Limitador redis": "redis"}
FAULTS = ("none", "SIGKILL one node", "one node cut from the store", "store down 10 s",
          "store hung 10 s", "one node's clock 40 s ahead")
# what each mode promises per window, n nodes, L the limit
BOUND = {
    "periodic 1 s": "L plus what the other nodes admit in about two sync periods (each node sees the others' hits "
                    "a period late); a node that cannot reach the store decides on what it holds, so a node cut "
                    "off admits up to L more, and a store outage up to n × L",
    "periodic 100 ms": "the same, with periods ten times shorter",
    "synchronous": "L while the store answers; a request the store does not answer within answer_timeout is "
                   "decided on what the node holds (as periodic), so an outage admits up to n × L",
    "strict": "L, always: a node admits only quota the store granted it (on_store_failure = \"deny\": "
              "while the store cannot be asked, nothing)",
    "Limitador redis_cached (1 s)": "as periodic 1 s: counts flushed every second; while Redis is away each "
                                    "instance counts alone",
    "Limitador redis": "L while Redis answers (a script call per request); while it does not, every request "
                       "is an error (500), none admitted",
}


class Store:
    """A Redis of the scenario's own, saved to disk so it can go down and come back."""

    def __init__(self):
        self.dir = os.path.join(WORK, f"redis-{time.monotonic_ns()}")
        os.makedirs(self.dir)
        self.start()

    def start(self):
        self.proc = Process(["redis-server", "--port", str(STORE_PORT), "--dir", self.dir, "--save", "",
                             "--appendonly", "yes", "--appendfsync", "always"], port=STORE_PORT)

    def cli(self, *args):
        return subprocess.run(["redis-cli", "-p", str(STORE_PORT), *args], capture_output=True,
                              text=True, timeout=10).stdout

    def down(self):
        self.proc.stop()

    def close(self):
        self.proc.signal(signal.SIGCONT)
        self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


class Proxy:
    """socat from PROXY_PORTS[i] to the store: cut it and the node is cut off."""

    def __init__(self, port):
        self.port = port
        self.start()

    def start(self):
        self.proc = Process(["socat", f"TCP-LISTEN:{self.port},fork,reuseaddr",
                             f"TCP:127.0.0.1:{STORE_PORT}"], port=self.port)

    def cut(self):
        self.proc.kill()   # the listener and every connection it forked


def nginx():
    conf = os.path.join(WORK, "nginx.conf")
    servers = "\n".join(f"    server 127.0.0.1:{p} max_fails=1 fail_timeout=1s;" for p in NODE_PORTS)
    with open(conf, "w") as f:
        f.write(f"""worker_processes 1;
daemon off;
pid {WORK}/nginx.pid;
error_log {WORK}/nginx.err warn;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  client_body_temp_path {WORK}/nginx-body;
  proxy_temp_path {WORK}/nginx-proxy;
  upstream swin {{
{servers}
    keepalive 32;
  }}
  server {{
    listen 127.0.0.1:{LB_PORT};
    location / {{
      proxy_pass http://swin;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_next_upstream error timeout;
      proxy_connect_timeout 200ms;
      proxy_read_timeout 5s;
    }}
  }}
}}
""")
    return Process(["nginx", "-p", WORK, "-c", conf], port=LB_PORT)


def swin_config(mode, i):
    return (f'store_timeout = 2\ndata_dir = "{WORK}/data-{i}"\n[stores.main]\nkind = "redis"\nurl = "redis://127.0.0.1:{PROXY_PORTS[i]}"\n'
            f'prefix = "f"\n[[namespaces]]\nname = "api"\nwindow_sizes = [{W}, {TOTAL}]\n'
            f'limits = [{{ window_size = {W}, limit = {L} }}, {{ window_size = {TOTAL}, limit = 1000000000 }}]\n'
            f'store = "main"\n{MODES[mode]}\n')


def start_one(mode, i, skewed):
    wrapper = ("faketime", "-f", "+40s") if skewed else ()
    if mode in LIMITADOR:
        return limitador(LIMITADOR[mode], NODE_PORTS[i], redis=f"redis://127.0.0.1:{PROXY_PORTS[i]}",
                         limit=(L, W), wrapper=wrapper)
    return node(swin_config(mode, i), NODE_PORTS[i], wrapper=wrapper)


def stored_total(store, mode):
    """The admitted hits the store holds: the hour window's count (swin) or the hour
    limit's counter (Limitador)."""
    if mode in LIMITADOR:
        total = 0
        for key in store.cli("--scan").split("\n"):
            if key and int(store.cli("ttl", key) or -1) > 600 and store.cli("type", key).strip() == "string":
                total += int(float(store.cli("get", key) or 0))
        return total
    fields = store.cli("hgetall", f"f:{{3:api:hot}}:{TOTAL}").split("\n")
    pairs = dict(zip(fields[0::2], fields[1::2]))
    # strict: the count includes quota granted and not yet used; a stopped node gives its
    # unused quota back, a killed node's stays counted until its hold lapses
    return round(sum(float(v) for k, v in pairs.items() if k and k[0].isdigit()))


def scenario(mode, fault):
    store = Store()
    proxies = [Proxy(p) for p in PROXY_PORTS]
    nodes = [start_one(mode, i, fault == "one node's clock 40 s ahead" and i == 2) for i in range(3)]
    lb = nginx()
    try:
        # the load starts on a window's edge, so every window but the last is whole
        time.sleep(W - time.time() % W)
        t0 = time.monotonic()
        loader = subprocess.Popen([f"{BIN}/swin-bench", "load", "--json", "--target", f"127.0.0.1:{LB_PORT}",
                                   "--connections", "32", "--rate", str(3 * L / W), "--duration", str(RUN),
                                   "--keys", "hot", "--windows", str(W), "--namespace", "api",
                                   *(("--limitador",) if mode in LIMITADOR else ("--hit",))],
                                  stdout=subprocess.PIPE, text=True)
        time.sleep(max(0.0, FAULT_AT - (time.monotonic() - t0)))
        undo = inject(fault, store, proxies, nodes, mode)
        time.sleep(FAULT_FOR)
        if undo:
            undo()
        out, _ = loader.communicate(timeout=RUN + 60)
        import json
        rep = json.loads(out)
        time.sleep(2)
        for n in nodes:
            n.stop()
        windows = sorted(rep["admitted_per_window"].items())[:-1] if rep["admitted_per_window"] else []
        straddling = rep.get("straddling_per_window", {})
        admitted = rep["statuses"].get("200", 0)
        return {"mode": mode, "fault": fault, "admitted": admitted, "stored": stored_total(store, mode),
                "per_window": [n for _, n in windows], "straddling": [straddling.get(w, 0) for w, _ in windows],
                "statuses": rep["statuses"],
                "unanswered": rep["unanswered"], "limit": L, "window_s": W}
    finally:
        lb.stop()
        for n in nodes:
            n.kill()
        for p in proxies:
            p.proc.kill()
        store.close()


def inject(fault, store, proxies, nodes, mode):
    """Starts the fault; returns what ends it (None: it is not undone)."""
    if fault == "SIGKILL one node":
        nodes[2].kill()

        def restart():
            nodes[2] = start_one(mode, 2, False)
        return restart
    if fault == "one node cut from the store":
        proxies[2].cut()
        return proxies[2].start
    if fault == "store down 10 s":
        store.down()
        return store.start
    if fault == "store hung 10 s":
        store.proc.signal(signal.SIGSTOP)
        return lambda: store.proc.signal(signal.SIGCONT)
    return None


def measure(modes, faults):
    results = []
    for mode in modes:
        for fault in faults:
            r = scenario(mode, fault)
            say(f"  {mode} / {fault}: per window {r['per_window']} (limit {L}); admitted {r['admitted']}, "
                f"stored {r['stored']}")
            results.append(r)
            save("faults-partial", {"results": results})   # what a crash would lose
    return {"results": results, "limit": L, "window_s": W, "run_s": RUN, "fault_at_s": FAULT_AT,
            "fault_for_s": FAULT_FOR, "offered_per_window": 3 * L, "bounds": BOUND}


def tables(data):
    L = data["limit"]
    lines = [f"## How exact under each fault: three nodes behind nginx, one key, limit {L} per "
             f"{data['window_s']} s, {3 * L} offered per window (open loop), {data['run_s']:g} s, the fault "
             f"from {data['fault_at_s']:g} s for {data['fault_for_s']:g} s", "",
             "| mode | fault | most admitted in a window (× limit) | windows over the limit | admitted | "
             "reached the store | admitted − stored |", "|---|---|---|---|---|---|---|"]
    for r in data["results"]:
        most = max(r["per_window"], default=0)
        # a window over the limit by no more than the answers sent before its edge may
        # have admitted them in the window before: over only past those
        sure = [n - s for n, s in zip(r["per_window"], r.get("straddling", [0] * len(r["per_window"])))]
        over = sum(1 for n in sure if n > L)
        edge = max((s for s in r.get("straddling", [])), default=0)
        lines.append(f"| {r['mode']} | {r['fault']} | {most} ({most / L:.2f}) | {over} of {len(r['per_window'])}"
                     f"{f' (±{edge} at an edge)' if edge else ''} | {r['admitted']} | {r['stored']} | "
                     f"{r['admitted'] - r['stored']} |")
    lines += ["", "What each mode promises per window:", ""]
    run = {r["mode"] for r in data["results"]}
    lines += [f"- **{m}**: {b}" for m, b in BOUND.items() if m in run]
    return "\n".join(lines) + "\n"
