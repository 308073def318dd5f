"""Envoy's ShouldRateLimit with many descriptors, as its Python client sends it: median
wall-clock latency of ROUNDS requests of N distinct descriptors each (fresh values every
request, so every descriptor is a new key), printed as JSON. Run by scripts/bench
(grpc-descriptors) against a node whose DOMAIN has an `api_key` rule.

usage: bench-descriptors.py HOST:PORT DOMAIN N ROUNDS
"""

import json
import statistics
import sys
import time
import uuid

import grpc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc


def main(target, domain, n, rounds):
    channel = grpc.insecure_channel(
        target, options=[("grpc.max_send_message_length", 64 << 20)]
    )
    rls = rls_pb2_grpc.RateLimitServiceStub(channel)
    took = []
    for r in range(rounds + 1):
        tag = uuid.uuid4().hex[:8]
        req = rls_pb2.RateLimitRequest(
            domain=domain,
            descriptors=[
                ratelimit_pb2.RateLimitDescriptor(
                    entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key="api_key", value=f"{tag}-{i}")]
                )
                for i in range(n)
            ],
        )
        start = time.perf_counter()
        answer = rls.ShouldRateLimit(req, timeout=60)
        ms = (time.perf_counter() - start) * 1e3
        if answer.overall_code != rls_pb2.RateLimitResponse.OK:
            sys.exit(f"round {r}: not OK")
        if r > 0:  # the first warms the channel
            took.append(ms)
    print(json.dumps({"descriptors": n, "rounds": rounds, "median_ms": statistics.median(took), "min_ms": min(took)}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
