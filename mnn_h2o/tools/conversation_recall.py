"""Multi-turn recall: the needle suite (mnn_h2o/eval/needle.py) in conversation form, each
question asked after the conversation that holds its fact was compressed.

The suite's 3 needles x 5 depths at one trial length (--length, default 3000, the suite's short
one) are told as 5 conversations, one per depth index d: its haystack is the suite's for the
first needle at depth d (window and domain), and turn 1, the first --turn-tokens of it, states
all three facts, needle n's at the suite's depth d + n (cyclically), with the value the suite
draws for that needle and depth. Then filler turns, each the next --turn-tokens of the haystack,
until the conversation holds about --length tokens. Every assistant turn is the fixed
acknowledgement ACK, fed with Session.add rather than generated: every setting sees the same
conversation, so the hits differ by the cache alone, and no decoding is spent on the history.
Each turn is its own prefill, so an evicting cache is evicted after every turn, before any
question exists. Then each needle's question is a new user turn in its own fork of the
conversation, answered greedily by Session.say and scored by the suite's is_hit: 15 trials per
setting, the prefill of a history shared by its three questions.

Settings: ``full`` (f16 rows, no eviction), ``default@R`` (the config's KV type and policy at
whole-model ratio R) and ``kvzip@R`` (policy kvzip with layer_budget global). An evicting setting
uses the frontier's eviction section (mnn_h2o/eval/quality.py eviction_section): it evicts at any length,
where the default's eviction.trigger_min_tokens would leave a conversation shorter than it uncompressed.
Prints a Markdown table: hits / trials, and at the questions (before one is fed) the history's
tokens, the KV bytes held and the measured whole-model ratio.

    python -m mnn_h2o.tools.conversation_recall [--settings full,default@3.2,default@6,kvzip@3.2]
        [--length 3000] [--split test] [--conversations N] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from typing import List, Optional, Sequence, Tuple

ACK = "Noted."
INTRO = "Remember the facts in this text; I will ask about them later.\n\n"
# "Answer in one short sentence." makes SmolLM2-135M answer with the fact's sentence; without it
# the chat answer often wanders off before the value.
ASK = " Answer in one short sentence."
MAX_NEW_TOKENS = 24


@dataclass(frozen=True)
class Probe:
    needle: str
    depth: float              # where turn 1 states the fact (relative)
    value: str
    question: str


@dataclass(frozen=True)
class Conversation:
    index: int                # the suite's depth index of its haystack
    domain: str
    turns: Tuple[str, ...]    # the user turns before a question; each is answered with ACK
    probes: Tuple[Probe, ...]


@dataclass(frozen=True)
class Setting:
    name: str
    kv_dtype: str
    policy: str               # "none" for the full cache
    target_ratio: Optional[float]


def _render_tokens(tokenizer, turns: Sequence[str], question: str) -> int:
    """Tokens of the conversation ``turns`` (each acknowledged) and a question, as prefilled."""
    msgs = []
    for t in turns:
        msgs += [{"role": "user", "content": t}, {"role": "assistant", "content": ACK}]
    msgs.append({"role": "user", "content": question})
    return len(tokenizer.encode(tokenizer.render_chat(msgs, add_generation_prompt=True)))


def conversations(tokenizer, split: str, length: int, turn_tokens: int) -> List[Conversation]:
    """The suite's trials of ``length`` as conversations of about that many tokens (see above)."""
    from ..eval import needle

    trials = {(t.needle, t.depth): t for t in needle.trials(tokenizer, split, lengths=(length,))}
    depths, needles = needle.DEPTHS, needle.NEEDLES
    out = []
    for d, depth in enumerate(depths):
        # The haystack: the first needle's trial at this depth, with its fact taken out (the trial's
        # context is hay[:at] + fact + hay[at:], needle.trials).
        t0 = trials[(needles[0].name, depth)]
        fact = tuple(tokenizer.encode("\n\n" + needles[0].fact.format(v=t0.value) + "\n\n"))
        at = int(depth * (len(t0.context) - len(fact)))
        if t0.context[at:at + len(fact)] != fact:
            raise AssertionError("needle.trials no longer places the fact at int(depth * haystack)")
        hay = t0.context[:at] + t0.context[at + len(fact):]
        first = hay[:turn_tokens]
        probes, placed = [], []
        for n, nd in enumerate(needles):
            fd = depths[(d + n) % len(depths)]
            value = trials[(nd.name, fd)].value
            probes.append(Probe(nd.name, fd, value, nd.question + ASK))
            placed.append((int(fd * len(first)), nd.fact.format(v=value)))
        text, prev = INTRO, 0
        for cut, fact_text in sorted(placed):
            text += tokenizer.decode(first[prev:cut]) + "\n\n" + fact_text + "\n\n"
            prev = cut
        turns = [text + tokenizer.decode(first[prev:])]
        used = len(first)
        longest = max(probes, key=lambda p: len(p.question)).question
        overhead = _render_tokens(tokenizer, turns + [""], longest) - _render_tokens(tokenizer, turns, longest)
        while used < len(hay):
            room = length - _render_tokens(tokenizer, turns, longest) - overhead
            if room < 16:
                break
            n_tok = min(turn_tokens, room)
            turns.append(tokenizer.decode(hay[used:used + n_tok]))
            used += n_tok
        out.append(Conversation(d, t0.domain, tuple(turns), tuple(probes)))
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
    """The session config of a setting: ``base`` with its KV type and eviction section replaced."""
    from ..eval.quality import eviction_section

    cfg = {k: dict(v) for k, v in base.items()}
    cfg["runtime"]["kv_dtype"] = s.kv_dtype
    if s.policy == "none":
        cfg["eviction"]["enabled"] = False
    else:
        cfg["eviction"] = eviction_section(base["eviction"], s.policy, s.target_ratio)
        if s.policy == "kvzip":
            cfg["eviction"]["layer_budget"] = "global"
    return cfg


def feed_history(session, turns: Sequence[str]) -> None:
    """Each user turn and its acknowledgement, one prefill (and eviction) per turn."""
    for t in turns:
        session.add(session.messages + [{"role": "user", "content": t}, {"role": "assistant", "content": ACK}])


def run_conversation(llm, cfg: dict, conv: Conversation, max_new_tokens: int = MAX_NEW_TOKENS) -> List[dict]:
    """One result per probe: the history fed once, each question in its own fork of it."""
    from ..eval.needle import is_hit
    from ..session import Session

    out = []
    with Session(llm, cfg) as s:
        t0 = time.perf_counter()
        feed_history(s, conv.turns)
        history_s = time.perf_counter() - t0
        at_question = s.stats()
        for p in conv.probes:
            with s.fork() as f:
                r = f.say(p.question, max_new_tokens=max_new_tokens)
            out.append({"needle": p.needle, "depth": p.depth, "value": p.value, "answer": r.text,
                        "hit": is_hit(r.text, p.value), "history_tokens": at_question["tokens"],
                        "kv_bytes_held": at_question["kv_bytes_held"], "kv_bytes_f16": at_question["kv_bytes_f16"],
                        "whole_model_ratio": at_question["whole_model_ratio"], "history_s": round(history_s, 2)})
    return out


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
    ap.add_argument("--length", type=int, default=3000,
                    help="conversation length in tokens, one of the suite's trial lengths (default 3000)")
    ap.add_argument("--split", choices=("test", "dev"), default="test", help="the suite's split (default test)")
    ap.add_argument("--turn-tokens", type=int, default=512, help="haystack tokens per user turn (default 512)")
    ap.add_argument("--conversations", type=int, default=0,
                    help="run only the first N of the 5 conversations, 3 trials each (0 = all)")
    ap.add_argument("--config", help="YAML config (default: the built-in defaults)")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override a config key")
    ap.add_argument("--json", help="write every trial and the table's rows to this JSON file (after each trial)")
    args = ap.parse_args(argv)

    def body() -> int:
        from ..engine import Llm

        if args.turn_tokens < 16:
            raise ValueError("--turn-tokens must be >= 16")
        if args.conversations < 0:
            raise ValueError("--conversations must be >= 0")
        cfg = config_mod.load(args.config, dict(config_mod.parse_assignment(a) for a in args.set))
        parse_settings(args.settings, "kvzip", "q8")  # a bad --settings fails before the model loads
        llm = Llm.load(None, cfg, progress=False)
        settings = parse_settings(args.settings, llm.policy_of(cfg["eviction"]), cfg["runtime"]["kv_dtype"])
        convs = conversations(llm.tokenizer, args.split, args.length, args.turn_tokens)
        if args.conversations:
            convs = convs[:args.conversations]
        runs: List[dict] = []
        # Conversations outer, settings inner: a run cut short compares every setting on the same trials.
        for conv in convs:
            for s in settings:
                rs = [dict(setting=s.name, conversation=conv.index, domain=conv.domain, turns=len(conv.turns) + 1, **r)
                      for r in run_conversation(llm, setting_config(cfg, s), conv)]
                runs += rs
                print(f"conversation {conv.index + 1}/{len(convs)} {s.name}: {rs[0]['history_tokens']} tokens, "
                      f"ratio {rs[0]['whole_model_ratio']:.2f}, history {rs[0]['history_s']} s: " +
                      "; ".join(f"{r['needle']} {'hit' if r['hit'] else 'miss'} {r['answer']!r}" for r in rs),
                      file=sys.stderr, flush=True)
                if args.json:
                    with open(args.json, "w") as f:
                        json.dump({"config": cfg, "split": args.split, "length": args.length,
                                   "turn_tokens": args.turn_tokens, "ack": ACK,
                                   "rows": aggregate(settings, runs), "runs": runs}, f, indent=1)
        print(table(aggregate(settings, runs)))
        return 0

    return run(body)


if __name__ == "__main__":
    sys.exit(main())
