"""Multi-turn recall: the needle suite (mnn_h2o/eval/needle.py) in conversation form, each
question asked after the conversation that holds its fact was compressed.

A trial is one of the suite's trials (needle, depth, haystack, value; its test or dev split)
told as a conversation. Turn 1: the user gives the first --turn-tokens of the trial's haystack
with the needle's fact placed at the trial's depth in it. Then filler turns, each the next
--turn-tokens of the same haystack, until the conversation holds about --length tokens. Every
assistant turn is the fixed acknowledgement ACK, fed with Session.add rather than generated: every
setting then sees the same conversation, so the hits differ by the cache alone, and no decoding is
spent on the history. Each turn is its own prefill, so an evicting cache is evicted after every
turn, before the question exists. Then the question is a new user turn, answered greedily by
Session.say and scored by the suite's is_hit.

Settings: ``full`` (f16 rows, no eviction), ``default@R`` (the config's KV type and policy at
whole-model ratio R) and ``kvzip@R`` (policy kvzip with layer_budget global). An evicting setting
uses the frontier's h2o section (mnn_h2o/eval/quality.py h2o_section): it evicts at any length,
where the default's h2o.trigger_min_tokens would leave a conversation shorter than it uncompressed.
Prints a Markdown table: hits / trials, and at the question (before it is fed) the history's
tokens, the KV bytes held and the measured whole-model ratio.

    python -m mnn_h2o.tools.conversation_recall [--settings full,default@3.2,default@6,kvzip@3.2]
        [--lengths 3000,7000] [--split test] [--limit N] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from typing import List, Optional, Sequence, Tuple

from ..cli_numbers import number_list

ACK = "Noted."
INTRO = "Remember the facts in this text; I will ask about them later.\n\n"
# "Answer in one short sentence." makes SmolLM2-135M answer with the fact's sentence; without it
# the chat answer often wanders off before the value.
ASK = " Answer in one short sentence."
MAX_NEW_TOKENS = 24


@dataclass(frozen=True)
class Conversation:
    needle: str
    depth: float
    length: int               # the suite's trial length this conversation is sized to (tokens)
    domain: str
    value: str
    turns: Tuple[str, ...]    # the user turns before the question; each is answered with ACK
    question: str


@dataclass(frozen=True)
class Setting:
    name: str
    kv_dtype: str
    policy: str               # "none" for the full cache
    target_ratio: Optional[float]


def _render_tokens(tokenizer, turns: Sequence[str], question: str) -> int:
    """Tokens of the conversation ``turns`` (each acknowledged) and the question, as prefilled."""
    msgs = []
    for t in turns:
        msgs += [{"role": "user", "content": t}, {"role": "assistant", "content": ACK}]
    msgs.append({"role": "user", "content": question})
    return len(tokenizer.encode(tokenizer.render_chat(msgs, add_generation_prompt=True)))


def conversations(tokenizer, split: str, lengths: Sequence[int], turn_tokens: int) -> List[Conversation]:
    """The suite's trials of ``lengths`` as conversations of about that many tokens."""
    from ..eval import needle

    by_name = {n.name: n for n in needle.NEEDLES}
    out = []
    for trial in needle.trials(tokenizer, split, lengths=lengths):
        nd = by_name[trial.needle]
        fact_text = nd.fact.format(v=trial.value)
        fact = tuple(tokenizer.encode("\n\n" + fact_text + "\n\n"))
        # The trial's context is hay[:at] + fact + hay[at:] (needle.trials): take the fact out.
        at = int(trial.depth * (len(trial.context) - len(fact)))
        if trial.context[at:at + len(fact)] != fact:
            raise AssertionError(f"needle.trials no longer places the fact at int(depth * haystack): {trial.needle}")
        hay = trial.context[:at] + trial.context[at + len(fact):]
        first = hay[:turn_tokens]
        cut = int(trial.depth * len(first))
        turns = [INTRO + tokenizer.decode(first[:cut]) + "\n\n" + fact_text + "\n\n" + tokenizer.decode(first[cut:])]
        question = nd.question + ASK
        used = len(first)
        overhead = _render_tokens(tokenizer, turns + [""], question) - _render_tokens(tokenizer, turns, question)
        while True:
            room = trial.length - _render_tokens(tokenizer, turns, question) - overhead
            if room < 16 or used >= len(hay):
                break
            n = min(turn_tokens, room)
            turns.append(tokenizer.decode(hay[used:used + n]))
            used += n
        out.append(Conversation(trial.needle, trial.depth, trial.length, trial.domain, trial.value,
                                tuple(turns), question))
    return out


def parse_settings(spec: str, base_policy: str, base_dtype: str) -> List[Setting]:
    """``full``, ``default@R``, ``kvzip@R`` (comma-separated)."""
    out = []
    for item in (x.strip() for x in spec.split(",") if x.strip()):
        name, _, ratio = item.partition("@")
        if name == "full" and not ratio:
            out.append(Setting(item, "f16", "none", None))
            continue
        if name not in ("default", "kvzip") or not ratio:
            raise ValueError(f"unknown setting {item!r} (allowed: full, default@RATIO, kvzip@RATIO)")
        try:
            r = float(ratio)
        except ValueError:
            raise ValueError(f"{item}: the ratio must be a number, got {ratio!r}") from None
        if r <= 1:
            raise ValueError(f"{item}: the whole-model ratio must be > 1")
        out.append(Setting(item, base_dtype, base_policy if name == "default" else "kvzip", r))
    if not out:
        raise ValueError("no settings given")
    return out


def setting_config(base: dict, s: Setting) -> dict:
    """The session config of a setting: ``base`` with its KV type and h2o section replaced."""
    from ..eval.quality import h2o_section

    cfg = {k: dict(v) for k, v in base.items()}
    cfg["runtime"]["kv_dtype"] = s.kv_dtype
    if s.policy == "none":
        cfg["h2o"]["enabled"] = False
    else:
        cfg["h2o"] = h2o_section(base["h2o"], s.policy, s.target_ratio)
        if s.policy == "kvzip":
            cfg["h2o"]["layer_budget"] = "global"
    return cfg


def feed_history(session, turns: Sequence[str]) -> None:
    """Each user turn and its acknowledgement, one prefill (and eviction) per turn."""
    for t in turns:
        session.add(session.messages + [{"role": "user", "content": t}, {"role": "assistant", "content": ACK}])


def run_trial(llm, cfg: dict, conv: Conversation, max_new_tokens: int = MAX_NEW_TOKENS) -> dict:
    from ..eval.needle import is_hit
    from ..session import Session

    t0 = time.perf_counter()
    with Session(llm, cfg) as s:
        feed_history(s, conv.turns)
        at_question = s.stats()
        r = s.say(conv.question, max_new_tokens=max_new_tokens)
    return {"answer": r.text, "hit": is_hit(r.text, conv.value), "history_tokens": at_question["tokens"],
            "kv_bytes_held": at_question["kv_bytes_held"], "kv_bytes_f16": at_question["kv_bytes_f16"],
            "whole_model_ratio": at_question["whole_model_ratio"], "seconds": round(time.perf_counter() - t0, 2)}


def aggregate(settings: Sequence[Setting], runs: Sequence[dict]) -> List[dict]:
    rows = []
    for s in settings:
        rs = [r for r in runs if r["setting"] == s.name]
        if not rs:
            continue
        n = len(rs)
        rows.append(dict(asdict(s), hits=sum(r["hit"] for r in rs), trials=n,
                         history_tokens=round(sum(r["history_tokens"] for r in rs) / n),
                         kv_bytes_held=round(sum(r["kv_bytes_held"] for r in rs) / n),
                         whole_model_ratio=sum(r["whole_model_ratio"] for r in rs) / n))
    return rows


def table(rows: Sequence[dict]) -> str:
    out = ["| setting | KV type | policy | target | hits / trials | history tokens | KV MiB held at the question | "
           "whole-model ratio |", "|---|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        target = "-" if r["target_ratio"] is None else f"{r['target_ratio']:g}"
        out.append(f"| {r['name']} | {r['kv_dtype']} | {r['policy']} | {target} | {r['hits']} / {r['trials']} | "
                   f"{r['history_tokens']} | {r['kv_bytes_held'] / 2**20:.2f} | {r['whole_model_ratio']:.2f} |")
    return "\n".join(out)


def main(argv=None) -> int:
    from .. import config as config_mod
    from ..cli_errors import run

    ap = argparse.ArgumentParser(prog="python -m mnn_h2o.tools.conversation_recall",
                                 description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--settings", default="full,default@3.2,default@6,kvzip@3.2",
                    help="comma-separated: full, default@RATIO, kvzip@RATIO (default %(default)s)")
    ap.add_argument("--lengths", type=number_list(int, 256), default=[3000, 7000],
                    help="conversation lengths in tokens, the suite's trial lengths (default 3000,7000: "
                         "3 needles x 5 depths x 2 = 30 trials)")
    ap.add_argument("--split", choices=("test", "dev"), default="test", help="the suite's split (default test)")
    ap.add_argument("--turn-tokens", type=int, default=512, help="haystack tokens per user turn (default 512)")
    ap.add_argument("--limit", type=int, default=0, help="run only the first N trials (0 = all)")
    ap.add_argument("--config", help="YAML config (default: the built-in defaults)")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override a config key")
    ap.add_argument("--json", help="write every trial and the table's rows to this JSON file (after each trial)")
    args = ap.parse_args(argv)

    def body() -> int:
        from ..engine import Llm

        if args.turn_tokens < 16:
            raise ValueError("--turn-tokens must be >= 16")
        if args.limit < 0:
            raise ValueError("--limit must be >= 0")
        cfg = config_mod.load(args.config, dict(config_mod.parse_assignment(a) for a in args.set))
        settings = parse_settings(args.settings, cfg["h2o"]["policy"], cfg["runtime"]["kv_dtype"])
        llm = Llm.load(None, cfg, progress=False)
        convs = conversations(llm.tokenizer, args.split, args.lengths, args.turn_tokens)
        if args.limit:
            convs = convs[:args.limit]
        runs: List[dict] = []
        # Trials outer, settings inner: a run cut short compares every setting on the same trials.
        for i, conv in enumerate(convs):
            for s in settings:
                r = dict(setting=s.name, needle=conv.needle, depth=conv.depth, length=conv.length,
                         domain=conv.domain, value=conv.value, turns=len(conv.turns) + 1,
                         **run_trial(llm, setting_config(cfg, s), conv))
                runs.append(r)
                print(f"[{i + 1}/{len(convs)}] {s.name}: {conv.needle} depth {conv.depth} {conv.length} tokens: "
                      f"{'hit' if r['hit'] else 'miss'} {r['answer']!r} ({r['seconds']} s)", file=sys.stderr, flush=True)
                if args.json:
                    with open(args.json, "w") as f:
                        json.dump({"config": cfg, "split": args.split, "turn_tokens": args.turn_tokens, "ack": ACK,
                                   "rows": aggregate(settings, runs), "runs": runs}, f, indent=1)
        print(table(aggregate(settings, runs)))
        return 0

    return run(body)


if __name__ == "__main__":
    sys.exit(main())
