"""python -m mnn_h2o.serve: the OpenAI-compatible server and its chat page (docs/serve.md).

    python -m mnn_h2o.serve                                  # http://127.0.0.1:8080, SmolLM2
    python -m mnn_h2o.serve --config h2o.yaml --set serve.session_store=disk:sessions --port 8081
"""
from __future__ import annotations

import argparse
import ctypes
import logging
import sys
import time

from .. import config as config_mod
from ..cli_errors import run

_EXTRA_MISSING = ("error: the server needs the serve extra (FastAPI and uvicorn): "
                  "pip install 'mnn_h2o[serve]' (from a checkout: pip install '.[serve]')")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m mnn_h2o.serve",
        description="Serve one model over OpenAI's HTTP API (/v1/chat/completions streamed or not, "
                    "/v1/completions, /v1/models, /health) and a chat page at /. Conversations that "
                    "extend an earlier one continue its KV cache; all of them share one KV memory "
                    "budget (serve.kv_budget_bytes), beyond which idle ones are saved to the "
                    "session store (serve.session_store: memory, disk:PATH, or a Redis that several "
                    "servers share) and restored on their next request. Settings of the serve "
                    "section: docs/config.md; the API: docs/serve.md.")
    ap.add_argument("--host", default="127.0.0.1",
                    help="address to listen on (default 127.0.0.1, this machine only; the server has no "
                         "authentication, so think before exposing it)")
    ap.add_argument("--port", type=int, default=8080, help="TCP port (default 8080)")
    ap.add_argument("--config", help="YAML config (default: built-in defaults; see docs/config.md)")
    ap.add_argument("--model", help="named model or GGUF path (overrides model.name of the config); it is "
                                    "also the model id clients name")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="override one config key (repeatable), e.g. --set serve.kv_budget_bytes=67108864")
    ap.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"),
                    help="server log level (default info)")
    return ap


def keep_large_buffers_mapped() -> bool:
    """Have glibc serve every allocation of 128 KiB or more by mmap, returned to the system on
    free. A server's conversations come and go through buffers of megabytes (a session's
    serialised bytes when it is saved or restored, numpy temporaries of a prefill); by default
    glibc raises its mmap threshold each time such a buffer is freed, so the next ones come from
    the heap and stay there, and the peak memory then depends on the order of frees (the load
    test saw 1.7x the usual growth on a busy machine). Setting the threshold fixes it at glibc's
    starting value. False where the C library has no mallopt (not glibc)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    m_mmap_threshold = -3  # malloc.h
    return bool(mallopt(m_mmap_threshold, 128 * 1024))


def model_id(name: str) -> str:
    """The id clients name: a named model's name, or a GGUF file's name without .gguf."""
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    return base[:-5] if base.lower().endswith(".gguf") else base


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        import fastapi  # noqa: F401
        import uvicorn
    except ImportError:
        print(_EXTRA_MISSING, file=sys.stderr)
        return 2

    def body() -> int:
        from ..engine import Llm
        from ..export import ensure_exported
        from .app import create_app
        from .pool import SessionPool
        from .service import Service
        from .session_store import open_store

        if not 0 <= args.port <= 65535:
            raise ValueError(f"--port must be in 0..65535, got {args.port}")
        keep_large_buffers_mapped()
        overrides = {"model.name": args.model} if args.model else {}
        overrides.update(config_mod.parse_assignment(a) for a in args.set)
        cfg = config_mod.load(args.config, overrides)
        sc = cfg["serve"]
        logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s: %(name)s: %(message)s")
        log = logging.getLogger("mnn_h2o.serve")
        store = open_store(sc["session_store"], sc["max_sessions"])  # before the model: a bad store fails fast
        try:
            if cfg["lossless"]["mode"] != "off":
                if store.outlives_server:
                    raise ValueError(f"serve.session_store {store.where} keeps conversations beyond this server, and "
                                     f"with lossless.mode {cfg['lossless']['mode']} they cannot be saved (the session "
                                     f"format holds no lossless store): use lossless.mode off, or serve.session_store "
                                     f"memory")
                log.warning("lossless.mode %s: sessions cannot be saved (the session format holds no lossless "
                            "store), so conversations over serve.kv_budget_bytes are dropped, not offloaded, and "
                            "prefill their history again on their next request", cfg["lossless"]["mode"])
            llm = Llm(ensure_exported(cfg["model"]), cfg)
            if not llm.tokenizer.chat_template:
                raise ValueError(f"{cfg['model']['name']} has no chat template: the server needs a chat model")
            new, load = Service.session_factories(llm)
            pool = SessionPool(new, load, store, Service.store_namespace(llm), sc["kv_budget_bytes"],
                               sc["max_sessions"])
            app = create_app(Service(llm, pool, sc["max_tokens_limit"]), model_id(cfg["model"]["name"]), sc,
                             int(time.time()))
            uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
        finally:
            store.close()
        return 0

    return run(body)


if __name__ == "__main__":
    sys.exit(main())
