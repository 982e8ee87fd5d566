"""The README's picture: KV cache memory against quality, ours and llama.cpp, drawn from figures
already recorded in docs/results.md.

    python -m mnn_h2o.tools.readme_plot [--json docs/data/readme_plot.json] [--out docs/img/readme.png]

Nothing is measured here. Each number in the JSON file is a figure of docs/results.md, given with
the section it is in and the exact text (`quote`) it is read from; `--check` (and
tests/test_docs.py) verifies that every quote is in its section and every value in its quote, so
the picture cannot drift from the reference.

A point's memory is either `kv_mib` (MiB held, as recorded) or `kv_mb` (the f16 full cache's MB
held, recorded in the same suite) divided by the point's measured whole-model `ratio` (the
ratio is defined as f16 bytes written / bytes held). Its quality is the mean of its `kl` figures
(KL against the engine's own f16 full cache, one per domain), or 0 for a `"reference"` (the full
cache the others are measured against).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_JSON = os.path.join(ROOT, "docs", "data", "readme_plot.json")
DEFAULT_OUT = os.path.join(ROOT, "docs", "img", "readme.png")
RESULTS_MD = os.path.join(ROOT, "docs", "results.md")
MIB = 1 << 20


def figures(data: dict) -> List[dict]:
    """Every figure object (``value``, ``section``, ``quote``) in the plot's data."""
    found = []

    def walk(node):
        if isinstance(node, dict):
            if "value" in node:
                found.append(node)
            else:
                for v in node.values():
                    walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(data)
    return found


def section_text(markdown: str, title: str) -> str:
    """The text of the section whose heading is ``title`` (any level), up to the next heading of
    the same or a higher level; ValueError if there is no such heading."""
    lines = markdown.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^(#+) (.*)$", line)
        if m and m.group(2).strip() == title:
            level = len(m.group(1))
            end = next((j for j in range(i + 1, len(lines))
                        if re.match(rf"^#{{1,{level}}} ", lines[j])), len(lines))
            return "\n".join(lines[i + 1:end])
    raise ValueError(f"docs/results.md has no section titled {title!r}")


def check_figures(data: dict, markdown: str) -> List[str]:
    """Why each figure of ``data`` is not backed by ``markdown`` (empty when all are)."""
    problems = []
    for f in figures(data):
        missing = [k for k in ("value", "section", "quote") if not isinstance(f.get(k), str)]
        if missing:
            problems.append(f"figure {f!r} lacks {', '.join(missing)} (strings)")
            continue
        try:
            text = section_text(markdown, f["section"])
        except ValueError as e:
            problems.append(str(e))
            continue
        if f["quote"] not in text:
            problems.append(f"section {f['section']!r} does not contain {f['quote']!r}")
        elif not re.search(rf"(?<![\d.]){re.escape(f['value'])}(?![\d])", f["quote"]):
            problems.append(f"quote {f['quote']!r} does not contain the value {f['value']}")
    return problems


def point_xy(point: dict) -> Dict[str, float]:
    """KV MiB held and mean KL of one point (see the module docstring)."""
    if "kv_mib" in point:
        mib = float(point["kv_mib"]["value"])
    else:
        mib = float(point["kv_mb"]["value"]) * 1e6 / MIB / float(point.get("ratio", {"value": "1"})["value"])
    kl = point["kl"]
    if kl == "reference":
        mean_kl = 0.0
    else:
        mean_kl = sum(float(k["value"]) for k in kl) / len(kl)
    return {"mib": mib, "kl": mean_kl}


# Where a point's label sits (the JSON's optional "label_at"): (up or down, right or left).
LABEL_AT = {"above right": (1, 1), "below right": (-1, 1), "above left": (1, -1), "below left": (-1, -1)}

STYLE = {"ours": {"color": "#1f6fb4", "marker": "o", "name": "ours (mnn_h2o)"},
         "llama.cpp": {"color": "#d9731a", "marker": "s", "name": "llama.cpp, same GGUF"}}


def load(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data.get("points"), list) or not data["points"]:
        raise ValueError(f"{path}: no 'points' list")
    for p in data["points"]:
        if "kl" not in p or not ("kv_mib" in p or "kv_mb" in p):
            raise ValueError(f"{path}: point {p.get('label')!r} needs 'kl' and 'kv_mib' or 'kv_mb'")
        if p.get("engine") not in STYLE:
            raise ValueError(f"{path}: point {p.get('label')!r}: engine must be one of {', '.join(STYLE)}")
        if p.get("label_at", "above right") not in LABEL_AT:
            raise ValueError(f"{path}: point {p.get('label')!r}: label_at must be one of {', '.join(LABEL_AT)}")
    return data


def draw(data: dict, out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.8), dpi=110)
    for engine, style in STYLE.items():
        pts = [(p, point_xy(p)) for p in data["points"] if p["engine"] == engine]
        if not pts:
            continue
        pts.sort(key=lambda t: -t[1]["mib"])
        ax.plot([xy["mib"] for _, xy in pts], [xy["kl"] for _, xy in pts], color=style["color"],
                marker=style["marker"], markersize=7, linewidth=1.6, label=style["name"])
        for p, xy in pts:
            vertical, side = LABEL_AT[p.get("label_at", "above right")]
            ax.annotate(p["label"], (xy["mib"], xy["kl"]), textcoords="offset points",
                        xytext=(8 * side, 7 * vertical), va="bottom" if vertical > 0 else "top",
                        ha="left" if side > 0 else "right", fontsize=9, color=style["color"])
    ax.set_xlim(0, 105)
    top = max(point_xy(p)["kl"] for p in data["points"]) * 1.15
    ax.set_ylim(-0.1 * top, top)  # room under the references' labels
    ax.set_xlabel("KV cache held (MiB)")
    ax.set_ylabel("KL vs own f16 full cache (nats)")
    ax.set_title(data.get("title", ""), fontsize=11)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper right", frameon=False)
    ax.text(0.02, 0.04, "lower left is better", transform=ax.transAxes, fontsize=9, color="0.4")
    if data.get("note"):
        fig.text(0.01, 0.01, data["note"], fontsize=7, color="0.35", wrap=True)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mnn_h2o.tools.readme_plot", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[2:]))
    ap.add_argument("--json", default=DEFAULT_JSON, help="the plot's figures (default: docs/data/readme_plot.json)")
    ap.add_argument("--out", default=DEFAULT_OUT, help="the PNG to write (default: docs/img/readme.png)")
    ap.add_argument("--results", default=RESULTS_MD, help="the reference the figures must appear in "
                                                        "(default: docs/results.md)")
    ap.add_argument("--check", action="store_true", help="only check the figures against --results; draw nothing")
    args = ap.parse_args(argv)

    def body() -> int:
        data = load(args.json)
        with open(args.results, encoding="utf-8") as f:
            problems = check_figures(data, f.read())
        for p in problems:
            print(f"{args.json}: {p}", file=sys.stderr)
        if problems:
            return 1
        if not args.check:
            draw(data, args.out)
            print(f"wrote {args.out}")
        return 0

    from ..cli_errors import run

    return run(body)


if __name__ == "__main__":
    sys.exit(main())
