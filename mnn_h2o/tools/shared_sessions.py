"""Sessions shared by replicas, measured: two servers behind nginx on one Redis session store
(python -m mnn_h2o.serve.replicas), and one server alone on the memory store, all started here on
loopback with the same config (default: the built-in one, SmolLM2).

bytes        per history length: a conversation's value in Redis against what a store of plain f16
             KV would hold for it (every token fed, all layers, K and V at 2 bytes each, plus the
             same META): LMCache's store without its CacheGen compression.
ttft         per history length: time to first token of a follow-up served by the other replica,
             which loads the conversation from Redis ("store"), against the same request to the
             server alone, which holds nothing of it and prefills it ("re-prefill"); interleaved
             A B / B A over --repetitions conversations of their own; medians and spread.
concurrent   --conversations conversations of --turns turns at once through nginx, bounded by
             --deadline; every answer (greedy) compared with the same requests to the server alone.

    python -m mnn_h2o.tools.shared_sessions [--history 2048,8192] [--repetitions 3]
        [--conversations 16] [--turns 4] [--parts bytes,ttft,concurrent] [--json FILE]

The tests (tests/test_serve_replicas.py) talk to the servers through ``ask`` and ``settle``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from typing import List, Optional

from ..cli_numbers import number_list

QUESTION = "In one sentence: what was the main point of the text I gave you?"
REQUEST_TIMEOUT_S = 3600  # an 8K-token prefill on a busy machine
# Room a history of N tokens leaves in its opening message for the chat template, the first
# answer and the follow-up question, so that N = the model's context (8192) still fits.
ROOM_TOKENS = 96
SETTLE_TIMEOUT_S = 3600   # a kvzip pass over 8K tokens, then the write


@dataclass
class Answer:
    text: str
    finish_reason: str
    usage: dict
    replica: str             # nginx's X-Replica (the server that answered), or the URL asked
    ttft_s: float            # request sent -> first piece of text
    total_s: float
    message: dict = field(init=False)

    def __post_init__(self):
        self.message = {"role": "assistant", "content": self.text}


def ask(url: str, messages: List[dict], max_tokens: int, timeout: float = REQUEST_TIMEOUT_S) -> Answer:
    """A greedy chat turn, streamed, timed to its first piece of text."""
    body = json.dumps({"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    ttft, pieces, finish, usage = None, [], None, None
    with urllib.request.urlopen(req, timeout=timeout) as r:
        replica = r.headers.get("X-Replica") or url
        for line in r:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"{replica}: {chunk['error']}")
            for c in chunk.get("choices") or ():
                piece = c["delta"].get("content") or ""
                if piece and ttft is None:
                    ttft = time.perf_counter() - t0
                pieces.append(piece)
                finish = c.get("finish_reason") or finish
            usage = chunk.get("usage") or usage
    total = time.perf_counter() - t0
    return Answer("".join(pieces), finish, usage, replica, total if ttft is None else ttft, total)


def health(url: str) -> dict:
    with urllib.request.urlopen(url + "/health", timeout=30) as r:
        return json.load(r)


def settle(urls: List[str], timeout: float = SETTLE_TIMEOUT_S) -> List[dict]:
    """Waits until each server has run the compression its answers left and written their turns
    to its store; their /health."""
    deadline = time.monotonic() + timeout
    while True:
        hs = [health(u) for u in urls]
        if all(h["sessions_compression_held"] == 0 and h["store"]["writes_pending"] == 0 for h in hs):
            return hs
        if time.monotonic() > deadline:
            raise TimeoutError(f"the servers did not settle within {timeout:g} s: {hs}")
        time.sleep(0.2)


def stored_value(redis_url: str, messages: List[dict]) -> bytes:
    """The value in Redis of the session that holds exactly ``messages``."""
    import redis

    from .. import session_file
    from ..serve.session_store import REDIS_PREFIX

    with redis.Redis.from_url(redis_url) as r:
        for key in r.scan_iter(REDIS_PREFIX + "*"):
            value = r.get(key)
            if value is not None and session_file.decode(value)[0]["messages"] == messages:
                return value
    raise LookupError("no session in Redis holds these messages")


def f16_bytes(value: bytes) -> dict:
    """A stored session's bytes against a plain f16 dump of the KV it stands for (same META)."""
    from .. import session_file

    meta, cache = session_file.decode(value)
    m = meta["model"]
    kv = len(meta["token_ids"]) * m["n_layers"] * m["n_kv_heads"] * m["head_dim"] * 2 * 2
    meta_bytes = len(value) - len(cache)
    return {"tokens": len(meta["token_ids"]), "stored_bytes": len(value), "f16_bytes": kv + meta_bytes,
            "ratio": (kv + meta_bytes) / len(value)}


def _text(tokenizer, n_tokens: int, offset: int) -> str:
    from ..essays import essay_tokens

    return tokenizer.decode(essay_tokens(tokenizer, n_tokens, offset))


def _tokenizer(cfg: dict):
    from ..gguf_model import GgufModel
    from ..model_source import resolve_gguf
    from ..tokenizer import load_tokenizer

    return load_tokenizer(GgufModel(resolve_gguf(cfg["model"]["name"])))


class Bench:
    def __init__(self, deployment, alone, tokenizer):
        self.d, self.alone, self.tok = deployment, alone, tokenizer
        self.a, self.b = deployment.servers[0], deployment.servers[1]
        self._offset = 0

    def _opening(self, n_tokens: int) -> List[dict]:
        """A first message of about ``n_tokens`` of essay text no conversation has used yet."""
        text = _text(self.tok, n_tokens, self._offset)
        self._offset += n_tokens
        return [{"role": "user", "content": "Read this text; I will ask about it.\n\n" + text}]

    def _history(self, n_tokens: int) -> List[dict]:
        """A conversation of one answered turn of about ``n_tokens`` on server A, settled:
        compressed and in Redis."""
        msgs = self._opening(n_tokens - ROOM_TOKENS)
        first = ask(self.a.url, msgs, 16)
        settle([self.a.url])
        return msgs + [first.message]

    def bytes(self, n_tokens: int) -> dict:
        history = self._history(n_tokens)
        return f16_bytes(stored_value(self.d.redis.url, history))

    def ttft(self, n_tokens: int, repetitions: int) -> dict:
        from ..measure import interleave, summarize

        def follow_up(url, expect):
            def run():
                history = self._history(n_tokens)
                ans = ask(url, history + [{"role": "user", "content": QUESTION}], 1)
                settle([self.b.url, self.alone.url])
                assert ans.usage["session"] == expect, (ans.usage, expect)
                return {"s": ans.ttft_s, "prefilled": ans.usage["prompt_tokens"],
                        "cached": ans.usage["prompt_tokens_details"]["cached_tokens"]}
            return run

        runs = interleave({"store": follow_up(self.b.url, "restored"),
                           "re-prefill": follow_up(self.alone.url, "new")}, repetitions)
        out = {name: {"ttft_s": summarize([r["s"] for r in rs]), "prefilled_tokens": rs[0]["prefilled"],
                      "cached_tokens": rs[0]["cached"]} for name, rs in runs.items()}
        out["ratio"] = out["store"]["ttft_s"]["median"] / out["re-prefill"]["ttft_s"]["median"]
        return out

    def concurrent(self, conversations: int, turns: int, opening_tokens: int, max_tokens: int,
                   deadline_s: float) -> dict:
        openings = [self._opening(opening_tokens) for _ in range(conversations)]

        def run(url) -> dict:
            answers = {i: [] for i in range(conversations)}
            errors = []
            stop_at = time.monotonic() + deadline_s

            def converse(i):
                msgs = list(openings[i])
                try:
                    for t in range(turns):
                        if time.monotonic() > stop_at:
                            raise TimeoutError(f"deadline of {deadline_s:g} s passed")
                        ans = ask(url, msgs, max_tokens, timeout=max(1.0, stop_at - time.monotonic()))
                        answers[i].append((ans.text, ans.replica, ans.usage["session"]))
                        msgs += [ans.message, {"role": "user", "content": f"Tell me more, point {t + 1}."}]
                except Exception as e:  # reported with the conversation
                    errors.append((i, repr(e)))

            t0 = time.perf_counter()
            threads = [threading.Thread(target=converse, args=(i,)) for i in range(conversations)]
            for th in threads:
                th.start()
            for th in threads:
                th.join(deadline_s + 60)
            return {"answers": answers, "errors": errors, "s": time.perf_counter() - t0}

        shared = run(self.d.url)
        alone = run(self.alone.url)
        same = sum(1 for i in range(conversations) for t in range(turns)
                   if t < len(shared["answers"][i]) and t < len(alone["answers"][i])
                   and shared["answers"][i][t][0] == alone["answers"][i][t][0])
        ways = [w for i in range(conversations) for _, _, w in shared["answers"][i]]
        return {"conversations": conversations, "turns": turns, "answers": conversations * turns,
                "identical_to_one_server": same, "errors": shared["errors"] + alone["errors"],
                "replicas_used": sorted({r for i in range(conversations) for _, r, _ in shared["answers"][i]}),
                "sessions": {w: ways.count(w) for w in sorted(set(ways))},
                "two_replicas_s": shared["s"], "one_server_s": alone["s"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mnn_h2o.tools.shared_sessions", description=__doc__.split("\n\n")[0])
    ap.add_argument("--history", type=number_list(int, 2 * ROOM_TOKENS), default=[2048, 8192], metavar="N,N",
                    help="history lengths in tokens for bytes and ttft (default 2048,8192)")
    ap.add_argument("--repetitions", type=int, default=3, help="interleaved runs of each ttft case (default 3)")
    ap.add_argument("--conversations", type=int, default=16, help="concurrent conversations (default 16)")
    ap.add_argument("--turns", type=int, default=4, help="turns of each concurrent conversation (default 4)")
    ap.add_argument("--opening", type=int, default=256, help="tokens of each concurrent conversation's first message")
    ap.add_argument("--max-tokens", type=int, default=16, help="answer tokens of each concurrent turn (default 16)")
    ap.add_argument("--deadline", type=float, default=3600, help="seconds the concurrent part may take, each run")
    ap.add_argument("--parts", default="bytes,ttft,concurrent", help="which parts to run (default all three)")
    ap.add_argument("--config", help="the servers' YAML config (default: the built-in one)")
    ap.add_argument("--dir", help="where the processes' logs go (default: a temporary directory, removed)")
    ap.add_argument("--json", help="write the results to this file too")
    args = ap.parse_args(argv)
    parts = set(args.parts.split(","))
    if not parts <= {"bytes", "ttft", "concurrent"} or args.repetitions < 1:
        ap.error("--parts takes bytes, ttft, concurrent; --repetitions at least 1")

    from .. import config as config_mod
    from ..serve.replicas import Deployment, ServerProcess, stop_on_sigterm

    stop_on_sigterm()

    cfg = config_mod.load(args.config, {})
    workdir = args.dir or tempfile.mkdtemp(prefix="mnn_h2o-shared-sessions-")
    out = {"config": args.config or "built-in", "model": cfg["model"]["name"], "history": args.history}
    with Deployment(workdir, 2, config=args.config) as d:
        alone = ServerProcess(workdir, 9, {"serve.session_store": "memory"}, args.config).start()
        try:
            bench = Bench(d, alone, _tokenizer(cfg))
            if "bytes" in parts:
                out["bytes"] = {str(n): bench.bytes(n) for n in args.history}
                print(json.dumps({"bytes": out["bytes"]}, indent=1), file=sys.stderr)
            if "ttft" in parts:
                out["ttft"] = {str(n): bench.ttft(n, args.repetitions) for n in args.history}
                print(json.dumps({"ttft": out["ttft"]}, indent=1), file=sys.stderr)
            if "concurrent" in parts:
                out["concurrent"] = bench.concurrent(args.conversations, args.turns, args.opening,
                                                     args.max_tokens, args.deadline)
        finally:
            alone.stop()
    if not args.dir:
        import shutil
        shutil.rmtree(workdir, ignore_errors=True)
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
