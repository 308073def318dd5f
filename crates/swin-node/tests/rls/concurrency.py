"""Envoy's negative hits as a Python grpcio client sends them, against two nodes whose
namespace "inflight" allows 4 requests in flight per key (tests/rls/concurrency.rs).
xds-protos has no `is_negative_hits` yet: it is set as Envoy's newer protos carry it,
field 4 of RateLimitDescriptor, a varint. Exits non-zero, saying what differed.

usage: concurrency.py HOST:PORT HOST:PORT
"""

import sys

import grpc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

OK = rls_pb2.RateLimitResponse.OK
OVER = rls_pb2.RateLimitResponse.OVER_LIMIT

# field 4 (is_negative_hits), wire type 0 (varint), value 1
NEGATIVE_HITS = bytes([4 << 3 | 0, 1])


def descriptor(user, negative=False):
    d = ratelimit_pb2.RateLimitDescriptor(
        entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key="user", value=user)]
    )
    if negative:
        # kept as an unknown field and sent as written
        d.MergeFromString(NEGATIVE_HITS)
        if NEGATIVE_HITS not in d.SerializeToString():
            sys.exit("this protobuf runtime drops unknown fields")
    return d


def expect(what, got, want):
    if got != want:
        sys.exit(f"{what}: got {got!r}, want {want!r}")
    print(f"ok: {what}")


def main(a, b):
    stubs = [rls_pb2_grpc.RateLimitServiceStub(grpc.insecure_channel(t)) for t in (a, b)]

    def ask(node, user, negative=False):
        return stubs[node].ShouldRateLimit(
            rls_pb2.RateLimitRequest(domain="inflight", descriptors=[descriptor(user, negative)]),
            timeout=5,
        )

    for i in range(4):
        r = ask(i % 2, "py")
        expect(f"start {i}", r.overall_code, OK)
        expect(f"start {i}: remaining", r.statuses[0].limit_remaining, 3 - i)
    r = ask(0, "py")
    expect("a fifth in flight", r.overall_code, OVER)
    expect("its limit", r.statuses[0].current_limit.requests_per_unit, 4)
    expect("end one on the other node", ask(1, "py", negative=True).overall_code, OK)
    expect("a slot is free at once", ask(0, "py").overall_code, OK)
    expect("full again", ask(1, "py").overall_code, OVER)
    for i in range(4):
        expect(f"end {i}", ask(i % 2, "py", negative=True).overall_code, OK)
    for i in range(4):
        expect(f"start again {i}", ask(i % 2, "py").overall_code, OK)
    for i in range(4):
        ask(i % 2, "py", negative=True)
    print("ok: all ended")


if __name__ == "__main__":
    main(*sys.argv[1:3])
