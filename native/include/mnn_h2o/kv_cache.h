// The KV cache of a decoder: per layer and per kv head, a list of fixed-size blocks for K and one
// for V, token-major inside a block, in the cache dtype. It owns the attention op over itself.
//
// Each (layer, kv head) has its own length and block list, so heads of one layer may hold
// different numbers of tokens (per-head eviction budgets). append() adds the same new tokens to
// every head; attention is causal per head relative to that head's length.
//
// Not thread-safe: use one KvCache from one thread at a time (its own worker threads are
// internal to attend/step).
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "mnn_h2o/attention.h"
#include "mnn_h2o/block_pool.h"
#include "mnn_h2o/cpu_features.h"
#include "mnn_h2o/thread_pool.h"

namespace mnn_h2o {

struct KvCacheConfig {
    int n_layers = 0;
    int n_kv_heads = 0;
    int head_dim = 0;      // multiple of 16 in [16, 256]
    int n_heads = 0;       // query heads, a multiple of n_kv_heads (GQA)
    KvDtype dtype = KvDtype::F16;
    int block_tokens = 64; // multiple of 16
    int max_tokens = 8192; // per (layer, kv head)
    int threads = 1;       // attention threads, counting the caller
};

class KvCache {
public:
    // Throws std::invalid_argument for an unsupported configuration.
    explicit KvCache(const KvCacheConfig& config);
    KvCache(const KvCache&) = delete;
    KvCache& operator=(const KvCache&) = delete;

    const KvCacheConfig& config() const { return cfg_; }
    int group() const { return cfg_.n_heads / cfg_.n_kv_heads; }
    // Blocks needed for max_tokens: the row width a block-score array needs at most.
    int max_blocks() const { return (cfg_.max_tokens + cfg_.block_tokens - 1) / cfg_.block_tokens; }

    // Appends n_tokens tokens to every kv head of layer. k and v are float32
    // [n_tokens][n_kv_heads][head_dim], converted to the cache dtype. Throws std::length_error if
    // a head would exceed max_tokens, std::bad_alloc if memory runs out (nothing is appended then).
    void append(int layer, const float* k, const float* v, int n_tokens);

    // Attention of n_q new queries q [n_q][n_heads][head_dim] (RoPE applied) over the cache of
    // layer, written to out [n_q][n_heads * head_dim]. Query i sees the first
    // length - n_q + i + 1 tokens of its kv head. Scale 1/sqrt(head_dim), exact softmax.
    // If block_scores is set, block_scores[h * scores_stride + b] += the probability mass that
    // block b of kv head h received over all n_q queries and the group's query heads;
    // scores_stride must cover every block of every head (max_blocks() always does).
    void attend(int layer, const float* q, int n_q, float* out, float* block_scores = nullptr,
                size_t scores_stride = 0, Isa isa = best_isa());

    // append() then attend() of the same n_tokens positions: one call per layer per step. The
    // arguments are checked before anything is appended.
    void step(int layer, const float* q, const float* k, const float* v, int n_tokens, float* out,
              float* block_scores = nullptr, size_t scores_stride = 0);

    int length(int layer, int head) const;
    // Bytes of KV blocks currently held (exact; blocks are block_tokens * head_dim * dtype size
    // bytes, rounded up to 64). bytes_mapped() is the address space of the pool's slabs.
    size_t bytes_held() const { return pool_.bytes_held(); }
    size_t bytes_mapped() const { return pool_.bytes_mapped(); }

    // Copies the length(layer, head) cached keys and values of one head out as float32
    // [length][head_dim] each.
    void read(int layer, int head, float* k_out, float* v_out) const;

    // Keeps the first n_tokens tokens of one head and gives the blocks past them back to the
    // pool (and their memory to the OS). The last step of compacting a head after eviction.
    void truncate(int layer, int head, int n_tokens);

    // Empties every head and returns all memory.
    void reset();

    // The block list of one head, for compaction and inspection: block i holds tokens
    // [i*block_tokens, (i+1)*block_tokens) of which the first length() are valid.
    KvHeadView view(int layer, int head) const;

private:
    struct Head {
        std::vector<void*> k_blocks, v_blocks;
        int length = 0;
    };

    Head& head(int layer, int h);
    const Head& head(int layer, int h) const;
    void check_layer(int layer) const;
    void check_append(int layer, const float* k, const float* v, int n_tokens) const;
    void check_attend(int layer, const float* q, int n_q, const float* out, const float* block_scores,
                      size_t scores_stride, int extra_tokens) const;

    KvCacheConfig cfg_;
    size_t row_bytes_;
    Isa isa_;  // for dtype conversion
    BlockPool pool_;
    std::unique_ptr<ThreadPool> threads_;
    std::vector<Head> heads_;  // [layer][kv head]
    std::vector<KvHeadView> views_;
    AttentionWorkspace workspace_;
};

}  // namespace mnn_h2o
