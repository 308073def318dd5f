"""What the figures' runs share: the binaries, starting and stopping swin nodes and
Limitador, the load tool, Redis prefixes, medians. Run by scripts/bench report."""

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("SWIN_BENCH_BIN") or os.path.join(ROOT, "target", "release")
PEER = os.environ.get("SWIN_PEER_BIN", "")
REDIS = os.environ.get("SWIN_TEST_REDIS_URL", "redis://127.0.0.1:6379")
WORK = tempfile.mkdtemp(prefix="swin-figures-")
LOG = open(os.path.join(WORK, "processes.log"), "ab")
DURATION = float(os.environ.get("DURATION", "5"))
ROUNDS = int(os.environ.get("SWIN_BENCH_ROUNDS", "3"))

# the one limit of the throughput and latency runs: never reached, every hit allowed
NEVER = "limits = [{ window_size = 60, limit = 1000000000 }]"


def say(*args):
    print(*args, file=sys.stderr, flush=True)


def median(values):
    return statistics.median(values) if values else float("nan")


def wait_port(port, timeout=15.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port} after {timeout} s")


def http_get(url, timeout=2.0):
    """(status, body) of a GET; status 0 when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return 0, b""


class Process:
    """A server started by a run: stopped with SIGTERM (or killed) and waited for."""

    def __init__(self, argv, env=None, port=None):
        self.argv = argv
        if port:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    raise RuntimeError(f"port {port} is taken before {argv[0]} starts (a server left over?)")
            except OSError:
                pass
        self.proc = subprocess.Popen(argv, stdout=LOG, stderr=LOG, env={**os.environ, **(env or {})},
                                     start_new_session=True)
        if port:
            try:
                wait_port(port)
            except RuntimeError:
                self.kill()
                raise

    def stop(self, timeout=30):
        """SIGTERM to the process's group (a wrapper such as faketime and what it runs)."""
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self.kill()
        return self.proc.returncode

    def kill(self):
        self.signal(signal.SIGKILL)
        self.proc.wait()

    def signal(self, sig):
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass


def node(config, port, wrapper=(), env=None):
    """A swin-node on 127.0.0.1:port with `config` (TOML text), ready when it returns."""
    path = os.path.join(WORK, f"node-{port}-{time.monotonic_ns()}.toml")
    with open(path, "w") as f:
        f.write(config)
    p = Process([*wrapper, f"{BIN}/swin-node", "--config", path, "--listen", f"127.0.0.1:{port}"],
                env={"RUST_LOG": "warn", **(env or {})}, port=port)
    end = time.monotonic() + 15
    while http_get(f"http://127.0.0.1:{port}/readyz")[0] != 200:
        if time.monotonic() > end or p.proc.poll() is not None:
            p.kill()
            raise RuntimeError(f"swin-node on {port} not ready; see {LOG.name}")
        time.sleep(0.05)
    return p


def limitador(storage, port, grpc_port=None, redis=REDIS, limit=None, flush_ms=1000, wrapper=()):
    """Limitador (bench/limitador-peer) on port, and its RLS door on grpc_port."""
    if not PEER:
        raise RuntimeError("SWIN_PEER_BIN is not set (scripts/bench report builds it)")
    env = {}
    if grpc_port:
        env["LIMITADOR_PEER_GRPC"] = f"127.0.0.1:{grpc_port}"
    if limit:
        env["LIMITADOR_PEER_LIMIT"] = f"{limit[0]}/{limit[1]}"
    p = Process([*wrapper, PEER, storage, f"127.0.0.1:{port}", str(flush_ms), redis], env=env, port=port)
    if grpc_port:
        wait_port(grpc_port)
    return p


def load(*args):
    """One swin-bench load run: its JSON report."""
    out = subprocess.run([f"{BIN}/swin-bench", "load", "--json", *map(str, args)],
                         check=True, capture_output=True, text=True, timeout=600)
    return json.loads(out.stdout)


def redis_store(prefix):
    return f'kind = "redis"\nurl = "{REDIS}"\nprefix = "{prefix}"\n'


def drop_redis(pattern):
    keys = subprocess.run(["redis-cli", "-u", REDIS, "--scan", "--pattern", pattern],
                          capture_output=True, text=True).stdout.split()
    for i in range(0, len(keys), 500):
        subprocess.run(["redis-cli", "-u", REDIS, "del", *keys[i:i + 500]], capture_output=True)


def save(name, data):
    """Writes docs/benchmarks/NAME.json."""
    path = os.path.join(ROOT, "docs", "benchmarks", f"{name}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.write("\n")
    return path


def machine():
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    return {"cores": os.cpu_count(), "cpu": cpu, "at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
