"""What our cache's structure costs KVzip: kvpress's own KVzip scores, cut four ways.

``python -m mnn_h2o.eval kvzip-structure --split dev --ratio 3.2 --json F``

On each segment the kvpress peer (float engine, llama.cpp q8_0 KV) runs KVzip's reconstruction
once, then the same scores select the kept entries four ways, all at the same whole-model
ratio and under kvpress's one budget over every layer and head:

- ``token``: kvpress's own cut (per token, 4 sink tokens kept);
- ``token_floors``: per token, plus our floors (the first ``eviction.sink_tokens`` and the last
  ``eviction.recent_tokens`` of the prompt always kept);
- ``block``: each score replaced by the largest in its ``runtime.block_tokens`` block, so whole
  blocks are kept or dropped as our cache does;
- ``block_floors``: both.

Each cut's teacher-forced KL against the peer's own full f16 cache, beside ``none@q8`` (the
element type alone). The difference between ``token`` and ``block_floors`` is what our cache's
structure costs KVzip's scores, apart from our engine's int8 activations and our scoring pass.
Deterministic: it can run on a busy machine (~10 min per segment there).
"""
from __future__ import annotations

import json
from typing import Dict, List, Sequence

CUTS = ("token", "token_floors", "block", "block_floors")


def cut_scores(scores, cut: str, prompt_len: int, block: int, sink: int, recent: int):
    """KVzip's scores [layers, batch, kv heads, tokens] as ``cut`` would rank them."""
    import torch

    s = scores.clone()
    if cut.startswith("block"):
        n_layers, batch, heads, t = s.shape
        pad = (-t) % block
        padded = torch.nn.functional.pad(s, (0, pad), value=float("-inf"))
        peaks = padded.reshape(n_layers, batch, heads, -1, block).amax(-1, keepdim=True)
        s = peaks.expand(-1, -1, -1, -1, block).reshape(n_layers, batch, heads, -1)[..., :t].contiguous()
    if cut.endswith("floors"):
        top = s.amax() + 2.0  # above kvpress's own sink score (max + 1)
        s[..., :sink] = top
        s[..., max(0, prompt_len - recent):] = top
    return s


def run(cfg: dict, split: str, domains: Sequence[str], ratio: float, prompt_len: int, continuation: int,
        segments: int, progress=None) -> List[Dict[str, object]]:
    import torch

    from ..model_source import resolve_gguf
    from . import domains as D
    from . import kvpress_peer as KP
    from .quality import metrics

    # The peer reads the GGUF's own tokenizer: nothing of our engine is needed here.
    peer = KP.KvpressPeer(resolve_gguf(cfg["model"]["name"]), threads=cfg["runtime"]["threads"])
    tok = peer.tokenizer
    block, eviction = cfg["runtime"]["block_tokens"], cfg["eviction"]
    captured = {}
    real = KP.kvzip_masks

    def capture(model, scores, cr):
        captured["scores"] = scores.clone()
        return real(model, scores, cr)

    rows = []
    KP.kvzip_masks = capture
    try:
        for dom in domains:
            for seg in D.segments(tok, dom, split, prompt_len, continuation, segments):
                prompt, cont = list(seg.prompt), list(seg.continuation)
                grid = dict(grid_methods=(("kvzip", "q8"),), grid_ratios=(ratio,))
                full = peer.teacher_forced(prompt, cont, None, 1.0, kv_dtype="f16", **grid)
                floor = peer.teacher_forced(prompt, cont, None, 1.0, kv_dtype="q8", **grid)
                kept = peer.teacher_forced(prompt, cont, "kvzip", ratio, kv_dtype="q8", **grid)
                cr = KP.press_ratio(ratio, "q8", len(prompt), len(cont))
                row = {"domain": dom, "segment": seg.index, "ratio": kept["ratio"],
                       "none@q8": metrics(full["logp"], floor["logp"], cont)["kl"], "kl": {}}
                for cut in CUTS:
                    s = cut_scores(captured["scores"], cut, len(prompt), block, eviction["sink_tokens"],
                                   eviction["recent_tokens"])
                    masks = real(peer.model, s, cr)
                    layers = [(k, v, m) for (k, v, _), m in zip(peer._caches[None], masks)]
                    logits, _, _ = peer._run(layers, len(prompt), cont[:-1], "q8")
                    logits = torch.cat([peer._last_logits["sdpa"][None], logits])
                    logp = torch.log_softmax(logits.float(), dim=-1).numpy()
                    row["kl"][cut] = metrics(full["logp"], logp, cont)["kl"]
                rows.append(row)
                if progress:
                    progress(row)
    finally:
        KP.kvzip_masks = real
    return rows


def table(rows: Sequence[dict]) -> str:
    out = ["| domain | segment | ratio | none@q8 | " + " | ".join(CUTS) + " | block_floors / token |",
           "|---|---:|---:|---:|" + "---:|" * (len(CUTS) + 1)]
    for r in rows:
        kl = r["kl"]
        out.append(f"| {r['domain']} | {r['segment']} | {r['ratio']:.2f} | {r['none@q8']:.4g} | "
                   + " | ".join(f"{kl[c]:.4g}" for c in CUTS) + f" | {kl['block_floors'] / kl['token']:.2f} |")
    return "\n".join(out)


def write(rows: Sequence[dict], path: str, meta: dict) -> None:
    with open(path, "w") as f:
        json.dump({"meta": meta, "rows": list(rows)}, f, indent=1)
    with open(path.rsplit(".json", 1)[0] + ".md", "w") as f:
        f.write(table(rows) + "\n")


def sweep(args, config_mod) -> int:
    from tqdm import tqdm

    from . import kvpress_peer as KP

    KP.check()
    cfg = config_mod.load(args.config, {})
    doms = [d for d in args.domains.split(",") if d]
    bar = tqdm(total=len(doms) * args.segments, desc="kvzip-structure", unit="segment")
    rows: List[dict] = []
    meta = {"split": args.split, "ratio": args.ratio, "prompt_tokens": args.prompt_len,
            "continuation": args.continuation, "block_tokens": cfg["runtime"]["block_tokens"],
            "sink_tokens": cfg["eviction"]["sink_tokens"], "recent_tokens": cfg["eviction"]["recent_tokens"]}

    def done(row):
        rows.append(row)
        write(rows, args.json, meta)  # after every segment: nothing lost to an interruption
        bar.update(1)

    run(cfg, args.split, doms, args.ratio, args.prompt_len, args.continuation, args.segments, done)
    bar.close()
    print(table(rows))
    print(f"wrote {args.json}")
    return 0
