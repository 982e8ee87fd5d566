"""The quality frontier: KV memory against quality, per method, on held-out text.

For every method (an engine, an eviction policy or press, a KV element type) and target
whole-model ratio, on the segments of each domain's split (see ``domains``):

- teacher-forced quality: the prompt is prefilled, then the true continuation is fed token by
  token through the decode path, and every position's next-token distribution is compared with
  the same engine's own full cache: mean KL(full || compressed), top-1 agreement, perplexity
  of the true continuation (and its difference from the full cache's); and ``kl_exact``, KL
  against the exact model (ours: ``mnn_h2o.reference`` in float32 on the GGUF's weights; the
  peer: transformers in float32 with a full cache, which is its own full cache), each computed
  once per segment and shared by every method;
- memory: bytes the cache holds at the end of the continuation, measured by the engine
  (every layer; for ours, the allocated raw blocks plus anything the lossless store holds),
  and the whole-model ratio = f16 bytes of every token written / bytes held;
- needles (``needle``): hits over the trials of each placement, the full cache's hits beside.

Every finished run is appended to the JSON file at once, so an interrupted sweep loses at most
one run and ``--resume`` goes on from there. ``rows`` in the file aggregate the runs over
segments: one row per (method, target ratio, domain, prompt length, split) and one per
(method, target ratio, placement, split) for needles.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from .domains import Segment
from .needle import Trial, is_hit
from ..measure import log_softmax
from .quality import eviction_target, f16_bytes, metrics, teacher_forced


@dataclass(frozen=True)
class Method:
    """``engine:policy[@kv_dtype]``: ``ours:h2o``, ``ours:none@q8`` (quantisation alone),
    ``kvpress:snapkv``, ``kvpress:snapkv@q8``. Policy ``none`` is the engine's cache without
    eviction."""
    engine: str
    policy: str
    kv_dtype: str = "f16"

    @property
    def name(self) -> str:
        return f"{self.engine}:{self.policy}" + ("" if self.kv_dtype == "f16" else f"@{self.kv_dtype}")

    @property
    def is_reference(self) -> bool:
        return self.policy == "none" and self.kv_dtype == "f16"

    @property
    def evicts(self) -> bool:
        return self.policy != "none"


def our_policies() -> Tuple[str, ...]:
    """The policies a run names: the core's (auto is a choice between two of them per model, and
    a frontier row says which it measured)."""
    from .. import config as config_mod

    return tuple(config_mod.native_choices(config_mod.key("eviction.policy")))


def our_dtypes() -> Tuple[str, ...]:
    from .. import config as config_mod

    return tuple(config_mod.key("runtime.kv_dtype").choices)


def parse_methods(spec: str, peer_presses: Sequence[str]) -> List[Method]:
    """Comma-separated method names; ``ours`` and ``kvpress`` alone mean every policy/press
    (``kvpress@q8``: every press, and the full cache, at q8)."""
    from .kvpress_peer import DTYPES as PEER_DTYPES

    out: List[Method] = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        engine, _, rest = item.partition(":")
        if "@" in engine:
            engine, _, dtype = engine.partition("@")
            policy = ""
        else:
            policy, _, dtype = rest.partition("@")
        if engine == "ours":
            names = ("none",) + our_policies() if not policy else (policy,)
            allowed = ("none",) + our_policies()
            dtype = dtype or "f16"
            if dtype not in our_dtypes():
                raise ValueError(f"{item}: unknown kv dtype {dtype!r} (allowed: {', '.join(our_dtypes())})")
        elif engine == "kvpress":
            names = ("none",) + tuple(peer_presses) if not policy else (policy,)
            allowed = ("none",) + tuple(peer_presses)
            dtype = dtype or "f16"
            if dtype not in PEER_DTYPES:
                raise ValueError(f"{item}: unknown kv dtype {dtype!r} for the kvpress peer "
                                 f"(allowed: {', '.join(PEER_DTYPES)})")
        else:
            raise ValueError(f"{item}: unknown engine {engine!r} (allowed: ours, kvpress)")
        for p in names:
            if p not in allowed:
                raise ValueError(f"{item}: unknown {'policy' if engine == 'ours' else 'press'} {p!r} "
                                 f"(allowed: {', '.join(allowed)})")
            m = Method(engine, p, dtype)
            if m not in out:
                out.append(m)
    if not out:
        raise ValueError("no methods given")
    return out


# --- the engines -----------------------------------------------------------------------------
def dtype_gain(engine: str, kv_dtype: str) -> float:
    """Bytes of an f16 row / bytes of a ``kv_dtype`` row: what the element type alone saves
    (32/17 for q8, ours or the peer's q8_0; 32/9 for our q4; whatever head_dim)."""
    if engine != "ours":
        from .kvpress_peer import dtype_gain as peer_gain

        return peer_gain(kv_dtype)
    from .. import native

    return native.kv_row_bytes("f16", 32) / native.kv_row_bytes(kv_dtype, 32)


class OursEngine:
    """Our engine: one Llm whose cache is rebuilt for each KV element type."""
    name = "ours"

    def __init__(self, cfg: dict):
        self.cfg = cfg
        self._llm_obj = None
        self._exact = None

    def _llm(self, kv_dtype: str):
        if self._llm_obj is None:
            from ..engine import Llm
            from ..export import ensure_exported

            cfg = {s: dict(v) for s, v in self.cfg.items()}
            cfg["lossless"]["mode"] = "off"
            cfg["runtime"]["kv_dtype"] = kv_dtype
            self._llm_obj = Llm(ensure_exported(cfg["model"], progress=False), cfg)
        if self._llm_obj.kv_dtype != kv_dtype:
            self._llm_obj.configure_kv_dtype(kv_dtype)
        return self._llm_obj

    @property
    def tokenizer(self):
        return self._llm("f16").tokenizer

    def check_scorer(self) -> None:
        """ScorerFileError now, naming the command, when eviction.policy predicted_kvzip has no
        scorer fitted for this export."""
        from ..token_scorer import check_layers, load_for_export

        llm = self._llm("f16")
        check_layers(load_for_export(llm.export_dir, llm.meta, llm.config), llm._evicting_layers(self.cfg["eviction"]))

    def _configure(self, m: Method, ratio: Optional[float]):
        from .quality import eviction_section

        llm = self._llm(m.kv_dtype)
        # eviction.target_lossy_ratio is whole-model: a quantised element type pays its part of it,
        # eviction the rest.
        llm.configure_eviction(eviction_section(self.cfg["eviction"], m.policy, ratio) if m.evicts else None)
        return llm

    def teacher_forced(self, m: Method, ratio: Optional[float], prompt, cont) -> dict:
        llm = self._configure(m, ratio)
        tr = teacher_forced(llm, prompt, cont)
        # The prefill's time and the part of it kvzip's reconstruction pass took.
        return {"logp": tr.logp, "bytes_held": tr.kv_bytes_held, "bytes_full": tr.f16_bytes,
                "prefill_s": llm.stats.prefill_s, "reconstruct_s": llm.stats.reconstruct_s}

    def exact_logp(self, prompt, cont, full_logp: np.ndarray) -> np.ndarray:
        """The exact model's log-probabilities, rows as :meth:`teacher_forced`'s: the numpy
        reference forward (``mnn_h2o.reference``) on the GGUF's own dequantised weights, in
        float32, the whole sequence at once. It is the model our engine approximates without
        MNN's int8 weights and activations; float32 moves its KL by < 1e-6 from float64's
        (tests/test_frontier.py) at half the time and memory."""
        if self._exact is None:
            from ..gguf_model import GgufModel
            from ..model_source import resolve_gguf
            from ..reference import ReferenceModel

            self._exact = ReferenceModel(GgufModel(resolve_gguf(self.cfg["model"]["name"])), np.float32)
        return exact_logp(self._exact, prompt, cont)

    def answer(self, m: Method, ratio: Optional[float], trial: Trial, placement: str,
               max_new_tokens: int) -> Tuple[str, int, int]:
        llm = self._configure(m, ratio)
        if placement == "inside":
            g = llm.generate(list(trial.context + trial.question), max_new_tokens, chat=False)
        else:
            llm.prefill(list(trial.context))
            g = llm.generate(list(trial.question), max_new_tokens, chat=False, keep_context=True)
        return g.text, llm.stats.kv_bytes_held, f16_bytes(llm)


def exact_logp(model, prompt, cont) -> np.ndarray:
    """Log-probabilities [len(cont), vocab] of a :class:`~mnn_h2o.reference.ReferenceModel`,
    row i that of cont[i] after prompt + cont[:i]: one forward over prompt + cont[:-1], only the
    last len(cont) positions projected to the vocabulary."""
    ids = list(prompt) + list(cont[:-1])
    return log_softmax(model.forward(ids, last_rows=len(cont))).astype(np.float32)


class PeerEngine:
    """The kvpress peer (optional extra): the same GGUF in transformers. It is told the grid of
    presses, ratios and element types so that one prefill per prompt serves all of them (see
    kvpress_peer)."""
    name = "kvpress"

    def __init__(self, gguf_path: str, threads: int, tokenizer, methods: Sequence[Method], ratios: Sequence[float]):
        from .kvpress_peer import KvpressPeer

        self.peer = KvpressPeer(gguf_path, threads=threads, tokenizer=tokenizer)
        self.tokenizer = tokenizer
        self.grid = dict(grid_methods=tuple((m.policy, m.kv_dtype) for m in methods if m.evicts),
                         grid_ratios=tuple(ratios))

    def teacher_forced(self, m: Method, ratio: Optional[float], prompt, cont) -> dict:
        r = self.peer.teacher_forced(list(prompt), list(cont), m.policy if m.evicts else None,
                                     ratio if m.evicts else 1.0, kv_dtype=m.kv_dtype, **self.grid)
        return {"logp": r["logp"], "bytes_held": r["bytes_held"], "bytes_full": r["bytes_full"]}

    def exact_logp(self, prompt, cont, full_logp: np.ndarray) -> np.ndarray:
        """The peer's full cache is the exact model already: the GGUF's weights dequantised to
        float32 in transformers, every entry kept in float32."""
        return full_logp

    def answer(self, m: Method, ratio: Optional[float], trial: Trial, placement: str,
               max_new_tokens: int) -> Tuple[str, int, int]:
        ids, held, full = self.peer.generate(list(trial.context), list(trial.question),
                                             m.policy if m.evicts else None, ratio if m.evicts else 1.0,
                                             question_inside=placement == "inside", kv_dtype=m.kv_dtype,
                                             max_new_tokens=max_new_tokens, **self.grid)
        return self.tokenizer.decode(list(ids)), held, full


def peer_presses() -> Tuple[Tuple[str, ...], Optional[str]]:
    """The kvpress presses, or () and the reason the extra cannot be used."""
    from .kvpress_peer import PRESSES, PeerUnavailable, check

    try:
        check()
    except PeerUnavailable as e:
        return (), str(e)
    return tuple(PRESSES), None


# --- the sweep -------------------------------------------------------------------------------
def _kl_key(r: dict) -> tuple:
    return ("kl", r["method"], r["target_ratio"], r["domain"], r["split"], r["segment"], r["prompt_tokens"])


def _needle_key(r: dict) -> tuple:
    return ("needle", r["method"], r["target_ratio"], r["placement"], r["split"], r["needle"],
            r["depth"], r["length"], r["domain"], r["value"])


# What a run's numbers depend on besides its own key: a file may only be resumed under the same.
# The rest (methods, ratios, segments, domains, lengths) only adds runs to the grid.
_RESUME_SAME = ("split", "continuation", "config")


class Results:
    """The output file: meta, per-run records and aggregated rows, rewritten after every run."""

    def __init__(self, path: Optional[str], meta: dict, resume: bool):
        self.path, self.meta = path, meta
        self.runs: List[dict] = []
        if path and os.path.dirname(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
        if path and os.path.exists(path) and not resume:
            raise ValueError(f"{path} exists: pass --resume to continue it, or choose another --json")
        if resume and path and os.path.exists(path):
            with open(path) as f:
                old = json.load(f)
            was = old.get("meta", {}).get("settings", {})
            diff = [k for k in _RESUME_SAME if was.get(k) != meta["settings"].get(k)]
            if diff:
                raise ValueError(f"--resume: {path} was written with other {', '.join(diff)}; "
                                 "use another --json file or the same options")
            self.runs = old.get("runs", [])
        self._done = {(_kl_key(r) if r["kind"] == "kl" else _needle_key(r)) for r in self.runs}

    def done(self, key: tuple) -> bool:
        return key in self._done

    def add(self, run: dict) -> None:
        self.runs.append(run)
        self._done.add(_kl_key(run) if run["kind"] == "kl" else _needle_key(run))
        self.save()

    def save(self) -> None:
        if not self.path:
            return
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"meta": self.meta, "rows": aggregate(self.runs), "runs": self.runs}, f, indent=1)
        os.replace(tmp, self.path)


def _base(m: Method, target: Optional[float], split: str) -> dict:
    return {"method": m.name, "engine": m.engine, "kv_dtype": m.kv_dtype, "policy": m.policy,
            "target_ratio": target, "split": split}


def _targets(m: Method, ratios: Sequence[float]) -> List[Optional[float]]:
    """The whole-model targets a method runs at: every ratio for an evicting method, except
    those its element type alone already exceeds (q8 alone is 1.88x: no eviction target 1.5)."""
    if not m.evicts:
        return [None]
    gain = dtype_gain(m.engine, m.kv_dtype)
    return [t for t in ratios if eviction_target(t, gain) > 1.0]


def kl_sweep(engines: Dict[str, object], methods: Sequence[Method], ratios: Sequence[float],
             segs: Sequence[Segment], results: Results, tick: Callable[[], None], exact: bool = True) -> None:
    """Teacher-forced runs of every method and ratio on every segment; each engine's full
    cache and (``exact``) exact model once per segment (and only when a candidate of that
    segment is still to run). ``tick`` is called once per grid point, done before or now."""
    for seg in segs:
        for eng_name, eng in engines.items():
            grid = [(m, t) for m in methods if m.engine == eng_name for t in _targets(m, ratios)]
            todo = [(m, t) for m, t in grid if not results.done(_kl_key(dict(
                _base(m, t, seg.split), domain=seg.domain, segment=seg.index, prompt_tokens=len(seg.prompt))))]
            for _ in range(len(grid) - len(todo)):
                tick()
            if not todo:
                continue
            t0 = time.perf_counter()
            ref = eng.teacher_forced(Method(eng_name, "none"), None, seg.prompt, seg.continuation)
            ref_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            exact_lp = eng.exact_logp(seg.prompt, seg.continuation, ref["logp"]) if exact else None
            exact_s = time.perf_counter() - t0
            for m, t in todo:
                t0 = time.perf_counter()
                cand = ref if m.is_reference else eng.teacher_forced(m, t, seg.prompt, seg.continuation)
                secs = ref_s if m.is_reference else time.perf_counter() - t0
                run = dict(_base(m, t, seg.split), kind="kl", domain=seg.domain, segment=seg.index,
                           window_offset=seg.offset, prompt_tokens=len(seg.prompt),
                           continuation_tokens=len(seg.continuation),
                           bytes_held=int(cand["bytes_held"]), bytes_full=int(cand["bytes_full"]),
                           ratio=cand["bytes_full"] / cand["bytes_held"] if cand["bytes_held"] else None,
                           seconds=round(secs, 2), exact_seconds=round(exact_s, 2))
                run.update({k: round(cand[k], 2) for k in ("prefill_s", "reconstruct_s") if k in cand})
                run.update(metrics(ref["logp"], cand["logp"], seg.continuation))
                run["kl_exact"] = metrics(exact_lp, cand["logp"], seg.continuation)["kl"] if exact else None
                results.add(run)
                tick()


def needle_sweep(engines: Dict[str, object], methods: Sequence[Method], ratios: Sequence[float],
                 trials: Sequence[Trial], placements: Sequence[str], split: str, results: Results,
                 tick: Callable[[], None], max_new_tokens: int = 8) -> None:
    """Every method, ratio and placement over every trial. Without eviction the two placements
    are the same computation, so a method that does not evict runs once. Trials
    are the outer loop so that an engine can share one prefill of a prompt across its grid."""
    # A method that does not evict runs once, labelled inside, even if only 'after' is asked for.
    order = list(placements) if "inside" in placements else ["inside"] + list(placements)
    for trial in trials:
        for placement in order:
            for m in methods:
                if (placement != "inside" and not m.evicts) or (placement not in placements and m.evicts):
                    continue
                for t in _targets(m, ratios):
                    base = dict(_base(m, t, split), kind="needle", placement=placement, needle=trial.needle,
                                depth=trial.depth, length=trial.length, domain=trial.domain, value=trial.value)
                    if results.done(_needle_key(base)):
                        tick()
                        continue
                    t0 = time.perf_counter()
                    text, held, full = engines[m.engine].answer(m, t, trial, placement, max_new_tokens)
                    results.add(dict(base, answer=text, hit=is_hit(text, trial.value), bytes_held=held, bytes_full=full,
                                     ratio=full / held if held else None,
                                     seconds=round(time.perf_counter() - t0, 2)))
                    tick()


def sweep_size(methods: Sequence[Method], ratios: Sequence[float], n_segments: int,
               n_trials: int, placements: Sequence[str]) -> int:
    kl = sum(len(_targets(m, ratios)) for m in methods) * n_segments
    nd = sum(len(_targets(m, ratios)) * (len(placements) if m.evicts else 1) for m in methods) * n_trials
    return kl + nd


# --- aggregation -----------------------------------------------------------------------------
ROW_KEYS = ("method", "engine", "kv_dtype", "policy", "ratio", "domain", "split", "kl", "kl_exact", "top1",
            "ppl_delta", "needle_hits", "needle_trials", "bytes_held")


def _mean(xs: Iterable[Optional[float]]) -> Optional[float]:
    v = [x for x in xs if x is not None]
    return float(np.mean(v)) if v else None


def aggregate(runs: Sequence[dict]) -> List[dict]:
    """Rows: KL runs averaged over segments (every segment has the same number of tokens), and
    needle hits summed over trials with the same engine's full-cache hits as the ceiling."""
    groups: Dict[tuple, List[dict]] = {}
    for r in runs:
        if r["kind"] == "kl":
            key = ("kl", r["method"], r["target_ratio"], r["domain"], r["prompt_tokens"], r["split"])
        else:
            key = ("needle", r["method"], r["target_ratio"], r["placement"], r["split"])
        groups.setdefault(key, []).append(r)
    full_hits: Dict[tuple, int] = {}
    for key, rs in groups.items():
        if key[0] == "needle" and rs[0]["policy"] == "none" and rs[0]["kv_dtype"] == "f16":
            full_hits[(rs[0]["engine"], rs[0]["split"])] = sum(r["hit"] for r in rs)
    rows = []
    for key, rs in groups.items():
        r0 = rs[0]
        row = {k: r0.get(k) for k in ("method", "engine", "kv_dtype", "policy", "target_ratio", "split")}
        row["kind"] = key[0]
        row["bytes_held"] = _mean(r["bytes_held"] or None for r in rs)
        row["ratio"] = _mean(r["ratio"] for r in rs)
        if key[0] == "kl":
            row.update(domain=r0["domain"], prompt_tokens=r0["prompt_tokens"], segments=len(rs),
                       kl=_mean(r["kl"] for r in rs), kl_exact=_mean(r.get("kl_exact") for r in rs),
                       top1=_mean(r["top1"] for r in rs),
                       ppl_delta=_mean(r["ppl_delta"] for r in rs),
                       needle_hits=None, needle_trials=None)
        else:
            row.update(domain="+".join(sorted({r["domain"] for r in rs})), placement=r0["placement"],
                       kl=None, kl_exact=None, top1=None, ppl_delta=None, needle_hits=sum(r["hit"] for r in rs),
                       needle_trials=len(rs),
                       needle_hits_full=full_hits.get((r0["engine"], r0["split"])))
        rows.append(row)
    return rows


# --- reporting -------------------------------------------------------------------------------
def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def table(rows: Sequence[dict]) -> str:
    """Markdown: KL (against the engine's full cache and the exact model) / top-1 per domain and
    prompt length, then needles."""
    out = []
    kl = sorted((r for r in rows if r["kind"] == "kl"),
                key=lambda r: (r["domain"], r["prompt_tokens"], r["engine"], r["method"], r["target_ratio"] or 0))
    if kl:
        out += ["| domain | prompt | method | target | ratio | KL | KL exact | top-1 | ppl delta | MiB held | segments |",
                "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in kl:
            out.append(f"| {r['domain']} | {r['prompt_tokens']} | {r['method']} | {_fmt(r['target_ratio'])} | "
                       f"{_fmt(r['ratio'])} | {_fmt(r['kl'])} | {_fmt(r.get('kl_exact'))} | {_fmt(r['top1'])} | "
                       f"{_fmt(r['ppl_delta'])} | "
                       f"{_fmt(r['bytes_held'] / 2**20 if r['bytes_held'] else None)} | {r['segments']} |")
    nd = sorted((r for r in rows if r["kind"] == "needle"),
                key=lambda r: (r["placement"], r["engine"], r["method"], r["target_ratio"] or 0))
    if nd:
        out += ["", "| placement | method | target | hits / trials | full cache |", "|---|---|---:|---:|---:|"]
        for r in nd:
            out.append(f"| {r['placement']} | {r['method']} | {_fmt(r['target_ratio'])} | "
                       f"{r['needle_hits']} / {r['needle_trials']} | {_fmt(r.get('needle_hits_full'))} |")
    return "\n".join(out)


# Relative distance in measured ratio within which a press and our last point count as equal
# memory (our block rounding lands ours up to ~1% below the target).
RATIO_TOLERANCE = 0.02


def _ours_at(curves: Dict[str, List[Tuple[float, float]]], x: float) -> Optional[Tuple[str, float]]:
    """Our best policy's KL at measured ratio ``x``: each policy's (ratio, KL) points, the full
    cache's (ratio ~1, KL 0) among them, interpolated linearly in KL against log ratio; a policy
    whose points do not reach ``x`` is not a candidate (no extrapolation), except that a press
    measured within ``RATIO_TOLERANCE`` past our last point meets that point: both aimed at the
    same target and landed a block's rounding apart."""
    best = None
    for policy, pts in curves.items():
        pts = sorted(pts)
        if len(pts) < 2 or not pts[0][0] <= x <= pts[-1][0] * (1 + RATIO_TOLERANCE):
            continue
        kl = float(np.interp(np.log(min(x, pts[-1][0])), [np.log(r) for r, _ in pts], [k for _, k in pts]))
        if best is None or kl < best[1]:
            best = (policy, kl)
    return best


def peer_comparison(rows: Sequence[dict]) -> str:
    """Each kvpress press against our best policy at equal memory and the same element type
    (the press's measured whole-model ratio; ours interpolated between its measured ratios from
    our cache without eviction in that type, ``random`` excluded as a control), per domain and
    prompt length; then a summary per press; then needles per target. A q8 press is named
    ``press@q8`` and compared with our q8 policies."""
    kl = [r for r in rows if r["kind"] == "kl"]
    out = ["| domain | prompt | press | press ratio | press KL | our best at that ratio | our KL | press KL / ours |",
           "|---|---:|---|---:|---:|---|---:|---:|"]
    per_press: Dict[str, List[float]] = {}
    beyond: Dict[str, int] = {}
    for d, n, dt in sorted({(r["domain"], r["prompt_tokens"], r["kv_dtype"]) for r in kl}):
        same = [r for r in kl if (r["domain"], r["prompt_tokens"], r["kv_dtype"]) == (d, n, dt)]
        sfx = "" if dt == "f16" else f"@{dt}"
        start = [(f["ratio"], f["kl"]) for f in same if f["engine"] == "ours" and f["policy"] == "none"]
        curves: Dict[str, List[Tuple[float, float]]] = {}
        for r in same:
            if r["engine"] == "ours" and r["policy"] not in ("none", "random") and r["ratio"]:
                curves.setdefault(r["policy"] + sfx, list(start)).append((r["ratio"], r["kl"]))
        for p in sorted((r for r in same if r["engine"] == "kvpress" and r["policy"] != "none"),
                        key=lambda r: (r["policy"], r["ratio"])):
            name = p["policy"] + sfx
            o = _ours_at(curves, p["ratio"])
            if o is None:
                beyond[name] = beyond.get(name, 0) + 1
                out.append(f"| {d} | {n} | {name} | {p['ratio']:.2f} | {p['kl']:.4g} | beyond our reach | - | - |")
                continue
            rel = p["kl"] / o[1] if o[1] > 0 else float("inf")
            per_press.setdefault(name, []).append(rel)
            out.append(f"| {d} | {n} | {name} | {p['ratio']:.2f} | {p['kl']:.4g} | {o[0]} | {o[1]:.4g} | {rel:.2f} |")
    if not per_press and not beyond:
        return ""
    out += ["", "| press | points | press better (KL / ours < 1) | median KL / ours | range | beyond our reach |",
            "|---|---:|---:|---:|---|---:|"]
    for press in sorted(set(per_press) | set(beyond)):
        v = per_press.get(press, [])
        med = f"{np.median(v):.2f}" if v else "-"
        rng = f"{min(v):.2f}-{max(v):.2f}" if v else "-"
        out.append(f"| {press} | {len(v)} | {sum(x < 1 for x in v)} | {med} | {rng} | {beyond.get(press, 0)} |")
    nd = [r for r in rows if r["kind"] == "needle" and r["policy"] != "none"]
    keys = sorted({(r["target_ratio"], r["placement"], r["kv_dtype"]) for r in nd})
    if any(r["engine"] == "kvpress" for r in nd):
        out += ["", "| target | placement | our best (hits) | press | press hits | trials |", "|---:|---|---|---|---:|---:|"]
        for t, pl, dt in keys:
            sfx = "" if dt == "f16" else f"@{dt}"
            same = [r for r in nd if (r["target_ratio"], r["placement"], r["kv_dtype"]) == (t, pl, dt)]
            ours = [r for r in same if r["engine"] == "ours" and r["policy"] != "random"]
            best = max(ours, key=lambda r: r["needle_hits"]) if ours else None
            for p in sorted((r for r in same if r["engine"] == "kvpress"), key=lambda r: -r["needle_hits"]):
                ob = f"{best['policy']}{sfx} ({best['needle_hits']})" if best else "-"
                out.append(f"| {t:g} | {pl} | {ob} | {p['policy']}{sfx} | {p['needle_hits']} | {p['needle_trials']} |")
    return "\n".join(out)
