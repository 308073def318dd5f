"""Decisions per second per proxy: Envoy's rate limit service (one ShouldRateLimit RPC
per request) against its rate limit quota service (each request decided in the proxy
under its assignment; one report per second on a stream), for the same limit and the
same client — one Python grpcio proxy of the suite's stand-in for Envoy's filter
(crates/swin-node/tests/rls/quota.py). Closed loop: each proxy decides as fast as it
can for SECONDS. Prints one JSON line per protocol.

usage: bench-quota-vs-rls.py HOST:PORT DOMAIN SECONDS
"""

import json
import os
import sys
import time

import grpc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "crates", "swin-node", "tests", "rls"))
from quota import Proxy  # noqa: E402


def rls(target, domain, seconds):
    stub = rls_pb2_grpc.RateLimitServiceStub(grpc.insecure_channel(target))
    req = rls_pb2.RateLimitRequest(domain=domain, descriptors=[ratelimit_pb2.RateLimitDescriptor(
        entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key="name", value="api")])])
    n = ok = 0
    lat = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t = time.monotonic()
        r = stub.ShouldRateLimit(req, timeout=5)
        lat.append(time.monotonic() - t)
        n += 1
        ok += r.overall_code == rls_pb2.RateLimitResponse.OK
    lat.sort()
    return {"protocol": "rls", "decisions_per_s": n / seconds, "allowed": ok,
            "p50_ms": 1e3 * lat[len(lat) // 2], "p99_ms": 1e3 * lat[int(len(lat) * 0.99)]}


def rlqs(target, domain, seconds):
    p = Proxy(0, target, domain, {"name": "api"}, 1.0, True)
    n = ok = 0
    lat = []
    end = time.monotonic() + seconds
    while True:
        now = time.monotonic()
        if now >= end:
            break
        p.report(now)
        ok += p.decide(now)
        lat.append(time.monotonic() - now)
        n += 1
    p.stop()
    lat.sort()
    return {"protocol": "rlqs", "decisions_per_s": n / seconds, "allowed": ok,
            "p50_ms": 1e3 * lat[len(lat) // 2], "p99_ms": 1e3 * lat[int(len(lat) * 0.99)]}


if __name__ == "__main__":
    target, domain, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    for run in (rls, rlqs, rls, rlqs):
        print(json.dumps(run(target, domain, seconds)), flush=True)
