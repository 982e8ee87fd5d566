"""Fit eviction.policy predicted_kvzip's scorer for a model: kvzip's own scores on dev-split text, and a
linear map per layer from each token's hidden state to them (mnn_h2o/token_scorer.py).

For each calibration segment (the dev split's windows --fit-windows of every domain, the first
--tokens tokens of each) the engine prefills with the config's KV dtype and no eviction, keeping
every evicting layer's input hidden states, then runs kvzip's reconstruction pass
(eviction.reconstruction_softmax as configured) and reads every held token's peak
(``KvCache.token_scores``). A ridge regression per layer on the accumulated normal equations maps
the RMS-normalised hidden state (and a constant) to log(peak) of each kv head. The ridge weight is
chosen among --lambdas on the held-out window (--heldout-window, never fitted; also dev), by the
agreement that decides eviction: of the tokens kvzip's global selection keeps at 3.2x (the top
1/3.2 of every (layer, kv head, token) score), the share the prediction keeps too. That agreement
at 3.2x and 6x, the held-out R^2 of the log-scores, the per-layer fit and the wall time are written
into the file's meta and printed. The eval suite's frontier reads dev window 0 and the test split:
neither is fitted.

    python -m mnn_h2o.tools.fit_scorer [--model smollm2 | --export DIR] [--tokens 4096]
        [--fit-windows 2 3] [--heldout-window 1] [--lambdas 1e-4 1e-3 1e-2 1e-1] [--config h2o.yaml]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
import time

import numpy as np


def _collect(llm, prompt, lo: int, hi: int, keep_features: bool):
    """One segment: (features per layer [n, d] or None, log-targets per layer [n, k], the pass's
    seconds). Features are accumulated into the caller's normal equations when not kept."""
    from ..token_scorer import features, log_targets

    feats = {i: [] for i in range(lo, hi)}

    def record(i: int, h: np.ndarray) -> None:
        if lo <= i < hi:
            feats[i].append(features(h).astype(np.float16 if keep_features else np.float32))

    llm.reset()
    llm.hidden_observer = record
    try:
        for s in range(0, len(prompt), llm.prefill_chunk):
            llm._forward(prompt[s:s + llm.prefill_chunk], None, True, evict=False)
    finally:
        llm.hidden_observer = None
    t0 = time.perf_counter()
    llm._reconstruct()
    t_pass = time.perf_counter() - t0
    x = {i: np.concatenate(v, 0) for i, v in feats.items()}
    # Scores are read before any update consumes them; the first tokens (the sequence start and
    # kvpress's 4 sinks, which no chunk window scores) are in the sink floor: not fitted.
    y = {i: log_targets(llm.cache.token_scores(i)[:, :len(prompt)].T) for i in range(lo, hi)}
    llm.reset()
    skip = 4
    return {i: x[i][skip:] for i in x}, {i: y[i][skip:] for i in y}, t_pass


def _keep_overlap(pred: np.ndarray, true: np.ndarray, ratio: float) -> float:
    """Of the entries kvzip's global selection keeps at ``ratio`` (the top 1/ratio of its scores),
    the share the prediction's top 1/ratio keeps too."""
    k = max(1, int(round(len(true) / ratio)))
    top_true = np.argpartition(-true, k - 1)[:k]
    top_pred = np.argpartition(-pred, k - 1)[:k]
    return float(np.intersect1d(top_true, top_pred, assume_unique=True).size / k)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mnn_h2o.tools.fit_scorer", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--model", default=None, help="named model or GGUF path (default: the config's model.name)")
    src.add_argument("--export", help="an export folder (the scorer is written into it)")
    ap.add_argument("--config", default="h2o.yaml", help="settings: KV dtype, evicting layers, the pass's softmax "
                                                          "(default h2o.yaml)")
    ap.add_argument("--tokens", type=int, default=4096, help="tokens per calibration segment (default 4096: two "
                                                             "of the pass's 2048-token chunks)")
    ap.add_argument("--fit-windows", type=int, nargs="+", default=[2, 3],
                    help="dev windows fitted, every domain (default 2 3)")
    ap.add_argument("--heldout-window", type=int, default=1, help="dev window that chooses the ridge weight and "
                                                                  "measures the agreement (default 1)")
    ap.add_argument("--lambdas", type=float, nargs="+", default=[1e-4, 1e-3, 1e-2, 1e-1],
                    help="ridge weights tried (default 1e-4 1e-3 1e-2 1e-1)")
    ap.add_argument("--query-peaks", action="store_true",
                    help="record in the file that each prompt chunk's last eviction.observation_window queries add "
                         "their attention peaks to the predictions (KvCache.set_query_peaks): a per-model choice, "
                         "made on the dev split (Qwen2.5-Coder-1.5B: lower KL but a 1.23x slower prefill at 4096 tokens; "
                         "SmolLM2: higher KL; docs/notebook/predicted_window_peaks.md)")
    ap.add_argument("--ship", action="store_true",
                    help="also copy the file into the package (mnn_h2o/scorers/, keyed by the GGUF's digest), "
                         "where every export of the same GGUF finds it: how the named models' scorers ship")
    args = ap.parse_args(argv)

    from .. import config as config_mod
    from ..engine import Llm
    from ..eval import domains as D
    from ..export import ensure_exported
    from ..token_scorer import TokenScorer, scorer_path, shipped_path, solve_ridge

    overrides = {"eviction.policy": "kvzip", "eviction.enabled": True}
    if args.model:
        overrides["model.name"] = args.model
    cfg = config_mod.load(args.config, overrides)
    if not 0 < args.tokens <= D.WINDOW_TOKENS:
        raise SystemExit(f"--tokens must be in 1..{D.WINDOW_TOKENS}")
    windows = sorted(set(args.fit_windows))
    if args.heldout_window in windows or not all(0 <= w < D.SPLIT_WINDOWS for w in windows + [args.heldout_window]):
        raise SystemExit(f"--fit-windows and --heldout-window: distinct dev windows in 0..{D.SPLIT_WINDOWS - 1}")
    export_dir = args.export or ensure_exported(cfg["model"])
    llm = Llm(export_dir, cfg)
    c = llm.config
    lo, hi = llm._evicting_layers(cfg["eviction"])
    tok = llm.tokenizer
    d, k = c.hidden + 1, c.n_kv_heads
    gram = {i: np.zeros((d, d)) for i in range(lo, hi)}
    rhs = {i: np.zeros((d, k)) for i in range(lo, hi)}
    n_fit = 0
    t_start = time.perf_counter()
    fitted = []
    n_seg = len(D.DOMAINS) * len(windows)
    print(f"fit_scorer: {export_dir}: {n_seg} segments of {args.tokens} tokens (dev windows {windows}), "
          f"held out: dev window {args.heldout_window}; layers [{lo}, {hi})", flush=True)
    for dom in D.DOMAINS:
        segs = D.segments(tok, dom, "dev", args.tokens, 0, D.SPLIT_WINDOWS)
        for w in windows:
            t0 = time.perf_counter()
            x, y, t_pass = _collect(llm, list(segs[w].prompt), lo, hi, keep_features=False)
            for i in range(lo, hi):
                xi = x[i].astype(np.float64)
                gram[i] += xi.T @ xi
                rhs[i] += xi.T @ y[i]
            n_fit += len(x[lo])
            fitted.append({"domain": dom, "split": "dev", "window": w, "offset": segs[w].offset,
                           "tokens": args.tokens})
            print(f"  {dom} dev window {w}: {time.perf_counter() - t0:.1f} s (pass {t_pass:.1f} s)", flush=True)
    # Held out: kept as features, predicted with every lambda.
    held_x, held_y = {i: [] for i in range(lo, hi)}, {i: [] for i in range(lo, hi)}
    for dom in D.DOMAINS:
        seg = D.segments(tok, dom, "dev", args.tokens, 0, D.SPLIT_WINDOWS)[args.heldout_window]
        t0 = time.perf_counter()
        x, y, _ = _collect(llm, list(seg.prompt), lo, hi, keep_features=True)
        for i in range(lo, hi):
            held_x[i].append(x[i])
            held_y[i].append(y[i])
        print(f"  {dom} dev window {args.heldout_window} (held out): {time.perf_counter() - t0:.1f} s", flush=True)
    held_x = {i: np.concatenate(v, 0).astype(np.float32) for i, v in held_x.items()}
    held_y = {i: np.concatenate(v, 0) for i, v in held_y.items()}
    t_collect = time.perf_counter() - t_start

    def solve(lam: float) -> np.ndarray:
        w = np.zeros((c.n_layers, d, k), np.float32)
        for i in range(lo, hi):
            w[i] = solve_ridge(gram[i], rhs[i], n_fit, lam)
        return w

    true = np.concatenate([held_y[i].T.reshape(-1) for i in range(lo, hi)])
    results = []
    for lam in args.lambdas:
        w = solve(lam)
        pred = np.concatenate([(held_x[i] @ w[i]).T.reshape(-1) for i in range(lo, hi)])
        r2 = 1.0 - float(np.mean((pred - true) ** 2) / np.var(true))
        results.append({"lambda": lam, "heldout_r2": r2, "keep_overlap_3.2x": _keep_overlap(pred, true, 3.2),
                        "keep_overlap_6x": _keep_overlap(pred, true, 6.0), "weights": w})
        print(f"  lambda {lam:g}: held-out R^2 {r2:.3f}, kvzip's kept tokens also kept: "
              f"{results[-1]['keep_overlap_3.2x']:.3f} at 3.2x, {results[-1]['keep_overlap_6x']:.3f} at 6x", flush=True)
    best = max(results, key=lambda r: r["keep_overlap_3.2x"])
    w = best.pop("weights")
    per_layer = []
    for i in range(lo, hi):
        pred = held_x[i] @ w[i]
        per_layer.append(round(1.0 - float(np.mean((pred - held_y[i]) ** 2) / np.var(held_y[i])), 4))
    meta = {
        "source_sha256": llm.meta["source_sha256"], "n_layers": c.n_layers, "hidden": c.hidden, "n_kv_heads": k,
        "kv_dtype": cfg["runtime"]["kv_dtype"], "reconstruction_softmax": cfg["eviction"]["reconstruction_softmax"],
        "fitted": fitted, "fit_tokens": n_fit, "heldout": {"split": "dev", "window": args.heldout_window,
                                                          "tokens": int(held_y[lo].shape[0])},
        "lambda": best["lambda"], "heldout_r2": best["heldout_r2"],
        "keep_overlap_3.2x": best["keep_overlap_3.2x"], "keep_overlap_6x": best["keep_overlap_6x"],
        "heldout_r2_per_layer": per_layer,
        "lambdas_tried": [{kk: v for kk, v in r.items() if kk != "weights"} for r in results],
        "collect_s": round(t_collect, 1), "created": datetime.datetime.now().isoformat(timespec="seconds"),
        "query_peaks": args.query_peaks,
    }
    path = scorer_path(export_dir)
    TokenScorer(w, (lo, hi), meta).save(path)
    print(f"fit_scorer: lambda {best['lambda']:g} (held-out R^2 {best['heldout_r2']:.3f}; kvzip's kept tokens "
          f"also kept {best['keep_overlap_3.2x']:.3f} at 3.2x, {best['keep_overlap_6x']:.3f} at 6x); "
          f"{t_collect / 60:.1f} min; wrote {path}")
    if args.ship:
        os.makedirs(os.path.dirname(shipped_path(meta["source_sha256"])), exist_ok=True)
        shutil.copyfile(path, shipped_path(meta["source_sha256"]))
        print(f"fit_scorer: shipped as {shipped_path(meta['source_sha256'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
