"""Time to first token of a follow-up turn: a conversation that continues its cache (what the
server's prefix reuse does) against a cold prefill of the same history, interleaved A B / B A.

The history is one user turn holding an essay excerpt of about --history tokens and the model's
short answer; the follow-up is a question. "continued": a fork of the session that already
holds the history answers it (only the question is prefilled). "cold": a new session is given
the whole conversation (history and question are prefilled). Each run generates one token, so
its time is the prefill plus the first token's sampling. Prints medians with (min-max) per
history length, and the ratio continued / cold.

--first-turn measures a conversation's first turn instead (the same text and question as one
user message, a new session each run), three ways interleaved: "in turn" (the session compresses
before it answers, as Llm.generate does), "after answer" (compress_after_answer, the chat's and
the server's: the answer first, Session.compress after it, timed apart) and "no eviction"
(eviction.enabled false). With it go the KV bytes each holds once compressed and the ratios to no
eviction (docs/sessions.md "Compression after the answer").

    python -m mnn_h2o.tools.session_ttft [--history 2048,4096] [--repetitions 5] [--first-turn] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from ..cli_numbers import number_list

QUESTION = "In one sentence: what was the main point of the text I gave you?"


def _history(llm, n_tokens: int):
    from ..essays import essay_tokens
    from ..session import Session

    text = llm.tokenizer.decode(essay_tokens(llm.tokenizer, n_tokens))
    warm = Session(llm)
    warm.say("Read this text; I will ask about it.\n\n" + text, max_new_tokens=16)
    return warm


def measure(llm, n_tokens: int, repetitions: int) -> dict:
    from ..measure import interleave, summarize
    from ..session import Session

    warm = _history(llm, n_tokens)
    history = warm.messages
    follow = history + [{"role": "user", "content": QUESTION}]

    def continued():
        s = warm.fork()
        t0 = time.perf_counter()
        r = s.reply(follow, max_new_tokens=1)
        dt = time.perf_counter() - t0
        s.close()
        return {"s": dt, "prefilled": r.prompt_tokens}

    def cold():
        s = Session(llm)
        t0 = time.perf_counter()
        r = s.reply(follow, max_new_tokens=1)
        dt = time.perf_counter() - t0
        s.close()
        return {"s": dt, "prefilled": r.prompt_tokens}

    runs = interleave({"continued": continued, "cold": cold}, repetitions)
    out = {"history_tokens": len(warm.token_ids), "kv_bytes_held": warm.stats()["kv_bytes_held"]}
    for name, rs in runs.items():
        out[name] = {"ttft_s": summarize([r["s"] for r in rs]), "prefilled_tokens": rs[0]["prefilled"]}
    out["ratio"] = out["continued"]["ttft_s"]["median"] / out["cold"]["ttft_s"]["median"]
    warm.close()
    return out


def measure_first_turn(llm, cfg: dict, n_tokens: int, repetitions: int) -> dict:
    import copy

    from ..essays import essay_tokens
    from ..measure import interleave, summarize
    from ..session import Session

    text = llm.tokenizer.decode(essay_tokens(llm.tokenizer, n_tokens))
    messages = [{"role": "user", "content": "Read this text.\n\n" + text + "\n\n" + QUESTION}]
    plain = copy.deepcopy(cfg)
    plain["eviction"]["enabled"] = False

    def turn(c: dict, after: bool):
        def run():
            s = Session(llm, c, compress_after_answer=after)
            t0 = time.perf_counter()
            r = s.reply(messages, max_new_tokens=1)
            t1 = time.perf_counter()
            s.compress()
            t2 = time.perf_counter()
            st = s.stats()
            s.close()
            return {"s": t1 - t0, "compress_s": t2 - t1, "prefilled": r.prompt_tokens,
                    "kv_bytes_held": st["kv_bytes_held"], "whole_model_ratio": st["whole_model_ratio"]}
        return run

    runs = interleave({"in_turn": turn(cfg, False), "after_answer": turn(cfg, True),
                       "no_eviction": turn(plain, False)}, repetitions)
    out = {"prompt_tokens": runs["in_turn"][0]["prefilled"], "policy": llm.policy_of(cfg["eviction"])}
    for name, rs in runs.items():
        out[name] = {"ttft_s": summarize([r["s"] for r in rs]), "compress_s": summarize([r["compress_s"] for r in rs]),
                     "kv_bytes_held": rs[-1]["kv_bytes_held"], "whole_model_ratio": rs[-1]["whole_model_ratio"]}
    base = out["no_eviction"]["ttft_s"]["median"]
    out["in_turn_over_no_eviction"] = out["in_turn"]["ttft_s"]["median"] / base
    out["after_answer_over_no_eviction"] = out["after_answer"]["ttft_s"]["median"] / base
    return out


def _span(x: dict, fmt: str = ".2f") -> str:
    return f"{x['median']:{fmt}} ({x['min']:{fmt}}-{x['max']:{fmt}})"


_FOLLOW_UP_HEADER = ("| history tokens | continued: prefilled, TTFT s median (min-max) | cold: prefilled, TTFT s | "
                     "continued / cold |\n|---:|---|---|---:|")
_FIRST_TURN_HEADER = ("| prompt tokens | policy | TTFT s: in turn | after answer (then compress s) | no eviction | "
                      "in turn / none | after answer / none | KV MiB held: in turn / after answer / none |\n"
                      "|---:|---|---|---|---|---:|---:|---|")


def _follow_up_row(r: dict) -> str:
    c, k = r["continued"], r["cold"]
    return (f"| {r['history_tokens']} | {c['prefilled_tokens']}, {_span(c['ttft_s'], '.3f')} | "
            f"{k['prefilled_tokens']}, {_span(k['ttft_s'], '.3f')} | {r['ratio']:.3f} |")


def _first_turn_row(r: dict) -> str:
    a, b, c = r["in_turn"], r["after_answer"], r["no_eviction"]
    mib = "/".join(f"{x['kv_bytes_held'] / 2**20:.1f}" for x in (a, b, c))
    return (f"| {r['prompt_tokens']} | {r['policy']} | {_span(a['ttft_s'])} | {_span(b['ttft_s'])} "
            f"({_span(b['compress_s'])}) | {_span(c['ttft_s'])} | {r['in_turn_over_no_eviction']:.2f}x | "
            f"{r['after_answer_over_no_eviction']:.2f}x | {mib} |")


def main(argv=None) -> int:
    from .. import config as config_mod
    from ..cli_errors import run

    ap = argparse.ArgumentParser(prog="python -m mnn_h2o.tools.session_ttft", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--history", type=number_list(int, 64), default=[2048, 4096],
                    help="history lengths in tokens (default 2048,4096)")
    ap.add_argument("--repetitions", type=int, default=5, help="interleaved rounds (default 5, minimum 3)")
    ap.add_argument("--config", help="YAML config (default: the built-in defaults)")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override a config key")
    ap.add_argument("--first-turn", action="store_true",
                    help="a first turn: compression in the turn, after the answer, or none (see above)")
    ap.add_argument("--json", help="also write the figures to this JSON file")
    args = ap.parse_args(argv)

    def body() -> int:
        from ..engine import Llm
        from ..export import ensure_exported

        if args.repetitions < 3:
            raise ValueError("--repetitions must be >= 3")
        cfg = config_mod.load(args.config, dict(config_mod.parse_assignment(a) for a in args.set))
        llm = Llm(ensure_exported(cfg["model"]), cfg)
        reps = args.repetitions
        if args.first_turn:
            header, row, key = _FIRST_TURN_HEADER, _first_turn_row, "first_turn"
            figures = lambda n: measure_first_turn(llm, cfg, n, reps)  # noqa: E731
        else:
            header, row, key = _FOLLOW_UP_HEADER, _follow_up_row, "rows"
            figures = lambda n: measure(llm, n, reps)  # noqa: E731
        print(header)
        rows = []
        for n in args.history:
            rows.append(figures(n))
            print(row(rows[-1]), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"config": cfg, key: rows}, f, indent=1)
        return 0

    return run(body)


if __name__ == "__main__":
    sys.exit(main())
