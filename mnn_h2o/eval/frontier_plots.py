"""Pictures of the frontier: a metric against the measured whole-model ratio, one line per
method, ours solid and kvpress dashed, log-x."""
from __future__ import annotations

from typing import List, Sequence


def _style(engine: str):
    return {"linestyle": "-" if engine == "ours" else "--", "marker": "o" if engine == "ours" else "s",
            "markersize": 4, "linewidth": 1.4}


def _ratio_axis(ax) -> None:
    """Log-x with plain tick labels at the ratios people ask for."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    ax.set_xscale("log")
    lo, hi = ax.get_xlim()
    ax.set_xlim(min(lo, 0.9), max(hi, 10))
    ax.xaxis.set_major_locator(FixedLocator([1, 1.5, 2, 3, 5, 8, 12, 20, 32]))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())


def _series(rows, method):
    rs = sorted((r for r in rows if r["method"] == method and r["ratio"]), key=lambda r: r["ratio"])
    return rs


def plot_metric(rows: Sequence[dict], metric: str, path: str, ylabel: str, logy: bool) -> None:
    """A grid of panels (prompt length x domain) for a teacher-forced metric."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kl = [r for r in rows if r["kind"] == "kl"]
    lens = sorted({r["prompt_tokens"] for r in kl})
    doms = sorted({r["domain"] for r in kl})
    fig, axes = plt.subplots(len(lens), len(doms), figsize=(4.6 * len(doms), 3.6 * len(lens)),
                             squeeze=False, sharex=True)
    methods = sorted({r["method"] for r in kl})
    handles = {}
    for i, n in enumerate(lens):
        for j, d in enumerate(doms):
            ax = axes[i][j]
            panel = [r for r in kl if r["prompt_tokens"] == n and r["domain"] == d]
            for m in methods:
                rs = _series(panel, m)
                # The full cache is KL 0 / top-1 1: the reference, not a point on a log axis.
                rs = [r for r in rs if not (r["policy"] == "none" and r["kv_dtype"] == "f16")]
                ys = [r[metric] for r in rs]
                if logy:
                    rs, ys = [r for r, y in zip(rs, ys) if y and y > 0], [y for y in ys if y and y > 0]
                if not rs:
                    continue
                (h,) = ax.plot([r["ratio"] for r in rs], ys, label=m, **_style(rs[0]["engine"]))
                handles.setdefault(m, h)
            _ratio_axis(ax)
            if logy:
                ax.set_yscale("log")
            ax.set_title(f"{d}, {n}-token prompt", fontsize=10)
            ax.set_xlabel("whole-model KV ratio (f16 bytes / bytes held)")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3, which="both")
    _legend(fig, handles)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def plot_needles(rows: Sequence[dict], path: str) -> None:
    """Hits / trials against ratio, one panel per placement; the full caches as lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nd = [r for r in rows if r["kind"] == "needle"]
    placements = [p for p in ("inside", "after") if any(r["placement"] == p for r in nd)]
    if not placements:
        return
    fig, axes = plt.subplots(1, len(placements), figsize=(5.5 * len(placements), 4), squeeze=False)
    handles = {}
    for j, p in enumerate(placements):
        ax = axes[0][j]
        for r in nd:
            if r["policy"] == "none" and r["kv_dtype"] == "f16":
                h = ax.axhline(r["needle_hits"] / r["needle_trials"], color="grey",
                               linestyle="-" if r["engine"] == "ours" else "--", linewidth=0.8)
                handles.setdefault(f"{r['engine']} full cache", h)
        panel = [r for r in nd if r["placement"] == p and r["target_ratio"] is not None]
        for m in sorted({r["method"] for r in panel}):
            rs = sorted((r for r in panel if r["method"] == m), key=lambda r: r["target_ratio"])
            # Needle runs of the peer carry no bytes: the x position is the target ratio there.
            xs = [r["ratio"] or r["target_ratio"] for r in rs]
            (h,) = ax.plot(xs, [r["needle_hits"] / r["needle_trials"] for r in rs], label=m,
                           **_style(rs[0]["engine"]))
            handles.setdefault(m, h)
        _ratio_axis(ax)
        ax.set_ylim(-0.03, 1.03)
        ax.set_title(f"needles, question {p} the compressed prompt", fontsize=10)
        ax.set_xlabel("whole-model KV ratio")
        ax.set_ylabel("hits / trials")
        ax.grid(alpha=0.3, which="both")
    _legend(fig, handles)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def _legend(fig, handles) -> None:
    """One legend under the panels, with room kept for it."""
    rows = -(-len(handles) // 5) if handles else 0
    bottom = min(0.3, 0.35 * rows / fig.get_size_inches()[1])
    fig.tight_layout(rect=(0, bottom, 1, 1))
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=min(5, len(handles)),
                   bbox_to_anchor=(0.5, 0.0), fontsize=9, frameon=False)


def plot_all(rows: Sequence[dict], prefix: str) -> List[str]:
    paths = []
    if any(r["kind"] == "kl" for r in rows):
        plot_metric(rows, "kl", prefix + "_kl.png", "mean KL(full || compressed), nats", True)
        plot_metric(rows, "top1", prefix + "_top1.png", "top-1 agreement with the full cache", False)
        paths += [prefix + "_kl.png", prefix + "_top1.png"]
    if any(r["kind"] == "needle" for r in rows):
        plot_needles(rows, prefix + "_needle.png")
        paths.append(prefix + "_needle.png")
    return paths
