"""Envoy's rate limit service as a Python grpcio client sees it (Envoy's own protos from
xds-protos): run by tests/rls/main.rs against a node whose namespace "edge" has the rules of
EDGE_YAML there. Exits non-zero, saying what differed, on the first surprise.

usage: client.py HOST:PORT
"""

import sys

import grpc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from google.protobuf import wrappers_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

OK = rls_pb2.RateLimitResponse.OK
OVER = rls_pb2.RateLimitResponse.OVER_LIMIT


def descriptor(*entries, hits=None, limit=None):
    d = ratelimit_pb2.RateLimitDescriptor(
        entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in entries]
    )
    if hits is not None:
        d.hits_addend.CopyFrom(wrappers_pb2.UInt64Value(value=hits))
    if limit is not None:
        d.limit.CopyFrom(
            ratelimit_pb2.RateLimitDescriptor.RateLimitOverride(
                requests_per_unit=limit[0], unit=limit[1]
            )
        )
    return d


def expect(what, got, want):
    if got != want:
        sys.exit(f"{what}: got {got!r}, want {want!r}")
    print(f"ok: {what}")


def main(target):
    channel = grpc.insecure_channel(target)
    rls = rls_pb2_grpc.RateLimitServiceStub(channel)

    def ask(domain, descriptors, hits=0):
        return rls.ShouldRateLimit(
            rls_pb2.RateLimitRequest(domain=domain, descriptors=descriptors, hits_addend=hits),
            timeout=5,
        )

    login = lambda ip: descriptor(("generic_key", "login"), ("remote_address", ip))
    for i in range(3):
        r = ask("edge", [login("10.0.0.1"), descriptor(("no", "rule"))])
        expect(f"login hit {i}: overall", r.overall_code, OK)
        expect(f"login hit {i}: remaining", r.statuses[0].limit_remaining, 2 - i)
        expect(f"login hit {i}: limit", r.statuses[0].current_limit.requests_per_unit, 3)
        expect(f"login hit {i}: unit", r.statuses[0].current_limit.unit, rls_pb2.RateLimitResponse.RateLimit.MINUTE)
        expect(f"login hit {i}: unmatched descriptor has no limit", r.statuses[1].HasField("current_limit"), False)
    r = ask("edge", [login("10.0.0.1"), login("10.0.0.2")])
    expect("over the limit: overall", r.overall_code, OVER)
    expect("over the limit: per descriptor", [s.code for s in r.statuses], [OVER, OK])
    keys = {h.key for h in r.response_headers_to_add}
    expect("headers", {"RateLimit-Policy", "RateLimit", "Retry-After"} <= keys, True)

    expect("request hits_addend", ask("edge", [descriptor(("path", "/api/py"))], hits=2).overall_code, OK)
    expect("descriptor hits_addend", ask("edge", [descriptor(("path", "/api/py"), hits=1)]).overall_code, OVER)
    expect("prefix value", ask("edge", [descriptor(("path", "/api/py2"))]).statuses[0].current_limit.requests_per_unit, 2)
    for i in range(4):
        r = ask("edge", [descriptor(("user", "admin"))])
        expect(f"unlimited {i}", (r.overall_code, r.statuses[0].HasField("current_limit")), (OK, False))
    for i in range(3):
        r = ask("edge", [descriptor(("user", "py"))])
        expect(f"shadow mode {i}", (r.overall_code, r.statuses[0].code), (OK, OK))
    r = ask("edge", [descriptor(("user", "py2")), descriptor(("vip", "py2"))])
    expect("replaces", (r.statuses[0].HasField("current_limit"), r.statuses[1].current_limit.name), (False, "vip"))
    second = rls_pb2.RateLimitResponse.RateLimit.SECOND
    own = descriptor(("own", "py"), limit=(1, second))
    expect("own limit, first", ask("edge", [own]).overall_code, OK)
    expect("own limit, second", ask("edge", [own]).overall_code, OVER)
    r = ask("unknown-domain", [login("10.0.0.1")])
    expect("unknown domain", (r.overall_code, r.statuses[0].HasField("current_limit")), (OK, False))
    for name, domain, descriptors in [
        ("empty domain", "", [login("10.0.0.1")]),
        ("no descriptors", "edge", []),
    ]:
        try:
            ask(domain, descriptors)
            sys.exit(f"{name}: answered, want INVALID_ARGUMENT")
        except grpc.RpcError as e:
            expect(name, e.code(), grpc.StatusCode.INVALID_ARGUMENT)

    # a descriptor with no entries: OK with no limit, as envoyproxy/ratelimit answers
    r = ask("edge", [descriptor()])
    expect("no entries", (r.overall_code, r.statuses[0].HasField("current_limit")), (OK, False))

    health = health_pb2_grpc.HealthStub(channel)
    h = health.Check(health_pb2.HealthCheckRequest(service="envoy.service.ratelimit.v3.RateLimitService"), timeout=5)
    expect("health", h.status, health_pb2.HealthCheckResponse.SERVING)

    reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
    answers = list(reflection.ServerReflectionInfo(iter([
        reflection_pb2.ServerReflectionRequest(list_services=""),
        reflection_pb2.ServerReflectionRequest(file_containing_symbol="envoy.service.ratelimit.v3.RateLimitService"),
    ]), timeout=5))
    services = {s.name for s in answers[0].list_services_response.service}
    expect("reflection lists the service", "envoy.service.ratelimit.v3.RateLimitService" in services, True)
    expect("reflection lists the quota service",
           "envoy.service.rate_limit_quota.v3.RateLimitQuotaService" in services, True)
    expect("reflection has its file", len(answers[1].file_descriptor_response.file_descriptor_proto) > 0, True)
    # the descriptor as the node reads it: with Envoy's is_negative_hits (field 4)
    from google.protobuf import descriptor_pb2
    found = list(reflection.ServerReflectionInfo(iter([
        reflection_pb2.ServerReflectionRequest(
            file_containing_symbol="envoy.extensions.common.ratelimit.v3.RateLimitDescriptor"),
    ]), timeout=5))
    fields = {}
    for raw in found[0].file_descriptor_response.file_descriptor_proto:
        f = descriptor_pb2.FileDescriptorProto.FromString(raw)
        for m in f.message_type:
            if m.name == "RateLimitDescriptor":
                fields = {x.name: (x.number, x.type) for x in m.field}
    expect("reflection shows is_negative_hits", fields.get("is_negative_hits"),
           (4, descriptor_pb2.FieldDescriptorProto.TYPE_BOOL))


if __name__ == "__main__":
    main(sys.argv[1])
