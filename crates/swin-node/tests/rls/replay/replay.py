"""envoyproxy/ratelimit's test cases replayed against a swin node with Python's grpcio and
Envoy's protos (xds-protos). Each case is named after the Go test it comes from and asks
what that test asks (the rule files are in rules/), expecting what it expects of the
decision-bearing fields: the overall code, and per descriptor the code, the limit
(requests per unit, unit, name) and what remains; duration_until_reset where the test
compares it. Run by tests/rls/replay.rs.

usage: replay.py HOST:PORT PHASE MODE
  PHASE  start | reloaded | removed   (the reload test's three configs)
  MODE   count_denied   every hit counts, as envoyproxy/ratelimit counts by default
         all_or_nothing swin's default: a request over the limit counts nothing, as
                        envoyproxy/ratelimit with STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT

Prints a line per request that differs, then "lookups: L; requests: N agree, M differ"
(L of the requests are config_test.go's limit lookups) and exits 1 when any differs.
"""

import random
import sys
import time

import grpc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

R = rls_pb2.RateLimitResponse
UNIT = {u: R.RateLimit.Unit.Value(u) for u in ("SECOND", "MINUTE", "HOUR", "DAY")}
NO_LIMIT = object()
MAX = 4294967295

CASES = []


def case(name, phase="start"):
    def wrap(f):
        CASES.append((name, phase, f))
        return f

    return wrap


class Replay:
    def __init__(self, target, mode):
        self.rls = rls_pb2_grpc.RateLimitServiceStub(grpc.insecure_channel(target))
        self.mode = mode
        self.agree = 0
        self.differ = 0
        self.lookups = 0
        self.case = ""

    def ask(self, domain, *descriptors, hits=0):
        """descriptors: each a list of (key, value)."""
        req = rls_pb2.RateLimitRequest(domain=domain, hits_addend=hits)
        for entries in descriptors:
            req.descriptors.append(
                ratelimit_pb2.RateLimitDescriptor(
                    entries=[
                        ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v)
                        for k, v in entries
                    ]
                )
            )
        return self.rls.ShouldRateLimit(req, timeout=10)

    def expect(self, answer, overall, *statuses):
        """statuses: (code, limit, remaining[, name]) with limit (rpu, UNIT) or NO_LIMIT."""
        got = [R.Code.Name(answer.overall_code)]
        want = [overall]
        for s, w in zip(answer.statuses, statuses):
            code, limit, remaining = w[:3]
            want.append(code)
            got.append(R.Code.Name(s.code))
            if limit is NO_LIMIT:
                want.append(None)
                got.append(None if not s.HasField("current_limit") else str(s.current_limit))
            else:
                want.append(limit)
                got.append(
                    (s.current_limit.requests_per_unit, R.RateLimit.Unit.Name(s.current_limit.unit))
                )
            if remaining is not None:
                want.append(remaining)
                got.append(s.limit_remaining)
            if len(w) > 3:
                want.append(w[3])
                got.append(s.current_limit.name)
        want.append(len(statuses))
        got.append(len(answer.statuses))
        if got == want:
            self.agree += 1
        else:
            self.differ += 1
            print(f"differ: {self.case}: got {got}, want {want}")
        return answer

    def ok_without_limit(self, domain, *entries):
        self.lookups += 1
        self.expect(self.ask(domain, list(entries)), "OK", ("OK", NO_LIMIT, 0))

    def limit_of(self, domain, entries, rpu, unit, name=None):
        """A lookup of config_test.go: the limit a fresh descriptor finds (one hit)."""
        self.lookups += 1
        answer = self.ask(domain, list(entries))
        want = ("OK", (rpu, unit), rpu - 1) + ((name,) if name is not None else ())
        self.expect(answer, "OK", want)


def unique(prefix):
    return f"{prefix}{time.time_ns()}-{random.getrandbits(40)}"


@case("integration_test.go testBasicBaseConfig")
def basic_base_config(r):
    r.ok_without_limit("foo", ("hello", "world"))
    r.expect(r.ask("basic", [("key1", "foo")]), "OK", ("OK", (50, "SECOND"), 49))
    value = unique("")
    for i in range(25):
        over = i >= 20
        code = "OVER_LIMIT" if over else "OK"
        r.expect(
            r.ask("another", [("key2", value)]),
            code,
            (code, (20, "MINUTE"), 0 if over else 20 - (i + 1)),
        )
    # two keys of one domain: key3 goes over after 10
    value = unique("")
    for i in range(15):
        over = i >= 10
        first = 20 - (i + 1)
        if over and r.mode == "all_or_nothing":
            first = 10  # STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT's answer
        code = "OVER_LIMIT" if over else "OK"
        r.expect(
            r.ask("another", [("key2", value)], [("key3", value)]),
            code,
            ("OK", (20, "MINUTE"), first),
            (code, (10, "HOUR"), 0 if over else 10 - (i + 1)),
        )
    # the time until reset runs down
    first = r.ask("another", [("key4", "durTest")])
    time.sleep(2)
    second = r.ask("another", [("key4", "durTest")])
    a = first.statuses[0].duration_until_reset.seconds
    b = second.statuses[0].duration_until_reset.seconds
    if b < a:
        r.agree += 2
    else:
        r.differ += 2
        print(f"differ: {r.case}: duration_until_reset {a} then {b}, not less")


@case("integration_test.go testConfigReload (before)")
def reload_before(r):
    r.ok_without_limit("reload", ("block", "foo"))


@case("integration_test.go testConfigReload (reloaded)", phase="reloaded")
def reload_after(r):
    # the new file's limits, once the reload is read (the driver sends SIGHUP)
    deadline = time.time() + 10
    while time.time() < deadline:
        if r.ask("reload", [("key1", "warm")]).statuses[0].HasField("current_limit"):
            break
        time.sleep(0.1)
    r.expect(r.ask("reload", [("key1", "foo")]), "OK", ("OK", (50, "SECOND"), 49))
    r.expect(r.ask("reload", [("block", "foo")]), "OVER_LIMIT", ("OVER_LIMIT", (0, "SECOND"), 0))


@case("integration_test.go testConfigReload (file removed)", phase="removed")
def reload_removed(r):
    deadline = time.time() + 10
    while time.time() < deadline:
        if not r.ask("reload", [("key1", "warm")]).statuses[0].HasField("current_limit"):
            break
        time.sleep(0.1)
    r.ok_without_limit("reload", ("key1", "foo"))


@case("integration_test.go testShareThreshold")
def share_threshold(r):
    for i in range(10):
        r.expect(
            r.ask("share-threshold-test", [("files", "files/a.pdf")]),
            "OK",
            ("OK", (10, "HOUR"), 10 - (i + 1)),
        )
    # files/b.csv shares files/a.pdf's counter: over
    r.expect(
        r.ask("share-threshold-test", [("files", "files/b.csv")]),
        "OVER_LIMIT",
        ("OVER_LIMIT", (10, "HOUR"), 0),
    )
    # without share_threshold every value counts on its own
    for _ in range(10):
        r.expect(
            r.ask("share-threshold-test", [("files_no_share", unique("files_no_share/"))]),
            "OK",
            ("OK", (10, "HOUR"), 9),
        )


@case("config_test.go TestBasicConfig")
def basic_config(r):
    d = "test-domain"
    r.expect(r.ask("foo_domain", []), "OK", ("OK", NO_LIMIT, 0))
    r.expect(r.ask(d, []), "OK", ("OK", NO_LIMIT, 0))
    r.ok_without_limit(d, ("key1", "something"))
    r.ok_without_limit(d, ("key1", "value1"))
    r.ok_without_limit(d, ("key2", "value2"), ("subkey", "subvalue"))
    r.ok_without_limit(d, ("key5", "value5"), ("subkey5", "subvalue"))
    r.limit_of(d, [("key1", "value1"), ("subkey1", "something")], 5, "SECOND")
    r.limit_of(d, [("key1", "value1"), ("subkey1", "subvalue1")], 10, "SECOND")
    r.limit_of(d, [("key2", "something")], 20, "MINUTE")
    r.limit_of(d, [("key2", "value2")], 30, "MINUTE")
    r.ok_without_limit(d, ("key2", "value3"))
    r.limit_of(d, [("key3", "foo")], 1, "HOUR", name="")
    r.limit_of(d, [("key4", "foo")], 1, "DAY", name="key4_rate_limit")
    r.expect(r.ask(d, [("key6", "foo")]), "OK", ("OK", NO_LIMIT, MAX))
    r.limit_of(d, [("key7", "unspecified_value")], 70, "MINUTE")
    # another value of key7 finds the same limit and counts apart (the counter key holds
    # the value; detailed_metric changes only statistics)
    r.limit_of(d, [("key7", "another_value")], 70, "MINUTE")


@case("config_test.go TestShadowModeConfig")
def shadow_mode(r):
    d = "shadow-domain"
    r.limit_of(d, [("key1", "value1"), ("subkey1", "something")], 5, "SECOND")
    r.limit_of(d, [("key2", "value2")], 30, "MINUTE")
    # a shadow rule past its limit answers OK, nothing left
    for i in range(21):
        r.expect(
            r.ask(d, [("key2", "something")]),
            "OK",
            ("OK", (20, "MINUTE"), max(0, 20 - (i + 1))),
        )


@case("config_test.go TestWildcardConfig")
def wildcard(r):
    d = "wildcard-domain"
    # a key without a value: one limit for every value, counted per value
    r.limit_of(d, [("noVal", "foo1")], 20, "MINUTE")
    r.limit_of(d, [("noVal", "foo2")], 20, "MINUTE")
    # a wildcard without share_threshold: the same limit, each value its own counter
    r.limit_of(d, [("wild", "foo1")], 20, "MINUTE")
    r.limit_of(d, [("wild", "foo2")], 20, "MINUTE")
    r.limit_of(d, [("nestedWild", "val1"), ("wild", "goo2")], 20, "MINUTE")
    r.ok_without_limit(d, ("wild", "bar"))
    r.ok_without_limit(d, ("noWild", "foo1"))
    for v in ("barab", "bar123b", "barb"):
        r.limit_of(d, [("midWild", v)], 20, "MINUTE")
    for v in ("bara", "xbarb"):
        r.ok_without_limit(d, ("midWild", v))
    for v in ("foo123bar456baz", "foobarbaz"):
        r.limit_of(d, [("multiWild", v)], 10, "MINUTE")
    for v in ("foo123baz", "bar456baz"):
        r.ok_without_limit(d, ("multiWild", v))


def shares(r, domain, first, second, rpu):
    """Two descriptors that must count on one counter: the second sees the first's hit."""
    r.expect(r.ask(domain, first), "OK", ("OK", (rpu, "MINUTE"), rpu - 1))
    r.expect(r.ask(domain, second), "OK", ("OK", (rpu, "MINUTE"), rpu - 2))


def apart(r, domain, first, second, rpu):
    """Two descriptors of one rule that must count apart."""
    r.expect(r.ask(domain, first), "OK", ("OK", (rpu, "MINUTE"), rpu - 1))
    r.expect(r.ask(domain, second), "OK", ("OK", (rpu, "MINUTE"), rpu - 1))


@case("config_test.go TestShareThreshold")
def share_threshold_config(r):
    d = "share-domain"
    shares(r, d, [("files", "files/a.pdf")], [("files", "files/b.csv")], 100)
    shares(r, d, [("route", "api/v1"), ("method", "GET")], [("route", "api/v2"), ("method", "GET")], 60)
    apart(r, d, [("route", "api/v1"), ("method", "PUT")], [("route", "api/v1"), ("method", "POST")], 60)
    shares(
        r, d,
        [("nested", "parent"), ("files", "nested/file1.txt")],
        [("nested", "parent"), ("files", "nested/file2.txt")],
        200,
    )
    shares(
        r, d,
        [("files", "top/file1.txt"), ("files", "nested/file1.txt")],
        [("files", "top/file2.txt"), ("files", "nested/file9.txt")],
        300,
    )
    # the parent shares, the child's wildcard does not
    shares(
        r, d,
        [("path", "path/foo"), ("file", "file/doc1"), ("type", "pdf")],
        [("path", "path/bar"), ("file", "file/doc1"), ("type", "pdf")],
        120,
    )
    apart(
        r, d,
        [("path", "path/foo"), ("file", "file/doc2"), ("type", "pdf")],
        [("path", "path/foo"), ("file", "file/doc3"), ("type", "pdf")],
        120,
    )
    shares(
        r, d,
        [("user", "user/alice"), ("resource", "res/file1"), ("action", "read")],
        [("user", "user/bob"), ("resource", "res/file2"), ("action", "read")],
        150,
    )
    # an exact value keeps its own limit and counter beside a shared pattern
    r.limit_of(d, [("file", "test1")], 50, "MINUTE")
    shares(r, d, [("file", "test2")], [("file", "testing")], 100)
    shares(r, d, [("midpath", "/api/v1")], [("midpath", "/api-beta-v1")], 100)
    r.ok_without_limit(d, ("midpath", "/api/v2"))
    shares(r, d, [("multiroute", "svcAepBrpc")], [("multiroute", "svc-ep-rpc")], 50)
    r.ok_without_limit(d, ("multiroute", "svcABCrpc"))
    shares(
        r, d,
        [("tenant", "t1prod"), ("resource", "resAv2")],
        [("tenant", "t99prod"), ("resource", "resBBBv2")],
        60,
    )


@case("config_test.go TestMetadata")
def metadata(r):
    d = "metadata-domain"
    answer = r.ask(d, [("key1", "value1"), ("subkey1", "something")])
    r.expect(answer, "OK", ("OK", (5, "SECOND"), 4))
    meta = answer.dynamic_metadata.fields["metadata"].struct_value.fields
    got = meta["name"].string_value if "name" in meta else None
    answer = r.ask(d, [("key2", "something")])
    r.expect(answer, "OK", ("OK", (20, "MINUTE"), 19))
    meta = answer.dynamic_metadata.fields["metadata"].struct_value.fields
    quota = meta["service_with_quota"].struct_value.fields["name"].string_value
    if (got, quota) == ("service_1", "service_2"):
        r.agree += 1
    else:
        r.differ += 1
        print(f"differ: {r.case}: metadata {got!r}, {quota!r}")


def main(target, phase, mode):
    r = Replay(target, mode)
    for name, p, f in CASES:
        if p == phase:
            r.case = name
            f(r)
    print(f"lookups: {r.lookups}; requests: {r.agree} agree, {r.differ} differ")
    sys.exit(1 if r.differ else 0)


if __name__ == "__main__":
    main(*sys.argv[1:])
