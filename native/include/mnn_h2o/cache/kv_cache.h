// The KV cache of a decoder: per layer and per kv head, a list of fixed-size blocks for K and one
// for V, token-major inside a block, in the cache dtype (kv_dtype.h; a rotated dtype is rotated
// on the way in and out here). It owns the attention op over itself.
//
// Each (layer, kv head) has its own length and block list, so heads of one layer may hold
// different numbers of tokens (per-head eviction budgets). append() adds the same new tokens to
// every head; attention is causal per head relative to that head's length.
//
// A layer with a sliding window (KvCacheConfig::windows) attends each query to the newest `window`
// tokens up to itself, and append() (before it appends) and step() (after it attends) give back
// the blocks no later query can see: such a layer holds at most window - 1 + block_tokens - 1
// tokens between steps. Its keys are then a
// suffix of the sequence, so length() is what it holds, not the position; tokens_seen counts
// every token. Eviction and the lossless store act on global layers only (enable_eviction and
// enable_store refuse a window layer in their scope).
//
// With eviction enabled (enable_eviction, docs/eviction.md) step() also collects attention scores for
// the evicting layers, and end_step() evicts low-scoring blocks: their memory goes back to the OS.
//
// With the lossless store enabled (enable_store, docs/kv_cache.md "Lossless store") end_step()
// also Gear-encodes cold chunks of the layers in scope; in store mode they are then held only
// compressed, and attention and read() decode them (bit-exact) when needed.
//
// Not thread-safe: use one KvCache from one thread at a time (its own worker threads are
// internal to attend/step).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "mnn_h2o/attention/attention.h"
#include "mnn_h2o/cache/block_pool.h"
#include "mnn_h2o/runtime/cpu_features.h"
#include "mnn_h2o/eviction/eviction_state.h"
#include "mnn_h2o/eviction/token_peaks.h"
#include "mnn_h2o/cache/kv_cache_config.h"
#include "mnn_h2o/cache/kv_head_blocks.h"
#include "mnn_h2o/store/lossless_stage.h"
#include "mnn_h2o/store/store_config.h"
#include "mnn_h2o/runtime/thread_pool.h"

namespace mnn_h2o {

class KvCache {
public:
    // Throws std::invalid_argument for an unsupported configuration.
    explicit KvCache(const KvCacheConfig& config);
    ~KvCache();
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
    // arguments are checked before anything is appended. With H2O enabled, the scores of the
    // evicting layers are collected too (block_scores, if given, still gets the masses).
    void step(int layer, const float* q, const float* k, const float* v, int n_tokens, float* out,
              float* block_scores = nullptr, size_t scores_stride = 0);

    // The team the attention (and the token peaks) run on: the cache's own pool, or the one lent
    // to it. A decode token lends the decode layers' team (model/decode_token.h), whose workers
    // are awake from the layer's products, so no second team's workers wake for every layer. A
    // team of another size is not taken (its splits, and so its sums, would differ). The lender
    // takes it back (nullptr) before the team goes.
    void lend_team(Team* team) { lent_team_ = team && team->size() == cfg_.threads ? team : nullptr; }
    Team* team() const { return lent_team_ ? lent_team_ : threads_.get(); }

    int length(int layer, int head) const;
    // Layer's sliding window in tokens, 0 for a global layer.
    int window(int layer) const { return cfg_.windows.empty() ? 0 : cfg_.windows[static_cast<size_t>(layer)]; }
    // Bytes the KV cache holds: raw pool blocks plus, with the store on, its frames, decode
    // cache, scratch and job copies. pool_bytes_held() is the raw blocks alone (exact; blocks are
    // block_tokens * head_dim * dtype size bytes, rounded up to 64), which is also what
    // eviction_stats() reports. bytes_mapped() is the address space of the pool's slabs.
    size_t bytes_held() const { return pool_.bytes_held() + (store_ ? store_->bytes_held() : 0); }
    size_t pool_bytes_held() const { return pool_.bytes_held(); }
    // Bytes the tokens held would take as raw blocks, wherever they live (pool or compressed
    // chunk): what eviction alone leaves, so uncompressed / kept_bytes() is the lossy ratio
    // whether or not the store is on.
    size_t kept_bytes() const;
    size_t bytes_mapped() const { return pool_.bytes_mapped(); }

    // Copies the length(layer, head) cached keys and values of one head out as float32
    // [length][head_dim] each (compressed blocks are decoded: the true values).
    void read(int layer, int head, float* k_out, float* v_out) const;

    // Keeps the first n_tokens tokens of one head and gives the blocks past them back to the
    // pool (and their memory to the OS). tokens_seen is not changed.
    void truncate(int layer, int head, int n_tokens);

    // Empties every head, returns all memory and zeroes the statistics. H2O stays enabled, with
    // its scores and schedule restarted; the store stays enabled, its jobs cancelled and all its
    // memory returned.
    void reset();

    // --- eviction (docs/eviction.md) ---------------------------------------------------------
    // Turns eviction on, or replaces the config (scores and schedule restart). Throws
    // std::invalid_argument naming the bad field; the previous state is kept then.
    void enable_eviction(const EvictionConfig& config);
    // Turns eviction off and frees the scores. The tokens held stay as they are.
    void disable_eviction();
    // The active config (layer_end resolved), or nullptr when eviction is off.
    const EvictionConfig* eviction_config() const { return eviction_ ? &eviction_->config() : nullptr; }
    // The eviction state (its scores, for inspection), or nullptr when eviction is off.
    const EvictionState* eviction_state() const { return eviction_.get(); }
    // Call once after all layers of a forward of n_tokens tokens (prefill: a prompt chunk). Runs
    // the policy update when due: after every update_interval decode tokens on every evicting
    // layer, and after a prefill forward on the evicting layers that hold more than their
    // budget. Returns true if any block was evicted (false when eviction is off). With the store
    // on, then installs finished store jobs and makes the frames of new cold chunks.
    bool end_step(int n_tokens, bool prefill);
    // Applies an explicit plan to one head: keeps the tokens of runs (see plan_error for what is
    // valid; the floors are those of the eviction config, or only the last token when eviction is
    // off) and releases the rest. Throws std::invalid_argument for an invalid plan (nothing
    // changes; counted in invalid_plans), std::out_of_range for a bad layer or head.
    void evict(int layer, int head, const std::vector<TokenRun>& runs);
    // Counters, held tokens and bytes of every layer, and the whole-model totals.
    EvictionStats eviction_stats() const;
    // The EMA scores of layer: [n_kv_heads][*n_blocks], *n_blocks the most blocks any of its heads
    // holds; NaN for blocks a head does not hold or that have not been through an update (all
    // NaN outside the evicting layers). Throws std::invalid_argument when eviction is off.
    // reconstruction: the reconstruction scores instead (NaN: none; docs/eviction.md "Reconstruction").
    std::vector<float> eviction_scores(int layer, int* n_blocks, bool reconstruction = false) const;

    // --- Context reconstruction (KVzip; docs/eviction.md "Reconstruction") ------------------------
    // Whether the eviction policy scores blocks by a reconstruction pass (the engine then runs
    // one after each prompt).
    bool eviction_reconstructs() const { return eviction_ && eviction_->signals().reconstruction && !eviction_->signals().predicted; }
    // Whether it takes predicted reconstruction scores instead (set_token_scores; no pass).
    bool eviction_predicts() const { return eviction_ && eviction_->signals().predicted; }
    // The predicted reconstruction scores of the last n_tokens tokens each kv head of an evicting
    // layer holds (the tokens its last step() appended), scores [n_kv_heads][n_tokens], each a
    // probability in [0, 1]. They are what a pass's peaks would be: each block's
    // reconstruction score becomes the largest of its tokens', and the tokens wait, ranked one
    // by one, for the layer's next update. Throws std::invalid_argument unless eviction_predicts(),
    // during a pass, for a layer outside [layer_start, layer_end), for more tokens than a head
    // holds, or for a score outside [0, 1] (NaN included; nothing changes then).
    void set_token_scores(int layer, const float* scores, int n_tokens);
    // Query peaks (predicted scores only; off after each enable_eviction): after every prompt
    // chunk's attention (a step of more than one token) on an evicting layer, the chunk's last
    // eviction.observation_window queries give each held token the largest probability any of
    // them assigns it, as a pass's queries do, and its score is the larger of that and its
    // prediction. Per model: the engine takes it from the model's scorer file, where the dev split
    // chose it (docs/eviction.md "Predicted scores"). Throws std::invalid_argument unless
    // eviction_predicts() (to turn it on).
    void set_query_peaks(bool on);
    bool query_peaks() const { return query_peaks_; }
    // The prompt's end (eviction.prompt_end_share), for policies with token scores (kvzip,
    // predicted_kvzip): set before a prompt's last step with the prompt's length in tokens, back
    // to 0 after it. On that step each evicting layer's last eviction.observation_window queries
    // give every held token its peak probability (as a pass's queries do), and the share x keep
    // ratio x prompt_tokens of the prompt's own tokens (each head's newest) with the largest peaks
    // are kept first (EvictionState::kKeptFirst), so the next plan keeps them before any token the
    // policy ranks: SnapKV's choice of what the text goes on from, with the policy's scores
    // deciding the rest. The previous prompt's kept-first marks are released first: in a
    // conversation each turn's end chooses among its own turn, and earlier turns compete by their
    // own scores. Off after each enable_eviction. Throws std::invalid_argument for a share outside
    // [0, 1], or a share with prompt_tokens < 1.
    void set_prompt_end_share(double share, int prompt_tokens);
    double prompt_end_share() const { return prompt_end_share_; }
    // A head's pending token scores (a pass's peaks or set_token_scores'), one per token it
    // holds: NaN for a token without one or when none are pending. Throws std::invalid_argument
    // unless the policy takes reconstruction scores; std::out_of_range for a bad layer or head.
    std::vector<float> token_scores(int layer, int head) const;
    // Starts a pass: the tokens stepped from now on (the repeat prompt and the context again) are
    // the pass's. Their queries attend as usual, but the evicting layers collect the largest
    // probability each block receives instead of the H2O scores, and tokens_seen ignores them.
    // Throws std::invalid_argument unless eviction_reconstructs() and no pass is under way.
    void begin_reconstruction();
    // Drops every token stepped since begin_reconstruction (their blocks go back to the pool);
    // the pass goes on (its next chunk).
    void rewind_reconstruction();
    // KVzip's chunk scoring (kvpress's KVzipPress) for the pass's next steps, until the next
    // call or the pass's end: the peaks are those of a softmax over the first
    // kReconstructionSinks held rows, the chunk being repeated and the pass's own rows, and only
    // the chunk's rows get one. The chunk is the `length` rows starting `from_end` rows before
    // the end of what each head held when the pass began (the tokens since the last pass are
    // the last rows of every head: nothing scores them before this pass, so nothing evicts
    // them); it is clipped to those rows. from_end 0: back to the full softmax over every row
    // a query sees, peaks for every held row (the default). Throws std::invalid_argument
    // outside a pass or for negative arguments.
    void set_reconstruction_window(int from_end, int length);
    static constexpr int kReconstructionSinks = 4;  // kvpress's KVzipPress n_sink
    // Rewinds, then each held block's reconstruction score becomes the larger of its score and
    // its peak in the pass, and the pass ends.
    void end_reconstruction();
    bool reconstructing() const { return reconstructing_; }

    // --- Lossless store (docs/kv_cache.md "Lossless store") -----------------------------------
    // Turns the store on (mode off: turns it off), or replaces its config: what the previous
    // config holds compressed is first drained and dissolved back to raw blocks. Throws
    // std::invalid_argument naming the bad field (nothing changes then), std::bad_alloc when the
    // old chunks cannot be made raw again (the old store stays).
    void enable_store(const StoreConfig& config);
    // Dissolves every compressed chunk back to raw blocks and stops the workers. Throws
    // std::bad_alloc when raw blocks cannot be had (the store stays on, nothing is lost).
    void disable_store();
    const StoreConfig* store_config() const { return store_ ? &store_->config() : nullptr; }
    // Counters per layer and whole-model bytes (pool, frames, cache, scratch; total ratio).
    StoreStats store_stats() const;
    // Waits for every store job under way and installs it (deterministic tests and benches).
    void drain_store();

    // --- Saved sessions (docs/session_format.md "KVCS"; kv_snapshot.cpp) ---------------------
    // The cache as it is held: per-layer counters, every head's rows in the cache dtype, the H2O
    // state. Throws std::invalid_argument when the lossless store is on (not part of the format).
    std::vector<uint8_t> snapshot() const;
    // Replaces the cache's contents by a snapshot's. The cache must have the snapshot's shape and
    // dtype, eviction on or off as it was (with the same eviction config) and the store off. Throws
    // SnapshotError (an std::invalid_argument) naming what does not match or decode: the cache is
    // unchanged then; std::bad_alloc when memory runs out (the cache is left empty).
    void restore(const uint8_t* data, size_t size);

    // The block list of one head, for compaction and inspection: block i holds tokens
    // [i*block_tokens, (i+1)*block_tokens) of which the first length() are valid. Blocks the
    // store holds compressed are nullptr.
    KvHeadView view(int layer, int head) const;

private:
    using Head = KvHeadBlocks;

    Head& head(int layer, int h);
    const Head& head(int layer, int h) const;
    void check_layer(int layer) const;
    void check_append(int layer, const float* k, const float* v, int n_tokens) const;
    void check_attend(int layer, const float* q, int n_q, const float* out, const float* block_scores,
                      size_t scores_stride, int extra_tokens) const;
    // attend() after its checks, with the observation window's masses (window_scores, of the last
    // window_queries queries; null: none).
    void attend_checked(int layer, const float* q, int n_q, float* out, float* block_scores, size_t scores_stride,
                        float* window_scores, int window_queries, Isa isa, float* block_max = nullptr);
    // step() of a reconstruction pass's tokens, after the checks and the append.
    void step_reconstruction(int layer, const float* q, int n_tokens, float* out, float* block_scores,
                             size_t scores_stride);
    // After a pass step's attention on an evicting layer: the largest probability each key held
    // before the pass got from the step's queries (q as the kernel saw them), into the state's
    // token peaks.
    void add_token_peaks(int layer, const float* q, int n_tokens);
    // The same with the window of set_reconstruction_window, and the window's block peaks.
    void add_window_peaks(int layer, const float* q, int n_tokens);
    // After a prompt chunk's attention on an evicting layer with query peaks on: the largest
    // probability each held token gets from the chunk's last n_q queries (q, as the kernel saw
    // them), into the state's token peaks.
    void add_query_peaks(int layer, const float* q, int n_q);
    // After the prompt's last step on an evicting layer (set_prompt_end_share): the peaks of the
    // step's last n_q queries q, and each head's top tokens by them kept first.
    void keep_prompt_end(int layer, const float* q, int n_q);
    // The token-peaks routine over every kv head of layer: the step's n_q newest queries q against
    // each head's held keys, the peaks of each head's first peak_n_peak_[h] keys (set by the
    // caller) into the state's token peaks.
    void layer_token_peaks(int layer, const float* q, int n_q);
    // The same into peak [n_kv_heads][peak_stride] (zeroed by the caller) instead.
    void layer_token_peaks(int layer, const float* q, int n_q, float* peak, size_t peak_stride);
    // The token-peaks routine on kv head h alone: its queries out of the step's q (n_q rows, the
    // newest), keys k [n_keys][head_dim], the peaks of the first n_peak of them into peak[].
    void head_token_peaks(const float* q, int n_q, int h, const float* k, int n_keys, int n_peak, float* peak);
    // The token peaks' scratch is as large as a layer's keys: held over a pass or a prompt's
    // chunks (each call only grows it), given back after a pass, at a decode step and at reset().
    void free_peak_scratch();
    // end_step()'s eviction part under layer_budget "global": one plan for every evicting layer.
    bool evict_global(bool due, bool prefill);
    void require_no_pass(const char* what) const;
    // read() in the storage space (rotated dtypes stay rotated); k or v may be null.
    void read_stored(int layer, int head, float* k_out, float* v_out) const;
    // The same for rows [from, to) of the head only, written from k_out / v_out's start.
    void read_stored_rows(int layer, int head, int from, int to, float* k_out, float* v_out) const;
    // end_step()'s eviction part: runs the policy update when due; true if anything was evicted.
    bool evict_due(int n_tokens, bool prefill);
    // evict() with the floors a plan must keep given explicitly: the policy's own plans are
    // checked against the floors as shrunk for the head's budget (eviction.max_floor_share).
    void evict_with_floors(int layer, int head, const std::vector<TokenRun>& runs, int sink_tokens,
                           int recent_tokens);
    // Gives the blocks past the first n_tokens tokens back to the pool.
    void release_tail(Head& hs, int n_tokens);
    // A window layer's head before an append: gives back the leading blocks that no query from
    // the next token on can see.
    void release_behind_window(Head& hs, int window);
    // Compaction by a block-aligned plan: drops the evicted blocks from the lists, then packs the
    // kept ones into the lowest addresses of the head's blocks (pack_blocks).
    void drop_blocks(Head& hs, const std::vector<TokenRun>& runs);
    // Moves the raw blocks of `list` (in list order) into the lowest addresses among them and
    // `freed`; on return `freed` holds the addresses left over, to be released.
    void pack_blocks(std::vector<void*>& list, std::vector<void*>& freed);
    // Compaction by any plan: moves the kept rows down in place, then releases the tail.
    void move_rows(Head& hs, const std::vector<TokenRun>& runs);
    void move_list_rows(std::vector<void*>& blocks, int64_t src, int64_t dst, int64_t n) const;

    KvCacheConfig cfg_;
    size_t row_bytes_;
    Isa isa_;  // for dtype conversion
    BlockPool pool_;
    std::unique_ptr<ThreadPool> threads_;
    Team* lent_team_ = nullptr;  // lend_team()
    std::vector<Head> heads_;  // [layer][kv head]
    std::vector<KvHeadView> views_;
    AttentionWorkspace workspace_;

    std::vector<EvictionLayerStats> stats_;  // [layer], kept whether or not eviction is on
    std::unique_ptr<EvictionState> eviction_;     // null when eviction is off
    std::vector<float> scores_scratch_; // step(): masses wanted by both the caller and H2O
    std::vector<float> rotated_q_;      // attend() with a rotated dtype
    std::vector<uint8_t> seen_codes_;   // attend(): a q8 cache's prompt queries as q8 rows
    std::vector<float> seen_q_;         // and read back
    // The queries the last attend() gave attention (rotated, rounded: attention_queries), which
    // the peaks and query statistics outside attention() must score with; valid until the next.
    const float* attended_q_ = nullptr;
    std::vector<int> lengths_;          // end_step(): a layer's head lengths (global: every evicting layer's)
    std::vector<int64_t> seen_;         // evict_global(): tokens_seen of every evicting layer
    std::vector<std::vector<TokenRun>> plans_;
    // A reconstruction pass: under way, and what it restores (every head's length, every layer's
    // tokens_seen).
    bool reconstructing_ = false;
    bool query_peaks_ = false;  // set_query_peaks
    double prompt_end_share_ = 0.0;  // set_prompt_end_share
    int prompt_end_tokens_ = 0;      // its prompt_tokens
    std::vector<float> end_peaks_;   // keep_prompt_end: the window's peaks, [n_kv_heads][longest head]; peak scratch
    std::vector<int> pass_lengths_;
    std::vector<int64_t> pass_seen_;
    int window_from_end_ = 0, window_length_ = 0;  // set_reconstruction_window; 0: none
    // A step's per-token peaks (layer_token_peaks): the heads' keys as f32 and the routine's scratch.
    std::vector<float> peak_keys_;
    std::vector<const float*> peak_k_;
    std::vector<int> peak_n_keys_, peak_n_peak_;
    std::vector<float> window_keys_;  // a windowed step's keys (window, sinks, pass), one head
    std::vector<float> head_q_;       // head_token_peaks: one head's queries
    TokenPeakWorkspace peak_ws_;
    // The policies' view of a head's rows (read_stored).
    struct RowReader final : HeadRowReader {
        const KvCache* cache = nullptr;
        void read(int layer, int head, float* k, float* v) const override { cache->read_stored(layer, head, k, v); }
    } row_reader_;
    std::vector<void*> freed_k_, freed_v_, slots_;  // drop_blocks() scratch
    std::unique_ptr<LosslessStage> store_;    // null when the store is off; last: it points at heads_, pool_
};

}  // namespace mnn_h2o
