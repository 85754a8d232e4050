"""Print bench results as a table, and plot the ratios."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kproxy.bench.runner import ADDED_P99_TARGET_MS, REFERENCE, THROUGHPUT_TARGETS

LABELS = {
    "batched_produce": "produce 1 KiB, acks=all, batched",
    "consume": "consume",
    "unbatched_produce": "produce 100 B, linger.ms=0",
}


def format_table(result: dict[str, Any]) -> str:
    paths = result["paths"]
    names = list(paths)
    lines = []
    head = f"{'workload':36}" + "".join(f"{n:>22}" for n in names)
    lines.append(head)
    lines.append("-" * len(head))
    for workload, label in LABELS.items():
        row = f"{label:36}"
        for n in names:
            w = paths[n][workload]
            row += f"{w['records_per_s']:>10.0f}/s {w['mib_per_s']:>6.1f}MiB/s"
        lines.append(row)
        row = f"{'  ratio to direct (target >= %.2f)' % THROUGHPUT_TARGETS[workload]:36}"
        row += "".join(f"{paths[n][workload]['ratio']:>22.3f}" for n in names)
        lines.append(row)
    for q in ("p50", "p90", "p99"):
        row = f"{'latency ' + q + ' at fixed rate (ms)':36}"
        row += "".join(f"{paths[n]['latency_ms'].get(q, float('nan')):>22.3f}" for n in names)
        lines.append(row)
    lines.append("")
    lines.append("rates: median over rounds; ratios: median over rounds of each round's pair")
    lines.append(f"added p99 latency through the proxy: {result['added_p99_ms']:.3f} ms (target <= {ADDED_P99_TARGET_MS} ms)")
    if "proxy_vs_reference" in result:
        versus = ", ".join(f"{LABELS[w].split(',')[0]} {r:.3f}" for w, r in result["proxy_vs_reference"].items())
        lines.append(f"added p99 latency through {REFERENCE}: {result['reference_added_p99_ms']:.3f} ms")
        lines.append(f"kproxy throughput / {REFERENCE} throughput: {versus}")
    for n in names:
        if "cost_vs_proxy" in paths[n]:
            cost = ", ".join(f"{LABELS[w].split(',')[0]} {c * 100:.1f}%" for w, c in paths[n]["cost_vs_proxy"].items())
            lines.append(f"tracing cost ({n.split(':')[1]}): {cost}")
            if paths[n].get("cpu_cost_vs_proxy"):
                cpu = ", ".join(f"{LABELS[w].split(',')[0]} {c * 100:+.1f}%" for w, c in paths[n]["cpu_cost_vs_proxy"].items())
                lines.append(f"  proxy CPU per record vs the plain proxy ({n.split(':')[1]}): {cpu}")
    if "memory" in result:
        m = result["memory"]
        lines.append(
            f"proxy RSS with {m['idle_connections']} idle + {m['busy_connections']} busy connections: "
            f"{m['rss_before_mib']:.1f} MiB before, {m['rss_half_mib']:.1f} MiB mid-run, "
            f"{m['rss_peak_mib']:.1f} MiB peak, {m['rss_after_mib']:.1f} MiB after"
        )
    lines.append("")
    lines.append("checks: " + ", ".join(f"{k} {'PASS' if v else 'FAIL'}" for k, v in result["checks"].items()))
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in result["paths"] if n != "direct"]
    workloads = list(LABELS)
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / max(1, len(names))
    for i, n in enumerate(names):
        ratios = [result["paths"][n][w]["ratio"] for w in workloads]
        ax.bar([x + i * width for x in range(len(workloads))], ratios, width, label=n)
    for x, w in enumerate(workloads):
        ax.hlines(THROUGHPUT_TARGETS[w], x - width / 2, x + width * len(names) - width / 2, colors="red", linestyles="dashed")
    ax.set_xticks([x + width * (len(names) - 1) / 2 for x in range(len(workloads))])
    ax.set_xticklabels([LABELS[w] for w in workloads], fontsize=8)
    ax.set_ylabel("throughput / direct")
    ax.set_ylim(0, 1.2)
    ax.set_title("kproxy throughput relative to a direct connection (red: target)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
