"""scripts/bench report: runs the figures (throughput and latency beside Limitador,
accuracy under faults), saves them to docs/benchmarks/*.json, draws the charts and
rewrites the figures block at the top of BENCHMARKS.md.

    report.py [latency] [faults] [charts]    (default: all three; charts alone redraws
                                              from the saved JSON)
Environment: SWIN_FIGURES_TARGETS (latency targets), SWIN_FIGURES_MODES and
SWIN_FIGURES_FAULTS (comma separated), SWIN_BENCH_ROUNDS, DURATION."""

import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402


def pick(env, default):
    v = os.environ.get(env)
    return [x.strip() for x in v.split(",")] if v else list(default)


def load_saved(name):
    path = os.path.join(common.ROOT, "docs", "benchmarks", f"{name}.json")
    return json.load(open(path)) if os.path.exists(path) else None


def main():
    what = sys.argv[1:] or ["latency", "faults", "charts"]
    started = time.monotonic()
    if "latency" in what:
        import latency
        data = latency.measure(pick("SWIN_FIGURES_TARGETS", latency.TARGETS))
        data["machine"] = common.machine()
        common.save("latency", data)
    if "faults" in what:
        import faults
        modes = pick("SWIN_FIGURES_MODES", [*faults.MODES, *faults.LIMITADOR])
        data = faults.measure(modes, pick("SWIN_FIGURES_FAULTS", faults.FAULTS))
        data["machine"] = common.machine()
        saved = load_saved("faults")
        if saved and ("SWIN_FIGURES_MODES" in os.environ or "SWIN_FIGURES_FAULTS" in os.environ):
            # a part run again replaces its scenarios in the saved set, the rest kept
            new = {(r["mode"], r["fault"]) for r in data["results"]}
            kept = [r for r in saved["results"] if (r["mode"], r["fault"]) not in new]
            data["results"] = kept + data["results"]
            order = [*faults.MODES, *faults.LIMITADOR]
            data["results"].sort(key=lambda r: (order.index(r["mode"]) if r["mode"] in order else 99,
                                                faults.FAULTS.index(r["fault"]) if r["fault"] in faults.FAULTS else 99))
        common.save("faults", data)
    if "charts" in what:
        import charts
        import faults
        import latency
        lat, flt = load_saved("latency"), load_saved("faults")
        blocks = []
        if lat:
            charts.throughput(lat)
            charts.latency(lat)
            blocks.append(f"Measured {lat['machine']['at']} on {lat['machine']['cores']} cores "
                          f"({lat['machine']['cpu']}).\n\n![throughput](docs/benchmarks/throughput.svg)\n\n"
                          + latency.tables(lat) + "\n![latency](docs/benchmarks/latency.svg)\n")
        if flt:
            charts.faults(flt)
            blocks.append(f"Measured {flt['machine']['at']}.\n\n![faults](docs/benchmarks/faults.svg)\n\n"
                          + faults.tables(flt))
        path = os.path.join(common.ROOT, "BENCHMARKS.md")
        doc = open(path).read()
        begin, end = "<!-- scripts/bench report:begin -->", "<!-- scripts/bench report:end -->"
        block = f"{begin}\n" + "\n".join(blocks) + f"{end}"
        if begin in doc:
            doc = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: block, doc, flags=re.S)
        else:
            doc = block + "\n\n" + doc
        open(path, "w").write(doc)
        common.say(f"rewrote the figures block of {path}")
    common.say(f"scripts/bench report {' '.join(what)}: {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
