"""The layers' head (one call a token) against the previous path (NativeTail in numpy + Q8Matrix on
its own pool), in one process: KL to the exact model (teacher-forced) and decode speed interleaved
token by token. The old path is rebuilt from the classes that still exist (forward_paths)."""
import os, sys, time, json
import numpy as np
from mnn_h2o import config
from mnn_h2o.engine import Llm
from mnn_h2o.forward_paths import NativeTokenLayers, TailThenHead, NativeTailRows, Q8Head
from mnn_h2o.native_tail import NativeTail
from mnn_h2o.essays import essay_tokens
from mnn_h2o.measure import log_softmax

MODEL = os.environ.get("AB_MODEL", "smollm2")
def load(kv="f16", evict=False):
    cfg = config.validate({"model": {"name": MODEL}, "runtime": {"kv_dtype": kv}, "eviction": {"enabled": evict}})
    return Llm.load(MODEL, cfg, progress=False)

def make_old(llm):
    meta, c, rt = llm.meta, llm.config, llm.cfg["runtime"]
    if llm._q8_head is None:  # a k-quant head: the layers' logits in a call of their own
        llm._token_path = NativeTokenLayers(llm._decode_layers, llm._inputs, False)
        return llm
    tail = NativeTail(os.path.join(llm.export_dir, meta["tail_blocks"]), c, rt["threads"])
    q8 = llm._q8_rows(meta["lm_head_q8"], threads=rt["threads"])
    llm._token_path = NativeTokenLayers(llm._decode_layers, llm._inputs, False)
    llm._head_path = TailThenHead(NativeTailRows(tail), Q8Head(q8))
    return llm

mode = sys.argv[1]
if mode == "kl":
    new, old = load(), make_old(load())
    ids = essay_tokens(new.tokenizer, 320)
    prompt, cont = ids[:192], ids[192:]
    out = {}
    for name, llm in (("new", new), ("old", old)):
        rows = [llm.prefill(prompt)] + [llm.decode(t) for t in cont[:-1]]
        out[name] = log_softmax(np.stack(rows).reshape(len(cont), -1).astype(np.float64))
        out[name + "_prompt"] = log_softmax(llm.logits(prompt).astype(np.float64))
    from mnn_h2o.reference import ReferenceModel
    from mnn_h2o.gguf_model import GgufModel
    ref = ReferenceModel(GgufModel(new.meta["source"]), np.float32)
    full = log_softmax(ref.forward(ids, all_logits=True).astype(np.float64))
    exact, exact_p = full[191:-1], full[:192]
    kl = lambda p, q: np.sum(np.exp(p) * (p - q), axis=-1)
    for name in ("new", "old"):
        print(f"{name}: decode KL to exact over {len(cont)} tokens mean {kl(exact, out[name]).mean():.3e} max {kl(exact, out[name]).max():.3e} "
              f"top1 {np.mean(out[name].argmax(-1) == exact.argmax(-1)):.3f}; prompt KL mean {kl(exact_p, out[name+'_prompt']).mean():.3e}")
    print(f"new vs old: decode KL mean {kl(out['old'], out['new']).mean():.3e}")
elif mode == "speed":
    ctx, steps, blocks = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    kv = sys.argv[5] if len(sys.argv) > 5 else "q8r"
    ev = len(sys.argv) > 6 and sys.argv[6] == "evict"
    engines = {"new": load(kv, ev), "old": make_old(load(kv, ev))}
    tok = engines["new"].tokenizer
    ids = essay_tokens(tok, ctx)
    last = {}
    for name, llm in engines.items():
        last[name] = int(np.argmax(llm.prefill(ids)))
    times = {n: [] for n in engines}
    order = list(engines)
    for b in range(blocks):
        for name in (order if b % 2 == 0 else order[::-1]):
            llm = engines[name]
            t0 = time.perf_counter()
            for _ in range(steps):
                last[name] = int(np.argmax(llm.decode(last[name])))
            times[name].append((time.perf_counter() - t0) / steps * 1e3)
            if llm.pos + steps + 1 >= llm.max_context:
                raise SystemExit("context full")
    r = np.array(times["old"]) / np.array(times["new"])
    print(f"context {ctx}: ms/token new {np.median(times['new']):.3f} old {np.median(times['old']):.3f}; "
          f"speedup new/old median {np.median(r):.3f} (blocks {blocks} x {steps} tokens; ratio range {r.min():.3f}-{r.max():.3f}, IQR {np.percentile(r,25):.3f}-{np.percentile(r,75):.3f})")
