"""The tables docs/results.md draws from docs/data: one renderer per KIND of `<!-- table: KIND ARGS -->`.

A renderer is called as renderer(docs dir, *args, **options): an ARG of the form key=value is an
option, any other is positional; every data file it reads is a positional `data/...` arg, so the
test can check that each is named in its section's `data`. It returns a Markdown table.

    fair DEFAULT FILE...                eval fair's per-point table (prompt, target, domain)
    fair_points DEFAULT FILE... cols=C,C [prompt=N] [target=T] [digits=D]
                                        the same points, only the columns named (_fair_column)
    kl_pair A B FILE...                 per point: A's KL, B's KL and B / A (the dev-split choices)
    mnn_vs_native MNN NATIVE cols=C,C   the same test points on MNN's modules and on our native ones
    kv_dtypes A B FILE...               our rows of kv_dtype A against B per domain: alone, then per target
    needles FILE...                     needle hits per haystack length and placement
    speed_vs_llama FILE [columns=decode] bench speed: ours against llama.cpp's f16 configs
    speed_engines FILE                  bench speed at one context: a row per engine, with KV held and KL
    decode_interleave FILE [ENGINE...]...
                                        tools.decode_interleave: a row per engine, decode against llama.cpp's
    conversation_budget FILE            tools.conversation_budget: what each config holds in one budget
    prefill_vs_llama FILE ENGINE...     tools.prompt_layers: prefill tok/s per engine, ours over llama.cpp's best
    first_token OURS BASE FILE...       tools.prefill_interleave: time to first token, a row per run and context
    shared_sessions FILE                tools.shared_sessions: stored bytes and a turn's TTFT from the store
    first_turn FILE                     tools.session_ttft --first-turn: a first turn's TTFT, compressed in it,
                                        after the answer or not at all

A bold figure is set by its renderer from a bar stated here, never typed: a fair ratio above the
issue's bar (eval/fair.py: default <= 1.1x the best press, <= 2x KVzip@q8); needle hits below 90%
of the full cache's; in speed tables the decode ratio, the one the bar is on.
"""
from __future__ import annotations

import json
import os
from typing import Callable, Dict, List, Optional, Sequence

from ..eval import fair

NEEDLE_BAR = 0.9  # hits at least this share of the full cache's (docs/results.md, the needles' bar)


def _md(head: Sequence[str], align: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]
                     + ["| " + " | ".join(r) + " |" for r in rows])


def _f(v: Optional[float], digits: int = 4) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _bold_if(text: str, missed: bool) -> str:
    return f"**{text}**" if missed else text


def _policy(method: str) -> str:
    """ours:predicted_kvzip@q8 -> predicted_kvzip."""
    return method.split(":", 1)[-1].split("@", 1)[0]


def _kl_rows(docs: str, files: Sequence[str]) -> List[dict]:
    return fair.load_rows([os.path.join(docs, f) for f in files])


def _at(rows: Sequence[dict], method: str, domain: str, prompt: int, target: Optional[float]) -> Optional[dict]:
    """The row of a method at a point (target None: the method has no target, e.g. q8 alone)."""
    for r in rows:
        if (r["method"] == method and r["domain"] == domain and r["prompt_tokens"] == prompt
                and (target is None or (r["target_ratio"] is not None and abs(r["target_ratio"] - target) < 1e-6))):
            return r
    return None


def _ratio(a: Optional[dict], b: Optional[dict]) -> Optional[float]:
    return a["kl"] / b["kl"] if a and b and b["kl"] else None


# --- the fair frontier ------------------------------------------------------------------------

def fair_table(docs: str, default: str, *files: str) -> str:
    """eval fair's per-point table, cut at its means: the section's prose states the means and bars."""
    return fair.table(fair.points(_kl_rows(docs, files), default), default).split("\n\n")[0]


def _fair_column(key: str, default: str, rows: Sequence[dict], first: Sequence[dict], digits: int) -> tuple:
    """(title, alignment, cell(point)) of one fair_points column: a key below, a METHOD (its KL at
    the point) or vs:METHOD (the default's KL over that method's). `before` is the default's KL as
    the first file holding it gave it, before a later file replaced it (eval/fair.py's merge)."""
    pol, name = _policy(default), default.split(":", 1)[-1] + " (ours)"
    f = lambda v: _f(v, digits)  # noqa: E731
    over = lambda p, other, bar: other is not None and p.default["kl"] > bar * other["kl"]  # noqa: E731
    at = lambda rs, method, p: _at(rs, method, p.domain, p.prompt_tokens, p.target)  # noqa: E731
    if key.startswith("vs:"):
        return (f"{pol} / {_policy(key[3:])}", "---:", lambda p: _f(_ratio(p.default, at(rows, key[3:], p)), 2))
    if ":" in key:
        engine, method = key.split(":", 1)
        return (f"{method} ({engine}): KL", "---:", lambda p: f((at(rows, key, p) or {}).get("kl")))
    return {
        "x_kl": (f"{name}: x / KL", "---", lambda p: f"{p.default['ratio']:.2f} / {f(p.default['kl'])}"),
        "kl": (f"{name}: KL", "---:", lambda p: f(p.default["kl"])),
        "kl_exact": (f"{name}: KL / kl_exact", "---",
                     lambda p: f"{f(p.default['kl'])} / {f(p.default.get('kl_exact'))}"),
        "before": (f"{name}: KL as first measured", "---:", lambda p: f((at(first, default, p) or {}).get("kl"))),
        "q8": (f"{fair.rows_name(default)} alone", "---:", lambda p: f(p.rows_alone["kl"]) if p.rows_alone else "-"),
        "best": ("best one-pass press@q8: press, KL", "---",
                 lambda p: f"{p.best_press['policy']}, {f(p.best_press['kl'])}" if p.best_press else "-"),
        "kvzip": ("KVzip@q8: KL", "---:", lambda p: f(p.kvzip["kl"]) if p.kvzip else "-"),
        "vs_best": (f"{pol} / best press", "---:", lambda p: _bold_if(
            _f(_ratio(p.default, p.best_press), 2), over(p, p.best_press, fair.BAR_BEST_PRESS))),
        "vs_kvzip": (f"{pol} / KVzip@q8", "---:", lambda p: _bold_if(
            _f(_ratio(p.default, p.kvzip), 2), over(p, p.kvzip, fair.BAR_KVZIP))),
        "exact": (f"kl_exact: {pol} / best press", "---", lambda p: f"{f(p.default.get('kl_exact'))} / "
                  f"{f(p.best_press.get('kl_exact') if p.best_press else None)}"),
    }[key]


def _first_rows(docs: str, files: Sequence[str], method: str) -> List[dict]:
    """The method's rows in the first of files that holds any (before a later file replaced them)."""
    for f in files:
        rows = [r for r in _kl_rows(docs, [f]) if r["method"] == method]
        if rows:
            return rows
    return []


def fair_points(docs: str, default: str, *files: str, cols: str, prompt: Optional[str] = None,
                target: Optional[str] = None, digits: str = "4") -> str:
    """The fair frontier's points with the columns named in cols (_fair_column), KLs to `digits`
    decimals; prompt=N, target=T: only the points at that prompt length, that target. The prompt
    column appears when the points span more than one prompt length."""
    rows = _kl_rows(docs, files)
    first = _first_rows(docs, files, default)
    pts = [p for p in fair.points(rows, default) if (prompt is None or p.prompt_tokens == int(prompt))
           and (target is None or abs(p.target - float(target)) < 1e-6)]
    chosen = [_fair_column(c, default, rows, first, int(digits)) for c in cols.split(",")]
    several = len({p.prompt_tokens for p in pts}) > 1
    head = (["prompt"] if several else []) + ["target", "domain"] + [c[0] for c in chosen]
    align = (["---:"] if several else []) + ["---:", "---"] + [c[1] for c in chosen]
    body = [([str(p.prompt_tokens)] if several else []) + [f"{p.target:g}", p.domain] + [c[2](p) for c in chosen]
            for p in pts]
    return _md(head, align, body)


# --- one method against another, per point -------------------------------------------------------

def kl_pair(docs: str, a: str, b: str, *files: str) -> str:
    """Per point where A ran with a target: A's KL, B's KL and B / A (5 decimals: dev-split KLs).
    The prompt column appears when the points span more than one prompt length."""
    rows = _kl_rows(docs, files)
    mine = sorted((r for r in rows if r["method"] == a and r["target_ratio"]),
                  key=lambda r: (r["prompt_tokens"], r["target_ratio"], r["domain"]))
    several = len({r["prompt_tokens"] for r in mine}) > 1
    body = []
    for r in mine:
        o = _at(rows, b, r["domain"], r["prompt_tokens"], r["target_ratio"])
        body.append(([str(r["prompt_tokens"])] if several else []) +
                    [f"{r['target_ratio']:g}", r["domain"], _f(r["kl"], 5), _f(o and o["kl"], 5), _f(_ratio(o, r), 2)])
    same_policy = _policy(a) == _policy(b)
    last = f"{b.split('@', 1)[-1]} / {a.split('@', 1)[-1]}" if same_policy else f"{_policy(b)} / {_policy(a)}"
    return _md((["prompt"] if several else []) + ["target", "domain", f"{a.split(':', 1)[-1]} KL",
                                                   f"{b.split(':', 1)[-1]} KL", last],
               (["---:"] if several else []) + ["---:", "---", "---:", "---:", "---:"], body)


def kv_dtypes(docs: str, a: str, b: str, *files: str) -> str:
    """Our cache rows of kv_dtype A against B (e.g. q8 and q8r) per domain, each cell A's KL / B's:
    alone (no eviction), then at each target B ran with its policy; and KVzip@q8's KL at that
    target (the peer). 5 decimals. One prompt length."""
    rows = _kl_rows(docs, files)
    ours = [r for r in rows if r["method"].startswith("ours:") and r["method"].endswith("@" + b)]
    domains = sorted({r["domain"] for r in ours})
    kl = lambda m, d, n, t: _f((_at(rows, m, d, n, t) or {}).get("kl"), 5)  # noqa: E731
    body = []
    for n, m, t in sorted({(r["prompt_tokens"], r["method"], r["target_ratio"]) for r in ours},
                          key=lambda k: (k[0], k[2] or 0)):
        cells = [kl(m[:-len(b)] + a, d, n, t) + " / " + kl(m, d, n, t) for d in domains]
        body.append([f"{t:g} ({_policy(m)})" if t else "alone"] + cells
                    + [" / ".join(kl(fair.KVZIP, d, n, t) for d in domains) if t else ""])
    return _md(["target"] + [f"{d}: {a} / {b}" for d in domains] + [f"KVzip@q8 ({' / '.join(domains)})"],
               ["---:"] + ["---"] * (len(domains) + 1), body)


# --- MNN's modules against our native ones ------------------------------------------------------

DEFAULT_THEN = "ours:kvzip@q8"  # the default when these runs were made


def _native_column(name: str):
    """(title, row's method, target, metric) of one mnn_vs_native column."""
    if name.startswith("default@"):
        t = float(name.split("@", 1)[1])
        return f"default {t:g}x", DEFAULT_THEN, t, "kl"
    return {"full_exact": ("full cache kl_exact", "ours:none", None, "kl_exact"),
            "q8": ("q8 alone", "ours:none@q8", None, "kl"),
            "q8_exact": ("kl_exact of q8 alone", "ours:none@q8", None, "kl_exact")}[name]


def mnn_vs_native(docs: str, mnn_file: str, native_file: str, *, cols: str) -> str:
    """The same test points run on MNN's modules and on ours: each cell `MNN's / native`. cols:
    full_exact, q8, q8_exact, default@TARGET. Points in the native file's order."""
    mnn, native = _kl_rows(docs, [mnn_file]), _kl_rows(docs, [native_file])
    columns = [_native_column(c) for c in cols.split(",")]
    points = list(dict.fromkeys((r["prompt_tokens"], r["domain"]) for r in native))
    body = []
    for n, d in points:
        cells = [str(n), d]
        for _, method, t, metric in columns:
            pair = [_at(rows, method, d, n, t) for rows in (mnn, native)]
            cells.append(" / ".join(_f(r and r.get(metric)) for r in pair))
        body.append(cells)
    return _md(["prompt", "domain"] + [f"{c[0]}: MNN's / native" for c in columns],
               ["---:", "---"] + ["---"] * len(columns), body)


# --- needles ------------------------------------------------------------------------------------

def needles(docs: str, *files: str) -> str:
    """Hits / trials per haystack length and placement: the full cache's (any placement: its
    prompt is not compressed), then each evicting method at each target. A cell below 90% of the
    full cache's hits is bold (the bar)."""
    runs = []
    for f in files:
        with open(os.path.join(docs, f), encoding="utf-8") as fh:
            runs += [r for r in json.load(fh)["runs"] if r["kind"] == "needle"]
    full = lambda n: [r for r in runs if r["length"] == n and r["policy"] == "none"]  # noqa: E731
    evicting = sorted({(r["method"], r["target_ratio"]) for r in runs if r["policy"] != "none"},
                      key=lambda m: (m[1], m[0]))
    body = []
    for n, pl in dict.fromkeys((r["length"], r["placement"]) for r in runs if r["policy"] != "none"):
        f = full(n)
        cells = [str(n), pl, f"{sum(r['hit'] for r in f)} / {len(f)}"]
        for m, t in evicting:
            got = [r for r in runs if (r["length"], r["placement"], r["method"], r["target_ratio"]) == (n, pl, m, t)]
            hits = sum(r["hit"] for r in got)
            cells.append(_bold_if(f"{hits} / {len(got)}", hits < NEEDLE_BAR * sum(r["hit"] for r in f))
                         if got else "not run")
        body.append(cells)
    return _md(["prompt", "placement", "full cache"] + [f"{_policy(m)} at {t:g}x" for m, t in evicting],
               ["---:", "---", "---:"] + ["---:"] * len(evicting), body)


# --- speed against llama.cpp --------------------------------------------------------------------

def _tps(s: dict) -> str:
    return f"{s['median']:.1f} ({s['min']:.1f}-{s['max']:.1f})"


def speed_vs_llama(docs: str, path: str, columns: str = "prefill,decode") -> str:
    """`bench speed` with ours, llama_f16 and llama_f16_fa: per context, prefill / decode tok/s
    (decode's min-max), ours' decode ms a token split as the bench splits it (layers, cache step,
    the rest of its total), and ours over llama.cpp's best config (the bench's own ratios).
    columns=decode: the decode figures alone (a run whose prefill another section reports)."""
    with open(os.path.join(docs, path), encoding="utf-8") as f:
        speed = json.load(f)["speed"]
    prefill = columns.split(",") != ["decode"]
    body = []
    for ctx, r in speed.items():
        o, ms = r["ours"], r["ours"]["decode_ms"]
        layers, step = ms["mnn"] + ms["dense"], ms["attention"] + ms["policy"]
        engine = ((lambda e: f"{e['prefill_tps']['median']:.1f} / {_tps(e['decode_tps'])}") if prefill  # noqa: E731
                  else (lambda e: _tps(e["decode_tps"])))
        ratio = f"**{r['decode_ratio_ours_vs_llama_best']:.2f}x**"
        if prefill:
            ratio = f"{r['prefill_ratio_ours_vs_llama_best']:.2f}x / " + ratio
        body.append([str(ctx), engine(o), f"{layers:.2f} / {step:.2f} / {ms['total'] - layers - step:.1f}",
                     engine(r["llama_f16"]), engine(r["llama_f16_fa"]), ratio])
    what = "prefill / decode" if prefill else "decode"
    return _md(["context", f"ours {what} tok/s", "decode ms a token: layers / cache step / rest",
                f"llama.cpp f16: {what}", f"llama.cpp f16 + FA: {what}", f"ours vs llama.cpp's best: {what}"],
               ["---:"] + ["---"] * 5, body)


_ENGINE_TITLES = {"native": "native prefill tok/s", "mnn": "MNN's modules", "llama_f16": "llama.cpp f16",
                  "llama_f16_fa": "llama.cpp f16 + FA", "llama_q8_fa": "llama.cpp q8_0 + FA"}


TTFT_BAR = 1.5  # the first token at least this times faster than llama.cpp's best (issue 50's bar)


def _interleave_rows(path: str) -> Dict[tuple, tuple]:
    """tools.prefill_interleave's printed table: (context, engine) -> (median, min, max) seconds."""
    rows = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            cells = line.split()
            if len(cells) == 6 and cells[0].isdigit():
                lo, hi = cells[3].split("-")
                rows[(int(cells[0]), cells[1])] = (float(cells[2]), float(lo), float(hi))
    return rows


def first_token(docs: str, ours: str, base: str, *files: str) -> str:
    """tools.prefill_interleave runs, a row per (FILE, context): the time to first token of our
    engine OURS, of BASE (our prefill without eviction) and of llama.cpp's configs, medians
    (min-max) in seconds; OURS over BASE and llama.cpp's best over OURS, the latter bold where it
    misses TTFT_BAR. A run without BASE shows "-" for it."""
    llamas = ("llama_f16", "llama_f16_fa")
    cell = lambda v: f"{v[0]:.2f} ({v[1]:.2f}-{v[2]:.2f})"  # noqa: E731
    body = []
    for run, f in enumerate(files, 1):
        rows = _interleave_rows(os.path.join(docs, f))
        for ctx in sorted({c for c, _ in rows}):
            o, b = rows[(ctx, ours)], rows.get((ctx, base))
            best = min(rows[(ctx, e)][0] for e in llamas)
            ratio = best / o[0]
            body.append([str(run), str(ctx), cell(b) if b else "-", cell(o)] + [cell(rows[(ctx, e)]) for e in llamas]
                        + [(f"{o[0] / b[0]:.2f}x" if b else "-") + " / "
                           + _bold_if(f"{ratio:.2f}x faster", ratio < TTFT_BAR)])
    return _md(["run", "prompt tokens", "no eviction", _policy(ours)] + [_ENGINE_TITLES[e] for e in llamas]
               + [f"{_policy(ours)}: vs no eviction / vs llama.cpp's best"],
               ["---", "---:", "---:", "---:", "---:", "---:", "---:"], body)


def prefill_vs_llama(docs: str, path: str, *engines: str) -> str:
    """tools.prompt_layers' prefill tok/s per context, medians (min-max), for the engines named
    (ours first), and ours (the first) over the fastest llama.cpp config's median."""
    with open(os.path.join(docs, path), encoding="utf-8") as f:
        contexts = json.load(f)["contexts"]
    body = []
    for ctx, r in contexts.items():
        tps = {e: r[e]["prefill_tps"] for e in engines}
        best = max(v["median"] for e, v in tps.items() if e.startswith("llama"))
        body.append([ctx] + [_tps(tps[e]) for e in engines] + [f"**{tps[engines[0]]['median'] / best:.2f}x**"])
    return _md(["context"] + [_ENGINE_TITLES[e] for e in engines] + [f"{engines[0]} / llama.cpp's best"],
               ["---:"] * (len(engines) + 2), body)


def _engine_title(engine: str, policy: str) -> str:
    return _ENGINE_TITLES.get(engine) or f"ours, {policy}"


def speed_engines(docs: str, path: str) -> str:
    """`bench speed` at its one context, a row per engine: prefill tok/s (min-max) and the time to
    first token it makes, decode tok/s (min-max), ours' decode ms a token in the layers / the
    cache step (as speed_vs_llama splits them), the KV bytes held, and KL / top-1 against the
    engine's own full cache (or the reference the bench names)."""
    with open(os.path.join(docs, path), encoding="utf-8") as f:
        d = json.load(f)
    (ctx, r), = d["speed"].items()
    body = []
    for e, v in ((e, v) for e, v in r.items() if isinstance(v, dict) and "decode_tps" in v):
        ms, q = v.get("decode_ms"), v.get("quality_vs_own_full")
        quality = f"{q['kl']:.4f} / {100 * q['top1_agreement']:.1f}%" if q else ""
        if q and q["reference"] in _ENGINE_TITLES:  # measured against another engine's full cache
            quality += f" (vs {_ENGINE_TITLES[q['reference']]})"
        body.append([_engine_title(e, d["config"]["h2o"]["policy"]),
                     f"{_tps(v['prefill_tps'])}: {int(ctx) / v['prefill_tps']['median']:.0f} s",
                     _tps(v["decode_tps"]),
                     f"{ms['mnn'] + ms['dense']:.2f} / {ms['attention'] + ms['policy']:.2f}" if ms else "",
                     f"{v['kv_bytes_held'] / 2**20:.1f}", quality])
    return _md(["engine", "prefill tok/s (time to first token)", "decode tok/s",
                "decode ms a token: layers / cache step", "KV MiB held", "KL / top-1 vs its own full cache"],
               ["---", "---:", "---:", "---", "---:", "---"], body)


def decode_interleave(docs: str, *args: str) -> str:
    """tools.decode_interleave's engines, a row each: a FILE then the ENGINEs taken from it (none:
    all), rows in that order. The prefill (one each; kvzip's pass within it), the decode step's
    median ms and its cache step, the KV held, and ours over llama.cpp's best config (the paired
    ratio and its 95% noise). A row from a later FILE is its own run: its ratio names its reference."""
    groups: List[list] = []
    for a in args:
        if a.startswith("data/"):
            with open(os.path.join(docs, a), encoding="utf-8") as f:
                groups.append([json.load(f), []])
        else:
            groups[-1][1].append(a)
    body = []
    for i, (d, names) in enumerate(groups):
        best = d["engines"][d["llama_best"]]
        for e in names or list(d["engines"]):
            v, vs = d["engines"][e], d["engines"][e].get("vs_llama_best")
            ratio = f"{vs['ratio']:.2f}x (±{100 * vs['noise']:.1f}%)" if vs else ""
            if vs and i:
                ratio += (f" against {_ENGINE_TITLES[d['llama_best']]}'s {best['decode_ms_median']:.1f} ms, "
                          f"{best['prefill_s']:.1f} s")
            pass_s = f" (the pass {v['reconstruct_s']:.1f})" if v.get("reconstruct_s") else ""
            body.append([_engine_title(e, e.split(":", 1)[-1]) + (" (its own run)" if i else ""),
                         f"{v['prefill_s']:.1f}{pass_s}", f"{v['decode_ms_median']:.1f}",
                         f"{v['cache_ms']:.1f}" if "cache_ms" in v else "", f"{v['kv_bytes_held'] / 2**20:.1f}", ratio])
    return _md(["engine", "time to first token, s (one prefill)", "decode ms a token (median)", "of it the cache step",
                "KV MiB held", f"decode vs {_ENGINE_TITLES[groups[0][0]['llama_best']]}"], ["---"] + ["---:"] * 5, body)


# --- one KV budget -------------------------------------------------------------------------------

_BUDGET_CONFIGS = {"f16": "f16 full cache", "q8": "q8 full cache", "default": "the default (byte cap)"}
_STOPPED_BY = {"budget": "the budget", "text": "the text", "context": "the context"}


def conversation_budget(docs: str, path: str) -> str:
    """tools.conversation_budget's rows: per config the conversation it held within the budget
    (tokens, and over the f16 full cache's), its turns, what stopped it, the bytes the cache held,
    the whole-model ratio and how many of turn 1's facts it recalled at the end."""
    with open(os.path.join(docs, path), encoding="utf-8") as f:
        rows = json.load(f)["rows"]
    f16 = next((r["tokens"] for r in rows if r["config"] == "f16"), None)  # a run of the default alone has none
    body = [[_BUDGET_CONFIGS[r["config"]], str(r["tokens"]), f"{r['tokens'] / f16:.2f}" if f16 else "-", str(r["turns"]),
             _STOPPED_BY[r["stopped_by"]], f"{r['kv_bytes_held'] / 2**20:.2f}", f"{r['whole_model_ratio']:.2f}",
             f"{r['recall_hits']} / {len(r['recall'])}"] for r in rows]
    return _md(["config", "conversation tokens held", "x f16 full cache", "turns", "stopped by", "KV MiB held",
                "whole-model ratio", "recall of turn 1's facts"], ["---", "---:", "---:", "---:", "---"] + ["---:"] * 3,
               body)


# --- sessions shared by replicas ----------------------------------------------------------------

def _seconds(s: dict) -> str:
    return f"{s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f})"


def shared_sessions(docs: str, path: str) -> str:
    """tools.shared_sessions' bytes and ttft per history length: the stored session against the
    f16 KV it stands for, and a turn's time to first token from the store against a re-prefill
    (the issue's bar: at most 10% of it at 4K tokens; a ratio above it is bold)."""
    with open(os.path.join(docs, path), encoding="utf-8") as f:
        d = json.load(f)
    body = []
    for n, b in d["bytes"].items():
        t = d["ttft"][n]
        body.append([str(b["tokens"]), f"{b['stored_bytes']:,}".replace(",", " "), f"{b['f16_bytes']:,}".replace(",", " "),
                     f"{b['ratio']:.2f}", _seconds(t["store"]["ttft_s"]), _seconds(t["re-prefill"]["ttft_s"]),
                     _bold_if(f"{t['ratio']:.3f}", t["ratio"] > 0.1)])
    return _md(["history tokens", "stored session, bytes", "f16 KV, bytes", "f16 / stored", "TTFT from the store, s",
                "TTFT re-prefilled, s", "store / re-prefill"], ["---:"] * 7, body)


def first_turn(docs: str, path: str) -> str:
    """tools.session_ttft --first-turn: per prompt length a first turn's TTFT, medians (min-max), with
    kvzip's pass in the turn, after the answer (then the pass, timed apart) and without eviction;
    the first two over the third; the KV MiB each holds once compressed."""
    with open(os.path.join(docs, path), encoding="utf-8") as f:
        rows = json.load(f)["first_turn"]
    body = [[str(r["prompt_tokens"]), _seconds(r["in_turn"]["ttft_s"]), _seconds(r["after_answer"]["ttft_s"]),
             _seconds(r["after_answer"]["compress_s"]), _seconds(r["no_eviction"]["ttft_s"]),
             f"{r['in_turn_over_no_eviction']:.2f}x", f"{r['after_answer_over_no_eviction']:.2f}x",
             " / ".join(f"{r[k]['kv_bytes_held'] / 2**20:.1f}" for k in ("in_turn", "after_answer", "no_eviction"))]
            for r in rows]
    return _md(["prompt tokens", "TTFT s: in the turn", "after the answer", "then its compression, s", "no eviction",
                "in the turn / none", "after the answer / none",
                "KV MiB held once compressed: in the turn / after / none"], ["---:"] * 7 + ["---"], body)


TABLES: Dict[str, Callable[..., str]] = {
    "fair": fair_table, "fair_points": fair_points, "kl_pair": kl_pair, "mnn_vs_native": mnn_vs_native,
    "needles": needles, "speed_vs_llama": speed_vs_llama, "conversation_budget": conversation_budget,
    "prefill_vs_llama": prefill_vs_llama, "shared_sessions": shared_sessions, "kv_dtypes": kv_dtypes,
    "speed_engines": speed_engines, "decode_interleave": decode_interleave, "first_turn": first_turn,
    "first_token": first_token,
}


def render(kind: str, docs: str, args: Sequence[str]) -> str:
    """The table of one directive: key=value args are options, the rest positional."""
    options = dict(a.split("=", 1) for a in args if "=" in a)
    return TABLES[kind](docs, *[a for a in args if "=" not in a], **options)
