"""The llm_demo of mnn_h2o: chat, or stream one answer and print timing and KV figures.

    python -m mnn_h2o.demo                                   # chat (mnn_h2o/chat.py)
    python -m mnn_h2o.demo --prompt "The capital of France is" --no-chat
    python -m mnn_h2o.demo --prompt-file question.txt --max-new-tokens 256 --config h2o.yaml
"""
from __future__ import annotations

import argparse
import sys

from . import config as config_mod
from .chat import chat
from .cli_errors import run
from .engine import Llm, Sampling
from .export import ensure_exported
from .prefill_progress import PrefillBars


CHAT_HELP = """\
Without --prompt or --prompt-file: an interactive chat. Lines from standard input (a
terminal or a pipe) are the user's turns; answers stream back; the history stays in the
KV cache, compressed by the config. Commands: /reset, /stats (tokens, KV bytes held,
whole-model ratio), /save FILE, /load FILE (docs/session_format.md), /help, /quit (or end
of input). Ctrl-C stops an answer; at the prompt, or twice quickly, it leaves (status 130).

With --prompt or --prompt-file: one answer, then its speed and KV figures."""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m mnn_h2o.demo", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Chat with the mnn_h2o engine, or answer one prompt and report prefill/decode "
                    "speed and KV-cache memory.",
        epilog=CHAT_HELP)
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--prompt", help="answer this prompt and exit")
    src.add_argument("--prompt-file", help="answer the prompt in this file ('-' = stdin) and exit")
    ap.add_argument("--system", help="chat: the system message (default: the model's template's)")
    ap.add_argument("--max-new-tokens", type=int, default=128, help="tokens to generate at most, per answer (default 128)")
    ap.add_argument("--config", help="YAML config (default: built-in defaults; see docs/config.md)")
    ap.add_argument("--model", help="named model or GGUF path (overrides model.name of the config)")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="override one config key (repeatable), e.g. --set runtime.kv_dtype=q8")
    ap.add_argument("--no-chat", action="store_true", help="do not wrap the prompt in the chat template")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    ap.add_argument("--top-k", type=int, default=0, help="sample from the k most likely tokens (0 = off)")
    ap.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1 = off)")
    ap.add_argument("--seed", type=int, default=None, help="sampling seed")
    ap.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    args = ap.parse_args(argv)

    def load_config() -> dict:
        overrides = {"model.name": args.model} if args.model else {}
        overrides.update(config_mod.parse_assignment(a) for a in args.set)
        return config_mod.load(args.config, overrides)

    def body() -> int:
        if args.max_new_tokens < 0:
            raise ValueError(f"--max-new-tokens must be >= 0, got {args.max_new_tokens}")
        sampling = Sampling(args.temperature, args.top_k, args.top_p, args.seed)
        if args.prompt is None and args.prompt_file is None:
            cfg = load_config()
            llm = Llm(ensure_exported(cfg["model"], progress=sys.stderr.isatty()), cfg)
            return chat(llm, cfg, sampling, args.max_new_tokens, args.stop, system=args.system)
        if args.prompt_file:
            source = "standard input" if args.prompt_file == "-" else f"--prompt-file {args.prompt_file}"
            try:
                with (sys.stdin if args.prompt_file == "-" else open(args.prompt_file, encoding="utf-8")) as f:
                    prompt = f.read()
            except OSError as e:
                raise ValueError(f"cannot read {source}: {e.strerror}") from None
            except UnicodeDecodeError as e:
                raise ValueError(f"{source} is not UTF-8 text: {e.reason} at byte {e.start}") from None
        else:
            source, prompt = "--prompt", args.prompt
        # Checked before the chat template is applied: wrapped in it, an empty prompt is a
        # valid-looking conversation and the model chats about nothing.
        if not prompt.strip():
            raise ValueError(f"the prompt ({source}) is empty")
        cfg = load_config()
        llm = Llm(ensure_exported(cfg["model"]), cfg)
        g = llm.generate(prompt, args.max_new_tokens, sampling, stop=args.stop,
                         stream=lambda s: print(s, end="", flush=True), chat=not args.no_chat,
                         progress=PrefillBars())
        s = g.stats
        print()
        print(f"\n--- {s.prompt_tokens} prompt tokens, {s.generated_tokens} generated ({g.stop_reason})")
        print(f"prefill {s.prefill_s * 1e3:8.1f} ms  {s.prefill_tps:8.1f} tok/s")
        print(f"decode  {s.decode_s * 1e3:8.1f} ms  {s.decode_tps:8.1f} tok/s")
        print(f"KV held {s.kv_bytes_held / 2**20:8.2f} MiB (peak {s.kv_bytes_peak / 2**20:.2f} MiB), "
              f"dtype {cfg['runtime']['kv_dtype']}")
        return 0

    return run(body, lead="\n")


if __name__ == "__main__":
    sys.exit(main())
