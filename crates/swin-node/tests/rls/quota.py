"""A stand-in for Envoy's rate limit quota filter: simulated proxies, each deciding its
own requests locally under the assignment it holds and reporting its usage on one
bidirectional stream (envoy.service.rate_limit_quota.v3), as Envoy's filter does:

- a bucket's first request opens the stream and is reported at once; until an
  assignment arrives the bucket follows `no_assignment_behavior` (here: a blanket rule);
- a token bucket assignment is enforced as Envoy's TokenBucketImpl does: it starts full
  (max_tokens), refills continuously at tokens_per_fill per whole second of
  fill_interval, a request takes one token or is denied; an assignment equal to the one
  held keeps the bucket, a different one makes a new (full) bucket;
- blanket rules allow or deny everything; an abandon drops the bucket (its next
  request is a first request again); an assignment past its ttl falls back to
  `expired_assignment_behavior` (here: a blanket rule);
- every reporting interval each bucket reports its allowed and denied requests since its
  last report, `time_elapsed` in whole seconds (Envoy truncates it).

Each proxy offers requests at its demand (evenly spaced, per second) to one node. The
output is JSON on stdout: per proxy and per whole second of the run, the requests
allowed; and the assignments received. Phases change demands or stop proxies on the way.

usage: quota.py SPEC   (SPEC: JSON, see main())
"""

import json
import queue
import sys
import threading
import time

import grpc
from envoy.service.rate_limit_quota.v3 import rlqs_pb2, rlqs_pb2_grpc
from envoy.type.v3 import ratelimit_strategy_pb2

ALLOW_ALL = ratelimit_strategy_pb2.RateLimitStrategy.ALLOW_ALL


class TokenBucket:
    def __init__(self, max_tokens, tokens_per_fill, fill_seconds, now):
        self.max = max_tokens
        # Envoy divides by the interval's whole seconds
        self.rate = tokens_per_fill / max(1, int(fill_seconds))
        self.tokens = float(max_tokens)
        self.at = now

    def consume(self, now):
        self.tokens = min(self.max, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


class Proxy:
    def __init__(self, name, target, domain, bucket, interval, fallback_allow):
        self.name = name
        self.domain = domain
        self.bucket = bucket
        self.interval = interval
        self.fallback_allow = fallback_allow
        self.lock = threading.Lock()
        self.outbox = queue.Queue()
        self.channel = grpc.insecure_channel(target)
        self.stub = rlqs_pb2_grpc.RateLimitQuotaServiceStub(self.channel)
        self.strategy = None  # (kind, params, expires_at)
        self.limiter = None
        self.allowed = self.denied = 0
        self.last_report = None
        self.opened = False
        self.assignments = []
        self.stopped = False
        self.reported_allowed = 0
        self.receiving = None
        self.ended = False

    def requests(self):
        while True:
            r = self.outbox.get()
            if r is None:
                return
            yield r

    def open(self):
        self.opened = True
        self.responses = self.stub.StreamRateLimitQuotas(self.requests())
        self.receiving = threading.Thread(target=self.receive, daemon=True)
        self.receiving.start()

    def receive(self):
        """Takes each answer until the node ends the stream (or it breaks); what is
        reported after that reaches no node and is not counted as reported."""
        ended = "OK"
        try:
            for resp in self.responses:
                for a in resp.bucket_action:
                    self.take(a)
        except grpc.RpcError as e:
            ended = e.code().name
        with self.lock:
            self.ended = True
            self.assignments.append({"at": time.time(), "stream_ended": ended})

    def take(self, a):
        now = time.monotonic()
        with self.lock:
            if a.HasField("abandon_action"):
                self.strategy, self.limiter = None, None
                self.assignments.append({"at": time.time(), "abandon": True})
                return
            q = a.quota_assignment_action
            ttl = q.assignment_time_to_live.seconds + q.assignment_time_to_live.nanos / 1e9
            s = q.rate_limit_strategy
            if s.HasField("token_bucket"):
                tb = s.token_bucket
                fill = tb.fill_interval.seconds + tb.fill_interval.nanos / 1e9
                params = (tb.max_tokens, tb.tokens_per_fill.value, fill)
                if self.strategy is None or self.strategy[1] != params:
                    self.limiter = TokenBucket(*params, now)
                self.strategy = ("bucket", params, now + ttl)
                self.assignments.append({"at": time.time(), "tokens_per_fill": params[1], "ttl": ttl})
            else:
                allow = s.blanket_rule == ALLOW_ALL
                self.strategy = ("allow" if allow else "deny", None, now + ttl)
                self.limiter = None
                self.assignments.append({"at": time.time(), "blanket": "allow" if allow else "deny", "ttl": ttl})

    def usage(self, now):
        elapsed = 0 if self.last_report is None else int(now - self.last_report)
        self.last_report = now
        u = rlqs_pb2.RateLimitQuotaUsageReports.BucketQuotaUsage(
            num_requests_allowed=self.allowed, num_requests_denied=self.denied
        )
        u.bucket_id.bucket.update(self.bucket)
        u.time_elapsed.seconds = elapsed
        if not self.ended:
            self.reported_allowed += self.allowed
        self.allowed = self.denied = 0
        return rlqs_pb2.RateLimitQuotaUsageReports(domain=self.domain, bucket_quota_usages=[u])

    def decide(self, now):
        with self.lock:
            first = not self.opened
            if first:
                self.open()
            if self.strategy is None:
                ok = self.fallback_allow
            elif self.strategy[2] <= now:
                ok = self.fallback_allow  # expired_assignment_behavior
            elif self.strategy[0] == "bucket":
                ok = self.limiter.consume(now)
            else:
                ok = self.strategy[0] == "allow"
            if ok:
                self.allowed += 1
            else:
                self.denied += 1
            if first:
                self.outbox.put(self.usage(now))
            return ok

    def report(self, now):
        with self.lock:
            if self.opened and not self.stopped and not self.ended and now - self.last_report >= self.interval:
                self.outbox.put(self.usage(now))

    def stop(self):
        """Reports what is left, ends the stream, and waits for the node to end its
        side (so that the last report is taken) before closing the channel."""
        with self.lock:
            self.stopped = True
            if self.opened and not self.ended:
                self.outbox.put(self.usage(time.monotonic()))
        self.outbox.put(None)
        if self.receiving is not None:
            self.receiving.join(timeout=5)
        self.channel.close()


def main(spec):
    """spec: {"domain", "bucket": {..}, "interval", "seconds", "fallback_allow",
    "proxies": [{"target", "demand", "start", "stop"}]}: each proxy offers `demand`
    requests per second to `target` from `start` to `stop` seconds into the run."""
    t0 = time.monotonic()
    proxies = [
        Proxy(i, p["target"], spec["domain"], spec["bucket"], spec["interval"], spec.get("fallback_allow", False))
        for i, p in enumerate(spec["proxies"])
    ]
    seconds = spec["seconds"]
    allowed = [[0] * seconds for _ in proxies]
    offered = [[0] * seconds for _ in proxies]
    nxt = [t0 + p.get("start", 0) for p in spec["proxies"]]
    while True:
        now = time.monotonic()
        if now - t0 >= seconds:
            break
        for i, (p, s) in enumerate(zip(proxies, spec["proxies"])):
            if p.stopped or now - t0 < s.get("start", 0):
                continue
            if now - t0 >= s.get("stop", seconds):
                p.stop()
                continue
            p.report(now)
            while nxt[i] <= now:
                nxt[i] += 1.0 / s["demand"]
                sec = int(now - t0)
                offered[i][sec] += 1
                if p.decide(now):
                    allowed[i][sec] += 1
        time.sleep(0.002)
    for p in proxies:
        if not p.stopped:
            p.stop()
    json.dump({"allowed": allowed, "offered": offered,
               "reported_allowed": [p.reported_allowed for p in proxies],
               "assignments": [p.assignments for p in proxies]}, sys.stdout)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
