"""Fuzz the model loader with hostile GGUF files: each must load or raise ModelFileError.

    python -m mnn_h2o.tools.fuzz_model_loader --iterations 20000 --seed 0 [--json FILE]

Variants of a tiny valid model (``gguf_mutations``) go through everything export does with a
file: ``GgufModel`` (header, metadata, config), the tokenizer built from its metadata, every
tensor of every layer, the embedding, final norm and lm_head. A variant passes when that either
succeeds with weights whose shapes agree with the config, or stops at a ``ModelFileError``.
Anything else is a finding: another exception type, a model accepted with inconsistent shapes,
a crash (the loader runs in a worker process) or a hang (per-input timeout). The worker has an
address-space limit so a bogus size becomes MemoryError instead of swapping the machine.

Findings are written to ``--artifacts`` (one ``.gguf`` each, named by kind and index) with a
summary on stdout and, with ``--json``, counts per mutation kind and verdict.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import select
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Dict, Optional

import numpy as np

from . import gguf_mutations

ACCEPTED, REJECTED = "accepted", "rejected"
WRONG_EXCEPTION, INCONSISTENT, CRASH, HANG = "wrong_exception", "inconsistent", "crash", "hang"
FINDINGS = (WRONG_EXCEPTION, INCONSISTENT, CRASH, HANG)


def load_fully(path: str) -> None:
    """Everything export reads from a GGUF file; raises ModelFileError or AssertionError
    (accepted but inconsistent) or whatever the loader lets through."""
    from ..gguf_model import GgufModel
    from ..tokenizer import load_tokenizer

    m = GgufModel(path)
    c = m.config
    tok = load_tokenizer(m)
    tok.encode("ab cd")
    tok.apply_chat_template("ab")
    kvd, qd = c.n_kv_heads * c.head_dim, c.n_heads * c.head_dim
    want = {"attn_norm": (c.hidden,), "wq": (qd, c.hidden), "wk": (kvd, c.hidden), "wv": (kvd, c.hidden),
            "wo": (c.hidden, qd), "ffn_norm": (c.hidden,), "w_gate": (c.ffn, c.hidden),
            "w_up": (c.ffn, c.hidden), "w_down": (c.hidden, c.ffn),
            "bq": (qd,), "bk": (kvd,), "bv": (kvd,)}
    for i, layer in m.layers():
        for name, w in layer.items():
            assert w.shape == want[name], f"layer {i} {name}: shape {w.shape}, config says {want[name]}"
    assert m.embedding().shape == (c.vocab, c.hidden), f"embedding {m.embedding().shape} vs {c}"
    assert m.output_norm().shape == (c.hidden,), f"output_norm {m.output_norm().shape}"
    assert m.lm_head().shape == (c.vocab, c.hidden), f"lm_head {m.lm_head().shape}"
    assert tok.vocab_size == c.vocab, f"tokenizer has {tok.vocab_size} tokens, config {c.vocab}"


def verdict(path: str) -> Dict[str, str]:
    """Load ``path`` in this process and classify the outcome (never raises)."""
    from ..errors import ModelFileError

    try:
        load_fully(path)
        return {"verdict": ACCEPTED}
    except ModelFileError as e:
        return {"verdict": REJECTED, "error": str(e)[:300]}
    except AssertionError as e:
        return {"verdict": INCONSISTENT, "error": str(e)[:300]}
    except BaseException as e:  # noqa: B902 - the point is to catch what should not get out
        return {"verdict": WRONG_EXCEPTION, "error": f"{type(e).__name__}: {str(e)[:300]}",
                "traceback": traceback.format_exc(limit=-4)}


# --- the worker process -------------------------------------------------------------------------
def _worker(address_space_mb: int) -> None:
    """Read paths from stdin, answer one JSON verdict per line."""
    import resource

    limit = address_space_mb << 20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    from ..gguf_model import GgufModel  # noqa: F401  (import before the first timing)

    for line in sys.stdin:
        out = verdict(line.strip())
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()


class Worker:
    """A loader subprocess; restarted after a crash or a hang."""

    def __init__(self, address_space_mb: int):
        self.address_space_mb = address_space_mb
        self.proc: Optional[subprocess.Popen] = None

    def _start(self) -> None:
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_WAIT_POLICY="passive",
                   RAYON_NUM_THREADS="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mnn_h2o.tools.fuzz_model_loader", "--worker",
             "--address-space-mb", str(self.address_space_mb)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), env=env)

    def run(self, path: str, timeout: float) -> Dict[str, str]:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        p = self.proc
        p.stdin.write(path + "\n")
        p.stdin.flush()
        ready, _, _ = select.select([p.stdout], [], [], timeout)
        if not ready:
            self.close()
            return {"verdict": HANG, "error": f"no answer in {timeout:.0f} s"}
        line = p.stdout.readline()
        if not line:
            rc = p.wait()
            self.proc = None
            return {"verdict": CRASH, "error": f"worker exited with {rc}"}
        return json.loads(line)

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mnn_h2o.tools.fuzz_model_loader",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterations", type=int, default=2000, help="hostile files to try")
    ap.add_argument("--seed", type=int, default=0, help="random seed (same seed, same files)")
    ap.add_argument("--kind", choices=sorted(gguf_mutations.MUTATORS), help="only this mutation kind")
    ap.add_argument("--json", help="write counts per kind and verdict, and the findings, here")
    ap.add_argument("--artifacts", default=os.path.join("runs", "fuzz_model_loader"),
                    help="directory for the files that produced findings")
    ap.add_argument("--timeout", type=float, default=20.0, help="seconds per file before it counts as a hang")
    ap.add_argument("--address-space-mb", type=int, default=4096, help="RLIMIT_AS of the loader process")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        _worker(args.address_space_mb)
        return 0

    from tqdm import tqdm

    rng = np.random.default_rng(args.seed)
    counts: Dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    findings = []
    worker = Worker(args.address_space_mb)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        seed_path = os.path.join(tmp, "seed.gguf")
        with open(seed_path, "wb") as f:
            f.write(gguf_mutations.seed_bytes())
        first = worker.run(seed_path, args.timeout)
        if first["verdict"] != ACCEPTED:
            print(f"the seed model itself does not load: {first}", file=sys.stderr)
            return 2
        path = os.path.join(tmp, "input.gguf")
        bar = tqdm(range(args.iterations), desc="fuzz model loader", unit="file")
        for i in bar:
            mut = gguf_mutations.mutate(rng, args.kind)
            with open(path, "wb") as f:
                f.write(mut.data)
            out = worker.run(path, args.timeout)
            counts[mut.kind][out["verdict"]] += 1
            if out["verdict"] in FINDINGS:
                os.makedirs(args.artifacts, exist_ok=True)
                art = os.path.join(args.artifacts, f"{out['verdict']}-{mut.kind}-{i}.gguf")
                with open(art, "wb") as f:
                    f.write(mut.data)
                findings.append(dict(out, kind=mut.kind, detail=mut.detail, index=i, file=art))
                bar.set_postfix(findings=len(findings))
    worker.close()
    seconds = time.perf_counter() - t0

    total = collections.Counter()
    print(f"{'kind':<20} {'files':>6} " + " ".join(f"{v:>15}" for v in (ACCEPTED, REJECTED) + FINDINGS))
    for kind in sorted(counts):
        c = counts[kind]
        total.update(c)
        print(f"{kind:<20} {sum(c.values()):>6} " + " ".join(f"{c[v]:>15}" for v in (ACCEPTED, REJECTED) + FINDINGS))
    print(f"{args.iterations} files in {seconds:.1f} s ({args.iterations / seconds:.0f}/s), "
          f"{len(findings)} findings")
    for f in findings[:20]:
        print(f"  [{f['verdict']}] {f['kind']}: {f['detail']} -> {f['error']} ({f['file']})")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"iterations": args.iterations, "seed": args.seed, "seconds": seconds,
                       "counts": {k: dict(v) for k, v in counts.items()}, "totals": dict(total),
                       "findings": findings}, fh, indent=1)
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
