// Attention of new queries over a block-structured KV cache, with an optional H2O signal.
//
// The kernel reads keys and values straight from the cache blocks in the cache dtype (kv_dtype.h:
// fp16, bf16, fp32, or int8/int4 codes with fp16 group scales), token-major inside a block, and
// converts them to fp32 in registers; there is never a dequantised copy of the cache. Softmax is
// exact (max-subtracted, fp32 accumulation). Each kernel exists per ISA (scalar reference,
// AVX2+F16C+FMA, AVX-512 with and without VNNI, NEON) behind one entry point that takes the ISA
// explicitly.
//
// Over an int8 (q8) cache a prompt's queries (more than one) are rounded as the keys are, to q8
// rows (int8 per 32 values with an fp16 scale; llama.cpp rounds them to q8_0 for a q8_0 cache the
// same way), before any product: every ISA sees the same rounded queries, and the AVX-512 VNNI
// prompt kernel takes Q x K^T as int8 dot products. A decode step's one query stays float: its
// attention waits on memory, not on arithmetic, so rounding it would cost quality for nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "mnn_h2o/runtime/cpu_features.h"
#include "mnn_h2o/cache/kv_dtype.h"

namespace mnn_h2o {

class Team;

// Decode splits each head's keys over the team's threads once the call's query-key products,
// n_q * (keys of the longest kv head) * query heads * head_dim, reach kSplitMinProducts, whatever
// team runs it, so that the results do not depend on which team it is (a decode token's layers
// lend theirs, Team::polling; a layer-by-layer caller has the cache's ThreadPool). On a polling
// team of two on the 2-core Zen 4 VM a split paid from 192-256 keys on the 1.5B's shape (12 heads
// of 128: 0.74x the time a token's cache steps took on one thread at 256, 1.32x at 128) and from
// 512 on SmolLM2's (9 of 64: 0.91x; 1.10x at 256): about 2^18 products either way. The splits
// run on the threads when the team polls, or from kParallelMinQueryKeys on any team: below it,
// waking a sleeping worker costs more than it saves (one thread was faster below ~1k tokens of
// decode context on the 2-core target), and the splits run one after the other on the caller.
// Prefill hands out (kv head, query tile) tasks, on the threads when the team polls or from
// kParallelMinQueryKeys.
constexpr long long kSplitMinProducts = 1 << 18;  // 171 keys of the 1.5B, 455 of SmolLM2
constexpr long long kParallelMinQueryKeys = 1024;

// The cached keys and values of one kv head. Block i holds tokens [i*block_tokens,
// (i+1)*block_tokens), each token a row of head_dim elements of the cache dtype.
struct KvHeadView {
    const void* const* k_blocks = nullptr;
    const void* const* v_blocks = nullptr;
    int n_keys = 0;
};

struct AttentionProblem {
    int n_kv_heads = 0;
    int group = 0;        // query heads per kv head; query head h*group+g reads kv head h
    int head_dim = 0;     // multiple of 16, at most 256 (quantised dtypes: see kv_dtype_shape_error)
    int block_tokens = 0; // multiple of 16
    KvDtype dtype = KvDtype::F16;  // q4r reads as q4: rotating q and out is the caller's part
    const KvHeadView* heads = nullptr;  // [n_kv_heads]

    // Queries are the last n_q positions of the sequence: query i sees the first
    // n_keys - n_q + i + 1 keys of its kv head (causal), so every head needs n_keys >= n_q.
    const float* q = nullptr;  // [n_q][n_kv_heads * group][head_dim], RoPE already applied
    int n_q = 0;
    float* out = nullptr;      // [n_q][n_kv_heads * group * head_dim]; must not overlap q

    // Optional H2O signal: block_scores[h * scores_stride + b] += the softmax probability mass
    // that the keys of block b of kv head h received, summed over the n_q queries and the group's
    // query heads (so each head's row gains n_q * group in total). scores_stride must cover
    // every visible block of every head.
    float* block_scores = nullptr;
    size_t scores_stride = 0;
    // Optional observation window (needs block_scores): window_scores[h * scores_stride + b] +=
    // the same masses from the last window_queries queries alone (t >= n_q - window_queries),
    // computed in the same pass (SnapKV / TOVA signals). window_queries in [1, n_q].
    float* window_scores = nullptr;
    int window_queries = 0;
    // Optional peak (needs block_scores): block_max[h * scores_stride + b] = max(itself, the
    // largest probability any of the n_q queries, from any query head of the group, gave any key
    // of block b of kv head h). KVzip's score: the most attention a key receives from the
    // queries of a context reconstruction. Computed in the same pass from the same softmax.
    float* block_max = nullptr;

    // Keys the work split is planned for; 0 = the longest head's. A caller that runs the heads of
    // one problem in separate calls (the KV store, one head's memory at a time) passes the longest
    // head of the whole problem, so the splits, and so the results, are bit-identical to the
    // all-heads call.
    int split_keys = 0;
    // Likewise the kv heads it is planned for; 0 = n_kv_heads (the store's one-head calls pass the
    // whole problem's).
    int split_kv_heads = 0;

    // A sliding window (Gemma 3's local layers): query i sees only the newest `window` of the keys
    // it would see causally, keys [max(0, limit - window), limit); 0: all of them. The keys of
    // such a head are consecutive positions (no eviction). Takes no scores (block_scores null).
    int window = 0;

    // Optional: q's q8 rows, when q already holds a q8 cache's prompt queries rounded by
    // attention_queries (a caller that reads the rounded queries itself rounds them once);
    // attention() then rounds nothing.
    const uint8_t* q8_rows = nullptr;
};

// Scratch memory of attention(), kept between calls so a decode step allocates nothing.
class AttentionWorkspace {
public:
    std::vector<float> per_thread;   // one equal slice per pool thread
    std::vector<float> partials;     // decode: per-split softmax state, merged afterwards
    std::vector<float> tile_scores;  // prefill: per-tile block scores, summed afterwards
    std::vector<float> tile_window;  // and the observation window's part of them
    std::vector<float> tile_max;     // prefill: per-tile block peaks (block_max), maxed afterwards
    std::vector<uint8_t> q8_rows;    // a q8 cache's queries as q8 rows (codes, fp16 scales)
    std::vector<float> q_rounded;    // and those rows read back: the queries every kernel sees
};

// Makes the keys of a kv head readable through the problem's views just before the kernels read
// them. The KV store decodes compressed blocks there, one key range at a time, so it holds the
// decoded keys of one range instead of a whole head's.
class KeySource {
public:
    virtual ~KeySource() = default;
    // Called on the thread that called attention(), outside any task: every read of the previous
    // range has finished, and the kernels read only keys [key_begin, key_end) of kv head `head`
    // until the next call. May use the pool itself.
    virtual void prepare(int head, int key_begin, int key_end) = 0;
};

// True if kernels for isa are compiled in and this CPU can run them.
bool isa_available(Isa isa);

// The kernel set attention() runs for isa on this CPU ("scalar", "avx2", "avx512", "avx512-vnni",
// "avx512-bf16", "neon"; the AVX-512 one follows the CPU's extensions), or null if unavailable.
const char* attention_kernels_name(Isa isa);

// Runs the attention with the kernels of isa (std::invalid_argument if unavailable or if the
// problem is malformed). pool (a ThreadPool or a SpinTeam) may be null (single thread). With a key source, the work is the
// same (same splits and tiles, so bit-identical results) but ordered by key range: decode runs
// its (head, split) tasks one after another on the calling thread, prefill one head's tiles at a
// time.
void attention(const AttentionProblem& problem, Isa isa, Team* pool, AttentionWorkspace& ws,
               KeySource* source = nullptr);

// The n_q queries [n_q][n_heads][head_dim] as attention() over a cache of `dtype` (its storage
// type) uses them: a q8 cache's rounded to q8 rows when n_q > 1 (the codes into `codes`, read
// back into `rounded`, which is returned), else unchanged (q is returned). Callers that score keys
// outside attention() (token peaks) take these, so that their softmax is the kernels'.
const float* attention_queries(KvDtype dtype, const float* q, int n_q, int n_heads, int head_dim,
                               std::vector<uint8_t>& codes, std::vector<float>& rounded);

// Conversion of n_rows rows of head_dim elements between fp32 and the cache row format,
// bit-identical on every ISA (round-to-nearest-even; the same bytes as fp16.h and
// kv_rows_from_f32). The rotation of q4r is not part of it.
void convert_from_f32(Isa isa, KvDtype dtype, const float* src, void* dst, size_t n_rows, int head_dim);
void convert_to_f32(Isa isa, KvDtype dtype, const void* src, float* dst, size_t n_rows, int head_dim);

// hadamard_rows (kv_dtype.h) with the kernels of isa, bit-identical to it: what a rotated cache
// (q8r, q4r) applies to every key and value it appends and to every query row and output row it
// attends (n a power of two).
void rotate_rows(Isa isa, float* rows, size_t n_rows, int n);

}  // namespace mnn_h2o
