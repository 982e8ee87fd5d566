// libzstd, loaded at run time with dlopen("libzstd.so.1").
//
// Why not link it: the core must build and run on machines without zstd (Android, minimal
// containers); the Gear codec then falls back to its RLE backend. The few functions used are
// declared here from zstd's stable API, so no zstd header is needed at build time either.
#pragma once

#include <cstddef>

namespace mnn_h2o {
namespace zstd {

// The subset of zstd.h (stable since zstd 1.0) the codec calls. Contexts are opaque.
struct Api {
    void* (*create_cctx)();
    size_t (*free_cctx)(void* cctx);
    size_t (*compress_cctx)(void* cctx, void* dst, size_t dst_capacity, const void* src,
                            size_t src_size, int level);
    void* (*create_dctx)();
    size_t (*free_dctx)(void* dctx);
    size_t (*decompress_dctx)(void* dctx, void* dst, size_t dst_capacity, const void* src,
                              size_t src_size);
    unsigned (*is_error)(size_t code);
    unsigned (*version_number)();
    // zstd >= 1.4.0 (advanced API); nullptr with an older library, which then compresses at the
    // level's own parameters.
    size_t (*cctx_set_parameter)(void* cctx, int param, int value);
    size_t (*cctx_reset)(void* cctx, int directive);
    size_t (*compress2)(void* cctx, void* dst, size_t dst_capacity, const void* src, size_t src_size);
};

// Compression parameters: a level, and optionally two of the level's parameters overridden
// (0 = the level's own value).
struct Params {
    int level = 1;
    int hash_log = 0;   // log2 of the match finder's hash table entries
    int min_match = 0;  // shortest match searched for, in bytes
};

// The loaded library, or nullptr when libzstd.so.1 cannot be loaded, lacks a symbol, or the
// environment variable MNN_H2O_NO_ZSTD is set (to test the fallback). Loaded once; thread-safe.
const Api* api();

// Owning handles for the compression and decompression contexts; empty when zstd is missing.
class CompressContext {
public:
    CompressContext();
    ~CompressContext();
    CompressContext(const CompressContext&) = delete;
    CompressContext& operator=(const CompressContext&) = delete;
    // Compressed size, or 0 when zstd is missing, fails, or needs more than dst_capacity.
    // Standard zstd frames whatever the parameters: decoding needs no knowledge of them.
    size_t compress(void* dst, size_t dst_capacity, const void* src, size_t src_size, const Params& params);

private:
    void* ctx_ = nullptr;
};

class DecompressContext {
public:
    DecompressContext();
    ~DecompressContext();
    DecompressContext(const DecompressContext&) = delete;
    DecompressContext& operator=(const DecompressContext&) = delete;
    bool available() const { return ctx_ != nullptr; }
    // True when src is complete zstd frames that decompress to exactly dst_size bytes.
    bool decompress_exact(void* dst, size_t dst_size, const void* src, size_t src_size);

private:
    void* ctx_ = nullptr;
};

}  // namespace zstd
}  // namespace mnn_h2o
