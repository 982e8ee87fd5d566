#include "mnn_h2o/runtime/cpu_features.h"

#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#endif

namespace mnn_h2o {

namespace {

CpuFeatures detect() {
    CpuFeatures f;
#if defined(__x86_64__) || defined(_M_X64)
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
    const bool fma = c & (1u << 12), f16c = c & (1u << 29), osxsave = c & (1u << 27);
    if (!osxsave) return f;
    unsigned xlo, xhi;
    __asm__("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    const bool ymm_os = (xlo & 0x6) == 0x6;
    const bool zmm_os = (xlo & 0xE6) == 0xE6;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return f;
    const bool avx2 = b & (1u << 5);
    const bool avx512f = b & (1u << 16), avx512bw = b & (1u << 30), avx512vl = b & (1u << 31);
    f.avx2_f16c_fma = ymm_os && avx2 && fma && f16c;
    f.avx512 = f.avx2_f16c_fma && zmm_os && avx512f && avx512bw && avx512vl;
    f.avx512_vnni = f.avx512 && (c & (1u << 11));
    unsigned eax1 = 0;
    if (__get_cpuid_count(7, 1, &eax1, &b, &c, &d)) f.avx512_bf16 = f.avx512_vnni && (eax1 & (1u << 5));
    if (const char* off = std::getenv("MNN_H2O_CPU_DISABLE")) {
        if (std::strstr(off, "avx512_vnni")) f.avx512_vnni = f.avx512_bf16 = false;
        if (std::strstr(off, "avx512_bf16")) f.avx512_bf16 = false;
    }
#elif defined(__aarch64__)
    f.neon = true;
#endif
    return f;
}

Isa compiled_best(const CpuFeatures& f) {
#if defined(MNN_H2O_HAVE_X86_KERNELS)
    if (f.avx512) return Isa::Avx512;
    if (f.avx2_f16c_fma) return Isa::Avx2;
#elif defined(MNN_H2O_HAVE_NEON_KERNELS)
    if (f.neon) return Isa::Neon;
#endif
    (void)f;
    return Isa::Scalar;
}

}  // namespace

const CpuFeatures& cpu_features() {
    static const CpuFeatures f = detect();
    return f;
}

Isa best_isa() {
    static const Isa isa = [] {
        Isa best = compiled_best(cpu_features());
        const char* cap = std::getenv("MNN_H2O_ISA");
        if (!cap) return best;
        Isa want = Isa::Scalar;
        if (!std::strcmp(cap, "avx2")) want = Isa::Avx2;
        else if (!std::strcmp(cap, "avx512")) want = Isa::Avx512;
        else if (!std::strcmp(cap, "neon")) want = Isa::Neon;
        // A cap never enables an ISA the CPU lacks; Neon and the x86 ISAs are never both present.
        if (want == Isa::Neon) return best == Isa::Neon ? best : Isa::Scalar;
        if (best == Isa::Neon) return want == Isa::Scalar ? Isa::Scalar : best;
        return static_cast<int>(want) < static_cast<int>(best) ? want : best;
    }();
    return isa;
}

const char* isa_name(Isa isa) {
    switch (isa) {
        case Isa::Scalar: return "scalar";
        case Isa::Avx2: return "avx2";
        case Isa::Avx512: return "avx512";
        case Isa::Neon: return "neon";
    }
    return "?";
}

}  // namespace mnn_h2o
