"""The charts of BENCHMARKS.md, drawn from docs/benchmarks/*.json as SVG (matplotlib)."""

import os

import matplotlib

matplotlib.use("svg")
import matplotlib.pyplot as plt  # noqa: E402

from common import ROOT, median  # noqa: E402

OUT = os.path.join(ROOT, "docs", "benchmarks")
plt.rcParams.update({"svg.hashsalt": "swin", "font.size": 9, "axes.spines.top": False,
                     "axes.spines.right": False})
SWIN, PEER, FLOOR = "#1f6fb2", "#d9822b", "#8a8a8a"
MODE_COLOURS = ["#1f6fb2", "#7fb3e0", "#2a9d8f", "#264653"]


def colour(name):
    return PEER if name.startswith("lim") else FLOOR if name == "axum" else SWIN


def save(fig, name):
    path = os.path.join(OUT, name)
    fig.savefig(path, bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    return path


def throughput(data):
    from latency import ordered
    names = ordered(data["peaks"])
    peaks = [median(data["peaks"][n]) for n in names]
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(names) + 1))
    y = range(len(names))[::-1]
    ax.barh(list(y), peaks, color=[colour(n) for n in names])
    ax.set_yticks(list(y), [data["labels"][n] for n in names])
    for yi, p in zip(y, peaks):
        ax.text(p, yi, f" {p:,.0f}", va="center", fontsize=8)
    ax.set_xlabel("decisions per second (closed loop, 32 connections; medians)")
    ax.set_title("How fast: swin (blue) beside Limitador (orange) and bare axum (grey)")
    return save(fig, "throughput.svg")


def latency(data):
    from latency import PAIRS, summary
    s = summary(data["points"])
    pairs = [(m, o) for m, o in PAIRS if m in s]
    fig, axes = plt.subplots(1, len(pairs), figsize=(2.6 * len(pairs), 3.8), sharey=True)
    for ax, (mode, others) in zip(axes if len(pairs) > 1 else [axes], pairs):
        for n in [mode, *others]:
            if n not in s:
                continue
            fs = sorted(s[n], key=float)
            style = "-" if n == mode else "--"
            ax.plot([float(f) * 100 for f in fs], [s[n][f]["p99"] for f in fs], style, marker="o",
                    color=colour(n), label=data["labels"][n].replace(", ", "\n", 1))
        ax.set_yscale("log")
        ax.set_title(data["labels"][mode].replace("swin ", "").replace(", ", "\n", 1), fontsize=8)
        ax.set_xticks([25, 50, 75])
        ax.set_xlabel("% of swin's peak")
        ax.legend(fontsize=6, frameon=False)
    (axes[0] if len(pairs) > 1 else axes).set_ylabel("p99 latency, ms (log)")
    fig.suptitle("How fast under load: p99 at a fixed offered rate (open loop), swin (blue) beside Limitador "
                 "(orange) and bare axum (grey)", y=1.04)
    return save(fig, "latency.svg")


def faults(data):
    rows = data["results"]
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    fault_names = list(dict.fromkeys(r["fault"] for r in rows))
    L = data["limit"]
    fig, ax = plt.subplots(figsize=(10, 3.8))
    width = 0.8 / len(modes)
    for i, mode in enumerate(modes):
        ys = []
        for f in fault_names:
            r = next((r for r in rows if r["mode"] == mode and r["fault"] == f), None)
            ys.append(max(r["per_window"], default=0) / L if r else 0)
        xs = [j + (i - (len(modes) - 1) / 2) * width for j in range(len(fault_names))]
        ax.bar(xs, ys, width, label=mode, color=MODE_COLOURS[i % len(MODE_COLOURS)] if not mode.startswith("Limitador")
               else ("#d9822b" if "cached" in mode else "#f2b880"), hatch="//" if mode.startswith("Limitador") else None,
               edgecolor="white", linewidth=0.3)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.text(len(fault_names) - 0.5, 1.0, " the limit", va="bottom", ha="right", fontsize=8)
    ax.set_xticks(range(len(fault_names)), [f.replace(" ", "\n", 2) for f in fault_names], fontsize=8)
    ax.set_ylabel("most admitted in one window ÷ limit")
    ax.set_title(f"How exact under each fault: 3 nodes, limit {L} per {data['window_s']} s, 3× offered")
    ax.legend(fontsize=7, frameon=False, ncol=6, loc="upper center", bbox_to_anchor=(0.5, -0.2))
    return save(fig, "faults.svg")
