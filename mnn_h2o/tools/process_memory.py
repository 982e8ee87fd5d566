"""Whole-process memory of one engine after a prompt: the RSS (and its peak) of this process after
loading the model, after a prompt of --context essay tokens and --decode tokens, with the KV bytes
our cache holds; ``--engine llama`` measures llama.cpp (llama-cpp-python, the `llama` extra) on
the same GGUF file instead (q8_0 K/V with flash attention unless --llama-kv f16). One engine per
process, so neither's pages count against the other: run it once per engine.

    python -m mnn_h2o.tools.process_memory [--model qwen2.5-1.5b] [--context 2048] [--decode 8]
        [--engine ours|llama] [--llama-kv q8_0|f16] [--set SECTION.KEY=VALUE]
"""
from __future__ import annotations

import argparse
import json
import sys


def _rss_mb() -> dict:
    """This process's RSS, its peak, and the anonymous and file-backed parts, in MB (Linux)."""
    with open("/proc/self/status") as f:
        d = dict(line.split(":", 1) for line in f if ":" in line)
    return {k: int(d[v].split()[0]) * 1024 / 1e6 for k, v in
            (("rss", "VmRSS"), ("peak", "VmHWM"), ("anon", "RssAnon"), ("file", "RssFile"))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mnn_h2o.tools.process_memory", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-1.5b", help="named model or GGUF path (default qwen2.5-1.5b)")
    ap.add_argument("--context", type=int, default=2048, help="prompt tokens of essay text (default 2048)")
    ap.add_argument("--decode", type=int, default=8, help="decode tokens after the prompt (default 8)")
    ap.add_argument("--engine", choices=("ours", "llama"), default="ours", help="which engine this process runs")
    ap.add_argument("--llama-kv", choices=("q8_0", "f16"), default="q8_0", help="llama.cpp's K/V type (default q8_0)")
    ap.add_argument("--config", default="h2o.yaml", help="our settings (default h2o.yaml)")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override a setting")
    args = ap.parse_args(argv)
    if args.context < 1 or args.decode < 0:
        ap.error("--context must be >= 1 and --decode >= 0")

    from ..cli_errors import run

    def body() -> int:
        from ..essays import essay_tokens

        out = {"engine": args.engine, "model": args.model, "context": args.context, "decode": args.decode}
        if args.engine == "ours":
            from .. import config as config_mod
            from ..engine import Llm

            cfg = config_mod.load(args.config, dict(config_mod.parse_assignment(a) for a in args.set))
            cfg["model"]["name"] = args.model
            llm = Llm.load(args.model, cfg, progress=False)
            out["policy"] = llm.eviction["policy"] if llm.eviction else "none"  # auto as it resolved on this model
            out["after_load"] = _rss_mb()
            if llm._decode_layers is not None:
                out["decode_layers_mb"] = llm._decode_layers.bytes / 1e6
            ids = essay_tokens(llm.tokenizer, args.context + args.decode)
            llm.prefill(ids[:args.context], reserve=args.decode)
            for t in ids[args.context:]:
                llm.decode(t)
            st = llm.stats
            out["kv_held_mib"] = st.kv_bytes_held / 2**20
            out["kv_peak_mib"] = st.kv_bytes_peak / 2**20
            out["kv_uncompressed_mib"] = st.kv_bytes_uncompressed / 2**20
        else:
            from ..bench.llama_peer import LlamaPeer, check, preflight
            from ..gguf_model import GgufModel
            from ..model_source import resolve_gguf
            from ..tokenizer import load_tokenizer

            path = resolve_gguf(args.model)
            ids = essay_tokens(load_tokenizer(GgufModel(path)), args.context + args.decode)
            # the bench's peer: a sliding-window model gets llama.cpp's SWA cache
            config = (args.llama_kv == "q8_0", args.llama_kv, args.llama_kv)
            check()
            preflight(path, 2, [config])  # a build that crashes (AMX kernels) is an error with its fix
            m = LlamaPeer(path, (len(ids) + 255) // 256 * 256, 2, *config)
            out["after_load"] = _rss_mb()
            m.prefill(ids[:args.context])
            for t in ids[args.context:]:
                m.decode(t)
            out["llama_kv"] = args.llama_kv
            out["kv_mib"] = m.kv_buffer_bytes / 2**20  # allocated whole at load, checked against its log
        out["after_prompt"] = _rss_mb()
        json.dump(out, sys.stdout, indent=1)
        print()
        return 0

    return run(body)


if __name__ == "__main__":
    sys.exit(main())
