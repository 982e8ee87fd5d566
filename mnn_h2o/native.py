"""The door to the native core: the one module of the package that imports ``mnn_h2o._core`` (the
C++ core of native/ through the pybind11 module of bindings/). The rest of the package reaches the
core's types and functions here, as ``native.KvCache``, so the boundary between Python and C++ is
one file, and a missing or stale build is one clear error rather than an ImportError of a module
deep in the stack."""
try:
    from ._core import (KEPT_FIRST, DecodeLayers, GearCodec, GearError, KvCache, Q8Matrix, TokenScorer, WeightMatrix,
                        attention_kernels, best_isa, decode_layer_options, decode_token, dequantize_blocks, gear_zstd_available, kv_dtypes, kv_row_bytes,
                        kv_rows_encode, policy_names, weight_types)
except ImportError as e:
    raise ImportError(
        f"mnn_h2o's native core (mnn_h2o._core) is not built, or is stale, for this Python: {e}. "
        "Build it as docs/building.md says: bash scripts/setup.sh, or in the checkout "
        "cmake -S . -B build -Dpybind11_DIR=$(python3 -m pybind11 --cmakedir) && cmake --build build -j2"
    ) from e

__all__ = ["KEPT_FIRST", "DecodeLayers", "GearCodec", "GearError", "KvCache", "Q8Matrix", "TokenScorer", "WeightMatrix",
           "attention_kernels", "best_isa", "decode_layer_options", "decode_token", "dequantize_blocks", "gear_zstd_available", "kv_dtypes", "kv_row_bytes", "kv_rows_encode",
           "policy_names", "weight_types"]
