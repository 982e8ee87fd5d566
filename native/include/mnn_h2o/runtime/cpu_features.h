// Which SIMD instruction sets this CPU can run. Kernels are compiled per ISA into separate files
// and picked at run time, so one binary runs on any x86-64 and uses the widest path available.
#pragma once

namespace mnn_h2o {

enum class Isa { Scalar = 0, Avx2 = 1, Avx512 = 2, Neon = 3 };

struct CpuFeatures {
    bool avx2_f16c_fma = false;  // AVX2 + FMA + F16C (FP16 conversion)
    bool avx512 = false;         // AVX-512 F + BW + VL
    bool avx512_vnni = false;    // and VNNI (int8 dot products; Ice Lake, Zen 4 on)
    bool avx512_bf16 = false;    // and BF16 (bf16 dot products; with VNNI here: Sapphire Rapids, Zen 4 on)
    bool neon = false;           // always true on aarch64
};

// Detected once, then cached. MNN_H2O_CPU_DISABLE=avx512_bf16[,avx512_vnni] hides those
// extensions (for the tests of the kernel sets a CPU with them would never pick).
const CpuFeatures& cpu_features();

// Widest ISA both compiled in and supported by this CPU. The environment variable
// MNN_H2O_ISA=scalar|avx2|avx512|neon caps it (for tests and benchmarks of the fallbacks).
Isa best_isa();

const char* isa_name(Isa isa);

}  // namespace mnn_h2o
