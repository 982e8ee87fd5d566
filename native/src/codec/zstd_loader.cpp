#include "mnn_h2o/codec/zstd_loader.h"

#include <dlfcn.h>

#include <cstdlib>

namespace mnn_h2o {
namespace zstd {

namespace {

template <typename F>
bool bind(void* lib, const char* name, F* fn) {
    *fn = reinterpret_cast<F>(dlsym(lib, name));
    return *fn != nullptr;
}

const Api* load() {
    if (std::getenv("MNN_H2O_NO_ZSTD")) return nullptr;
    // The handle is never closed: the function pointers must stay valid for the process.
    void* lib = dlopen("libzstd.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return nullptr;
    static Api a;
    const bool ok = bind(lib, "ZSTD_createCCtx", &a.create_cctx) &&
                    bind(lib, "ZSTD_freeCCtx", &a.free_cctx) &&
                    bind(lib, "ZSTD_compressCCtx", &a.compress_cctx) &&
                    bind(lib, "ZSTD_createDCtx", &a.create_dctx) &&
                    bind(lib, "ZSTD_freeDCtx", &a.free_dctx) &&
                    bind(lib, "ZSTD_decompressDCtx", &a.decompress_dctx) &&
                    bind(lib, "ZSTD_isError", &a.is_error) &&
                    bind(lib, "ZSTD_versionNumber", &a.version_number);
    if (!ok) return nullptr;
    // Optional: all three or none.
    if (!(bind(lib, "ZSTD_CCtx_setParameter", &a.cctx_set_parameter) && bind(lib, "ZSTD_CCtx_reset", &a.cctx_reset) &&
          bind(lib, "ZSTD_compress2", &a.compress2)))
        a.cctx_set_parameter = nullptr, a.cctx_reset = nullptr, a.compress2 = nullptr;
    return &a;
}

}  // namespace

const Api* api() {
    static const Api* a = load();
    return a;
}

CompressContext::CompressContext() {
    if (const Api* z = api()) ctx_ = z->create_cctx();
}

CompressContext::~CompressContext() {
    if (ctx_) api()->free_cctx(ctx_);
}

// Values of zstd.h's ZSTD_cParameter and ZSTD_ResetDirective (stable API since 1.4.0).
constexpr int kParamLevel = 100, kParamHashLog = 102, kParamMinMatch = 105;
constexpr int kResetSessionAndParameters = 3;

size_t CompressContext::compress(void* dst, size_t dst_capacity, const void* src, size_t src_size,
                                 const Params& params) {
    if (!ctx_) return 0;
    const Api& z = *api();
    size_t n;
    if ((params.hash_log || params.min_match) && z.compress2) {
        // Parameters are sticky on a context: start from zstd's defaults every time.
        bool ok = !z.is_error(z.cctx_reset(ctx_, kResetSessionAndParameters)) &&
                  !z.is_error(z.cctx_set_parameter(ctx_, kParamLevel, params.level));
        if (ok && params.hash_log) ok = !z.is_error(z.cctx_set_parameter(ctx_, kParamHashLog, params.hash_log));
        if (ok && params.min_match) ok = !z.is_error(z.cctx_set_parameter(ctx_, kParamMinMatch, params.min_match));
        if (!ok) return 0;
        n = z.compress2(ctx_, dst, dst_capacity, src, src_size);
    } else {
        n = z.compress_cctx(ctx_, dst, dst_capacity, src, src_size, params.level);
    }
    return z.is_error(n) ? 0 : n;
}

DecompressContext::DecompressContext() {
    if (const Api* z = api()) ctx_ = z->create_dctx();
}

DecompressContext::~DecompressContext() {
    if (ctx_) api()->free_dctx(ctx_);
}

bool DecompressContext::decompress_exact(void* dst, size_t dst_size, const void* src,
                                         size_t src_size) {
    if (!ctx_) return false;
    const size_t n = api()->decompress_dctx(ctx_, dst, dst_size, src, src_size);
    return !api()->is_error(n) && n == dst_size;
}

}  // namespace zstd
}  // namespace mnn_h2o
