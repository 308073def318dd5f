#!/usr/bin/env python3
"""An LLM gateway's token budget on swin: reserve, extend while streaming, commit.

For each request the gateway reserves the prompt's tokens plus `max_tokens` (the
estimate most gateways reserve) over two keys at once, `tenant:<t>` and `user:<u>`,
calls a stand-in model that streams tokens, extends the reservation by a chunk
whenever the stream passes what is reserved (and stops the stream when an extend is
denied), then commits the tokens actually used. Under `overrun = "debt"` (the default)
tokens charged are tokens used.

Every call carries an `Idempotency-Key` (one per logical call, the same on each retry)
and is retried after a connection error or a timeout. `--drop F` loses a fraction F of
the answers on purpose: the call is sent, its answer thrown away, and the call sent
again with the same key (to the next `--url`, when several are given): the node answers
the first answer again and counts nothing more.

`--usage 0.5,3` makes each call use 0.5 to 3 times its estimate instead (prompt and
completion tokens together; never less than the prompt, which the model reads
whatever): the answer is the model's, so the stream is never cut short. Past the
reservation the gateway extends while the keys allow it; once an extend is denied it
stops asking, and the commit charges the rest as debt (`overrun = "debt"`).
`--call-keys` adds a third key to each request's reservation, `call:<n>` (the request's
number), which no other request uses: its count in the store is what that one
reservation charged. `--log FILE` writes one JSON line per request: its keys, what it reserved in all, what
it used, what each key got back at the commit, and when (Unix seconds) its reserve was
sent and its commit answered (a denied request: `"denied": true`, and when its reserve
was sent and answered).

Standard library only. Run against a node with a namespace such as

    [[namespaces]]
    name = "llm"
    window_sizes = [60]
    limits = [{ window_size = 60, limit = 100000 }]

    python3 docs/examples/llm_gateway.py --url http://127.0.0.1:7070 --namespace llm \
        --requests 20 --drop 0.2 --seed 1

It prints one JSON object: requests served and denied, retries, and the tokens the
stand-in model used by its own count, in all and per key.
"""

import argparse
import concurrent.futures
import json
import random
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid

CHUNK = 64  # tokens added by each extend
TTL = 120  # seconds a reservation stays open


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.served = 0
        self.denied = 0
        self.cut_short = 0
        self.extends = 0
        self.extends_denied = 0
        self.debts = 0  # commits above their reservation's total
        self.retries = 0
        self.dropped = 0
        self.tokens_used = 0
        self.by_key = {}

    def add(self, **counts):
        with self.lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)

    def used(self, keys, tokens):
        with self.lock:
            self.tokens_used += tokens
            for k in keys:
                self.by_key[k] = self.by_key.get(k, 0) + tokens


class Client:
    """POSTs to the namespace's routes, retried with one `Idempotency-Key` per call."""

    def __init__(self, urls, namespace, drop, stats, timeout=10.0):
        self.urls = urls
        self.namespace = namespace
        self.drop = drop
        self.stats = stats
        self.timeout = timeout

    def call(self, op, body, rng):
        """(status, answer) of `op` with `body`, once, whatever was lost on the way."""
        key = str(uuid.uuid4())
        # the same bytes on every attempt: a retry must send what it sent
        data = json.dumps(body, sort_keys=True).encode()
        attempt = 0
        while True:
            url = "%s/v1/namespaces/%s/%s" % (
                self.urls[attempt % len(self.urls)],
                self.namespace,
                op,
            )
            attempt += 1
            request = urllib.request.Request(
                url,
                data=data,
                method="POST",
                headers={"content-type": "application/json", "idempotency-key": key},
            )
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as r:
                    status, raw = r.status, r.read()
            except urllib.error.HTTPError as e:
                status, raw = e.code, e.read()
            except (urllib.error.URLError, ConnectionError, socket.timeout, TimeoutError):
                # no answer: it may or may not have run; the same key makes it once
                self.stats.add(retries=1)
                time.sleep(0.05 * min(attempt, 20))
                continue
            if status in (409, 503):
                # 409: the first attempt is still running; 503: nothing was kept
                self.stats.add(retries=1)
                time.sleep(0.05 * min(attempt, 20))
                continue
            if rng.random() < self.drop:
                # sent and answered, but the answer is lost on the way back
                self.stats.add(retries=1, dropped=1)
                continue
            return status, json.loads(raw)


class StandInModel:
    """Streams tokens; keeps its own count of the tokens it read and produced."""

    def __init__(self, rng, usage=None):
        self.rng = rng
        self.usage = usage  # (lo, hi): each call uses lo to hi times its estimate
        self.used = 0

    def stream(self, prompt_tokens, max_tokens):
        self.used += prompt_tokens
        if self.usage is None:
            # most answers stop short of max_tokens; some run past it
            n = self.rng.randint(max_tokens // 4, max_tokens * 3 // 2)
        else:
            lo, hi = self.usage
            total = round(self.rng.uniform(lo, hi) * (prompt_tokens + max_tokens))
            n = max(0, total - prompt_tokens)
        for i in range(n):
            self.used += 1
            yield "tok%d" % i


def serve(client, prompt_tokens, max_tokens, tenant, user, rng, usage=None, log=None, call=None):
    """One request through the gateway: True when served, False when denied."""
    keys = ["tenant:%s" % tenant, "user:%s" % user]
    if call is not None:
        keys.append("call:%d" % call)
    reserved = prompt_tokens + max_tokens
    sent = time.time()
    status, answer = client.call(
        "reserve", {"keys": keys, "cost": reserved, "ttl": TTL}, rng
    )
    if status == 429:
        client.stats.add(denied=1)
        if log is not None:
            log(
                {
                    "keys": keys,
                    "estimate": reserved,
                    "denied": True,
                    "reserve_sent": sent,
                    "reserve_answered": time.time(),
                }
            )
        return False
    if status != 200:
        raise RuntimeError("reserve answered %d: %s" % (status, answer))
    reservation = answer["reservation"]

    model = StandInModel(rng, usage)
    stream = model.stream(prompt_tokens, max_tokens)
    used = prompt_tokens
    cut_short = False
    extending = True
    for _token in stream:
        used += 1  # the token is sent on to the user
        if used > reserved and extending:
            status, answer = client.call(
                "extend", {"reservation": reservation, "cost": CHUNK}, rng
            )
            if status == 429:
                client.stats.add(extends_denied=1)
                if usage is not None:
                    # the model's answer runs to its end: the rest is charged as debt
                    extending = False
                    continue
                # no more room: stop the model; what it made is still charged
                stream.close()
                cut_short = True
                break
            if status != 200:
                raise RuntimeError("extend answered %d: %s" % (status, answer))
            reserved += CHUNK
            client.stats.add(extends=1)

    status, answer = client.call("commit", {"reservation": reservation, "cost": used}, rng)
    if status != 200:
        raise RuntimeError("commit answered %d: %s" % (status, answer))
    assert used == model.used, (used, model.used)
    client.stats.used(keys, model.used)
    client.stats.add(served=1, cut_short=int(cut_short), debts=int(used > reserved))
    if log is not None:
        log(
            {
                "keys": keys,
                "estimate": prompt_tokens + max_tokens,
                "reserved": reserved,  # the estimate and every extend
                "used": used,
                # what each key got back of the reservation's total (the store's word)
                "given_back": {k["key"]: k["given_back"] for k in answer["keys"]},
                "reserve_sent": sent,
                "commit_answered": time.time(),
            }
        )
    return True


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--url",
        action="append",
        required=True,
        help="a node's base URL; several: retries go to the next",
    )
    p.add_argument("--namespace", default="llm")
    p.add_argument("--requests", type=int, default=20)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--drop", type=float, default=0.0, help="fraction of answers lost")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--tenants", type=int, default=2)
    p.add_argument("--users", type=int, default=5)
    p.add_argument(
        "--usage",
        metavar="LO,HI",
        help="each call uses LO to HI times its estimate, never cut short",
    )
    p.add_argument("--log", metavar="FILE", help="one JSON line per request")
    p.add_argument(
        "--call-keys",
        action="store_true",
        help="a key of each request's own (call:<n>) in its reservation",
    )
    args = p.parse_args(argv)
    usage = tuple(float(x) for x in args.usage.split(",")) if args.usage else None

    stats = Stats()
    client = Client([u.rstrip("/") for u in args.url], args.namespace, args.drop, stats)
    log = None
    if args.log:
        log_file, log_lock = open(args.log, "w"), threading.Lock()

        def log(record):
            with log_lock:
                log_file.write(json.dumps(record) + "\n")

    def one(i):
        # each request its own seeded RNG: the same run whatever the threads' order
        rng = random.Random(args.seed * 1_000_003 + i)
        prompt_tokens = rng.randint(20, 400)
        max_tokens = rng.choice([64, 128, 256, 512])
        tenant = "t%d" % rng.randrange(args.tenants)
        user = "u%d" % rng.randrange(args.users)
        call = i if args.call_keys else None
        return serve(client, prompt_tokens, max_tokens, tenant, user, rng, usage, log, call)

    with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
        list(pool.map(one, range(args.requests)))
    if args.log:
        log_file.close()

    json.dump(
        {
            "requests": args.requests,
            "served": stats.served,
            "denied": stats.denied,
            "extends": stats.extends,
            "extends_denied": stats.extends_denied,
            "cut_short": stats.cut_short,
            "debts": stats.debts,
            "retries": stats.retries,
            "dropped_answers": stats.dropped,
            "tokens_used": stats.tokens_used,
            "tokens_used_by_key": dict(sorted(stats.by_key.items())),
        },
        sys.stdout,
    )
    print()


if __name__ == "__main__":
    main()
