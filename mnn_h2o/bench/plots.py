"""PNG plots of a bench round (matplotlib, headless)."""
from __future__ import annotations

import importlib.util
import os
from typing import List, Sequence

MIB = 1 << 20
_COLOURS = {"baseline": "tab:gray", "evict": "tab:purple", "probe": "tab:blue", "full": "tab:green",
            "store": "tab:red"}
_LABELS = {"baseline": "baseline (full cache)", "evict": "eviction alone", "probe": "eviction (+ probe)",
           "full": "eviction (+ full check)", "store": "eviction + lossless store"}


def check_available() -> None:
    """matplotlib is in the optional ``bench`` extra, not a runtime dependency: say so before a
    round spends minutes measuring, not when it writes its run folder."""
    if importlib.util.find_spec("matplotlib") is None:
        raise ValueError("the bench writes its plots with matplotlib, which is not installed: "
                         "pip install 'mnn_h2o[bench]' (from a checkout: pip install '.[bench]')")


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def bytes_vs_context(rows: Sequence[dict], path: str) -> bool:
    """KV bytes held as the context grows (the longest prompt's run, prefill then decode)."""
    traced = [r for r in rows if r.get("trace") and r["case"] in ("baseline", "evict", "store")]
    if not traced:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for r in traced:
        ctx = [p[0] for p in r["trace"]]
        ax.plot(ctx, [p[1] / MIB for p in r["trace"]], color=_COLOURS[r["case"]], label=_LABELS[r["case"]])
    r0 = traced[0]
    ax.plot([p[0] for p in r0["trace"]], [p[3] / MIB for p in r0["trace"]], "k:", lw=1, label="uncompressed")
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel("KV bytes held (MiB)")
    ax.set_title(f"KV memory during decode after a {r0['prompt_tokens']}-token prompt")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def tokens_per_second(rows: Sequence[dict], path: str) -> bool:
    cases = list(dict.fromkeys(r["case"] for r in rows))
    lengths = sorted({r["prompt_tokens"] for r in rows})
    if not rows:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    w = 0.8 / len(cases)
    for i, c in enumerate(cases):
        rs = [next(r for r in rows if r["case"] == c and r["prompt_tokens"] == n) for n in lengths]
        med = [r["decode_tps"]["median"] for r in rs]
        lo = [r["decode_tps"]["median"] - r["decode_tps"]["min"] for r in rs]
        hi = [r["decode_tps"]["max"] - r["decode_tps"]["median"] for r in rs]
        ax.bar([j + i * w for j in range(len(lengths))], med, w, yerr=[lo, hi], capsize=3,
               color=_COLOURS.get(c), label=_LABELS.get(c, c))
    ax.set_xticks([j + 0.4 - w / 2 for j in range(len(lengths))], [str(n) for n in lengths])
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("decode tokens/s (median, min-max)")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def quality_figure(rows: Sequence[dict]):
    """KL and top-1 agreement against the whole-model ratio: one line per case through its
    prompt lengths (in ratio order), a marker per point and a legend; no point labels, which
    overlapped where the cases sit on top of each other (the lossless modes share eviction's quality)."""
    cand = [r for r in rows if r["case"] != "baseline"]
    if not cand:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8))
    markers = "osD^v<>"
    for i, c in enumerate(dict.fromkeys(r["case"] for r in cand)):
        rs = sorted((r for r in cand if r["case"] == c), key=lambda r: r["total_ratio"])
        x = [r["total_ratio"] for r in rs]
        style = dict(color=_COLOURS.get(c), marker=markers[i % len(markers)], markersize=5, alpha=0.85,
                     label=_LABELS.get(c, c))
        axes[0].plot(x, [r["kl"] for r in rs], "-", **style)
        axes[1].plot(x, [r["top1_agreement"] for r in rs], "-", **style)
    axes[0].set_ylabel("KL vs full cache (nats/token)")
    axes[1].set_ylabel("top-1 agreement vs full cache")
    for ax in axes:
        ax.set_xlabel("whole-model ratio (uncompressed / bytes held)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def quality_vs_ratio(rows: Sequence[dict], path: str) -> bool:
    fig = quality_figure(rows)
    if fig is None:
        return False
    fig.savefig(path, dpi=110)
    _plt().close(fig)
    return True


def write_all(rows: Sequence[dict], folder: str) -> List[str]:
    out = []
    for name, fn in (("bytes_held.png", bytes_vs_context), ("decode_tps.png", tokens_per_second),
                     ("quality_vs_ratio.png", quality_vs_ratio)):
        if fn(rows, os.path.join(folder, name)):
            out.append(name)
    return out
