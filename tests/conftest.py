import os

import numpy as np
import pytest

# Idle BLAS/OpenMP threads spin and steal MNN's cores (docs/building.md).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

# scripts/test_sanitizers.sh builds an instrumented _core into its own directory and names it
# here: searched before mnn_h2o/, so `mnn_h2o._core` is the ASan/UBSan build for this run.
_CORE_DIR = os.environ.get("MNN_H2O_CORE_DIR")
if _CORE_DIR:
    import mnn_h2o

    mnn_h2o.__path__.insert(0, os.path.abspath(_CORE_DIR))
    # The ASan runtime that script preloads into python must not leak into the programs tests
    # start (the clang libFuzzer target has its own, incompatible one); this process keeps it.
    os.environ.pop("LD_PRELOAD", None)


@pytest.fixture(scope="session")
def smollm2_path():
    from mnn_h2o.model_source import resolve_gguf

    return resolve_gguf("smollm2")


@pytest.fixture(scope="session")
def smollm2_gguf(smollm2_path):
    from mnn_h2o.gguf_model import GgufModel

    return GgufModel(smollm2_path)


@pytest.fixture(scope="session")
def tokenizer(smollm2_gguf):
    from mnn_h2o.tokenizer import load_tokenizer

    return load_tokenizer(smollm2_gguf)


@pytest.fixture(scope="session")
def reference(smollm2_gguf):
    from mnn_h2o.reference import ReferenceModel

    return ReferenceModel(smollm2_gguf, np.float64)


def make_llm(weight_bits=8, eviction=None, head_bits=None, **runtime):
    """An engine on SmolLM2 (every module at weight_bits unless head_bits says otherwise);
    eviction off unless an ``h2o`` section is given."""
    from mnn_h2o import config
    from mnn_h2o.engine import Llm

    head_bits = weight_bits if head_bits is None else head_bits
    runtime.setdefault("kv_dtype", "f16")  # the exactness tests compare against f16/f32 references
    cfg = config.validate({"model": {"weight_bits": weight_bits, "head_bits": head_bits}, "runtime": runtime,
                           "eviction": eviction if eviction is not None else {"enabled": False}})
    return Llm.load("smollm2", cfg, progress=False)


@pytest.fixture(scope="session")
def llm8():
    return make_llm(8)
