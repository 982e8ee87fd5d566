"""Conversations within one KV budget: how many conversation tokens each config holds in it.

The budget is the bytes an f16 full cache holds at --budget-tokens tokens (default 2048): every
layer's K and V rows in whole blocks, as the cache's pool counts them. A conversation grows by
user turns of --turn-tokens essay tokens (the essays domain's first window of the split), each
answered with the fixed acknowledgement (Session.add, as conversation_recall does); turn 1 also
states the needle suite's three facts. After each turn the cache's own count of the bytes it
holds (Session.stats kv_bytes_held) is read; the conversation ends before the turn that would
take it over the budget, or past the context limit (room is kept for a question), or when the
text runs out. Then each fact is asked in a fork of the final conversation (greedy, scored as
the needle suite scores), which is what holding the conversation cost its recall.

Configs: ``f16`` (f16 rows, no eviction: it stops at the budget), ``q8`` (the config's q8 rows,
no eviction) and ``default`` (the config as it is, with eviction.kv_budget_bytes = the budget).
The bytes are cross-checked with the tokens held: the heads' held tokens (stats' tokens_held,
their mean) times the row bytes must come within one block per head of kv_bytes_held. The budget
holds between turns: while a turn is prefilled its rows are held too, and an evicting cache
evicts after the turn's last chunk (eviction.prefill_eviction end), so for that moment it holds up to
one turn's rows more.

    python -m mnn_h2o.tools.conversation_budget [--budget-tokens 2048] [--configs f16,q8,default] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import List, Sequence, Tuple

CONFIGS = ("f16", "q8", "default")
FACT_DEPTHS = (0.1, 0.5, 0.9)   # where turn 1 states the three facts
QUESTION_ROOM = 128             # tokens kept free for a question and its answer


def budget_bytes(llm, n_tokens: int) -> int:
    """The bytes of an f16 full cache of ``n_tokens``: whole blocks of rows rounded up to 64 bytes
    (docs/eviction.md "byte cap"), K and V, every layer and kv head."""
    from .. import native

    c, bt = llm.config, llm.cfg["runtime"]["block_tokens"]
    block = -(-bt * native.kv_row_bytes("f16", c.head_dim) // 64) * 64
    return 2 * c.n_layers * c.n_kv_heads * math.ceil(n_tokens / bt) * block


def config_for(base: dict, name: str, budget: int) -> dict:
    cfg = {k: dict(v) for k, v in base.items()}
    if name == "f16":
        cfg["runtime"]["kv_dtype"] = "f16"
        cfg["eviction"]["enabled"] = False
    elif name == "q8":
        cfg["runtime"]["kv_dtype"] = "q8"
        cfg["eviction"]["enabled"] = False
    elif name == "default":
        cfg["eviction"].update(enabled=True, kv_budget_bytes=budget, target_keep_ratio=0.0)
    else:
        raise ValueError(f"unknown config {name!r} (allowed: {', '.join(CONFIGS)})")
    return cfg


def facts(tokenizer, split: str, turn_tokens: int) -> Tuple[str, List[str], List[Tuple[str, str]]]:
    """Turn 1 (the three facts in essay text), the filler turns' texts, and (question, value) per fact."""
    import numpy as np

    from ..eval import needle
    from ..eval.domains import WINDOW_TOKENS, haystack
    from .conversation_recall import ASK, INTRO

    rng = np.random.default_rng(needle.SEED)
    hay = haystack(tokenizer, "essays", split, 0, WINDOW_TOKENS)
    first, parts, asked, at = hay[:turn_tokens], [INTRO], [], 0
    for nd, depth in zip(needle.NEEDLES, FACT_DEPTHS):
        value = nd.values[int(rng.integers(len(nd.values)))]
        cut = int(depth * len(first))
        parts += [tokenizer.decode(first[at:cut]), "\n\n" + nd.fact.format(v=value) + "\n\n"]
        asked.append((nd.question + ASK, value))
        at = cut
    parts.append(tokenizer.decode(first[at:]))
    fillers = [tokenizer.decode(hay[i:i + turn_tokens]) for i in range(turn_tokens, len(hay), turn_tokens)]
    return "".join(parts), fillers, asked


def row_bytes_held(llm, cfg: dict, tokens_held: int) -> int:
    """The bytes ``tokens_held`` tokens per (layer, kv head) take as rows of the config's type."""
    from .. import native

    c = llm.config
    return 2 * c.n_layers * c.n_kv_heads * tokens_held * native.kv_row_bytes(cfg["runtime"]["kv_dtype"], c.head_dim)


def grow(llm, cfg: dict, budget: int, first: str, fillers: Sequence[str], asked) -> dict:
    """The conversation this config holds within ``budget``, and its recall of the facts."""
    from ..engine import ContextOverflowError
    from ..eval.needle import is_hit
    from ..session import Session
    from .conversation_recall import ACK, MAX_NEW_TOKENS

    t0 = time.perf_counter()
    s = Session(llm, cfg)
    turns, stopped, history = 0, "text", []
    for text in [first, *fillers]:
        before = s.fork()
        try:
            s.add(s.messages + [{"role": "user", "content": text}, {"role": "assistant", "content": ACK}])
            st = s.stats()
            over = ("budget" if st["kv_bytes_held"] > budget else
                    "context" if st["tokens"] + QUESTION_ROOM > llm.max_context else None)
        except ContextOverflowError:
            over = "context"
        if over:
            s.close()
            s, stopped = before, over
            break
        before.close()
        turns += 1
        history.append({"tokens": st["tokens"], "kv_bytes_held": st["kv_bytes_held"]})
    if not turns:
        raise ValueError(f"not even the first turn fits in a budget of {budget} bytes")
    st = s.stats()
    # The cross-check: the rows the heads hold, at their mean held tokens, against the cache's
    # count of the bytes it holds; whole blocks and the rounded mean make them differ by less
    # than one block per (layer, kv head).
    c, bt = llm.config, cfg["runtime"]["block_tokens"]
    from_rows = row_bytes_held(llm, cfg, st["tokens_held"])
    slack = row_bytes_held(llm, cfg, bt) + 2 * c.n_layers * c.n_kv_heads * 64
    if not from_rows - slack <= st["kv_bytes_held"] <= from_rows + slack:
        raise AssertionError(f"the cache holds {st['kv_bytes_held']} bytes but its heads' rows take {from_rows}")
    answers = []
    for question, value in asked:
        with s.fork() as f:
            r = f.say(question, max_new_tokens=MAX_NEW_TOKENS)
        answers.append({"question": question, "value": value, "answer": r.text, "hit": is_hit(r.text, value)})
    s.close()
    return {"turns": turns, "stopped_by": stopped, "tokens": st["tokens"], "tokens_held": st["tokens_held"],
            "kv_bytes_held": st["kv_bytes_held"], "kv_bytes_from_rows": from_rows,
            "whole_model_ratio": st["whole_model_ratio"],
            "max_bytes_after_a_turn": max(h["kv_bytes_held"] for h in history),
            "history": history, "recall": answers, "recall_hits": sum(a["hit"] for a in answers),
            "seconds": round(time.perf_counter() - t0, 1)}


def table(budget: int, rows: Sequence[dict]) -> str:
    base = next((r["tokens"] for r in rows if r["config"] == "f16"), None)
    out = [f"Budget: {budget} bytes ({budget / 2**20:.2f} MiB).", "",
           "| config | conversation tokens held | x f16 full cache | turns | stopped by | KV MiB held | "
           "whole-model ratio | recall of 3 facts from turn 1 |",
           "|---|---:|---:|---:|---|---:|---:|---:|"]
    for r in rows:
        x = f"{r['tokens'] / base:.2f}" if base else "-"
        out.append(f"| {r['config']} | {r['tokens']} | {x} | {r['turns']} | {r['stopped_by']} | "
                   f"{r['kv_bytes_held'] / 2**20:.2f} | "
                   f"{r['whole_model_ratio']:.2f} | {r['recall_hits']} / {len(r['recall'])} |")
    return "\n".join(out)


def main(argv=None) -> int:
    from .. import config as config_mod
    from ..cli_errors import run

    ap = argparse.ArgumentParser(prog="python -m mnn_h2o.tools.conversation_budget",
                                 description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--budget-tokens", type=int, default=2048,
                    help="the budget: the bytes of an f16 full cache of this many tokens (default 2048)")
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated of {', '.join(CONFIGS)} "
                                                                 f"(default %(default)s)")
    ap.add_argument("--turn-tokens", type=int, default=256, help="essay tokens per user turn (default 256)")
    ap.add_argument("--split", choices=("test", "dev"), default="test", help="the essays window's split (default test)")
    ap.add_argument("--config", help="YAML config (default: the built-in defaults)")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override a config key")
    ap.add_argument("--json", help="also write the figures to this JSON file")
    args = ap.parse_args(argv)

    def body() -> int:
        from ..engine import Llm

        names = [x.strip() for x in args.configs.split(",") if x.strip()]
        for n in names:
            if n not in CONFIGS:
                raise ValueError(f"unknown config {n!r} (allowed: {', '.join(CONFIGS)})")
        if not names:
            raise ValueError("no configs given")
        if args.budget_tokens < 1 or args.turn_tokens < 16:
            raise ValueError("--budget-tokens must be >= 1 and --turn-tokens >= 16")
        cfg = config_mod.load(args.config, dict(config_mod.parse_assignment(a) for a in args.set))
        llm = Llm.load(None, cfg, progress=False)
        budget = budget_bytes(llm, args.budget_tokens)
        first, fillers, asked = facts(llm.tokenizer, args.split, args.turn_tokens)
        rows = []
        for n in names:
            r = dict(config=n, **grow(llm, config_for(cfg, n, budget), budget, first, fillers, asked))
            rows.append(r)
            print(f"{n}: {r['tokens']} tokens in {r['turns']} turns, {r['kv_bytes_held']} bytes, stopped by "
                  f"{r['stopped_by']}, recall {r['recall_hits']}/3 ({r['seconds']} s)", file=sys.stderr, flush=True)
        print(table(budget, rows))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"config": cfg, "budget_tokens": args.budget_tokens, "budget_bytes": budget,
                           "turn_tokens": args.turn_tokens, "rows": rows}, f, indent=1)
        return 0

    return run(body)


if __name__ == "__main__":
    sys.exit(main())
