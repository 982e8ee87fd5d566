// The H2O state of a KvCache: per (layer, kv head, block) attention scores, their EMA, the update
// schedule, the budget and the per-layer statistics. KvCache owns one while eviction is enabled
// and calls into it from step(), end_step(), evict() and truncate(); see docs/eviction.md.
//
// Scores. During an interval between two updates the attention kernel adds, per block, the
// softmax mass its queries gave the block (summed over queries and the GQA group's query heads)
// to accumulator(layer). record_step() counts, per block, how many (query, query head) pairs could
// see it: a decode query sees every block, prefill query p only blocks starting at or before p.
// At an update, mass / count is the block's mean attention probability in the interval, folded
// into an EMA (blocks new since the previous update start at their mean), and the interval
// restarts.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "mnn_h2o/cache/snapshot_io.h"
#include "mnn_h2o/eviction/eviction_policy.h"
#include "mnn_h2o/eviction/eviction_config.h"
#include "mnn_h2o/cache/kv_cache_config.h"

namespace mnn_h2o {

// Why an update left a head as it was. below_trigger and within_budget are the normal cases;
// the last two mean the target cannot be met (see docs/eviction.md).
enum class SkipReason { BelowTrigger = 0, WithinBudget, FloorsExceedTarget, TargetUnreachable };
constexpr int kSkipReasons = 4;
const char* skip_reason_name(SkipReason reason);  // "below_trigger", "within_budget", ...

// Counters of one layer since the cache was created or reset. Kept whether or not eviction is
// enabled (tokens_seen is what the uncompressed size is computed from).
struct EvictionLayerStats {
    int64_t tokens_seen = 0;   // tokens appended to the layer (every head gets each one)
    int64_t evictions = 0;     // plans applied (one per compacted head)
    int64_t blocks_freed = 0;  // pool blocks released by them, K and V blocks counted separately
    int64_t invalid_plans = 0; // plans rejected by evict()
    double policy_us = 0.0;    // scoring and choosing blocks, at updates
    double compact_us = 0.0;   // applying plans (moving rows, releasing blocks)
    std::array<int64_t, kSkipReasons> skipped{};  // (head, update) pairs left alone, by reason
};

// A snapshot of the statistics (KvCache::eviction_stats()). Bytes count K and V.
struct EvictionStats {
    struct Layer {
        EvictionLayerStats counters;
        std::vector<int> held;  // tokens held per kv head
        size_t bytes_held = 0;  // blocks held * block bytes
    };
    std::vector<Layer> layers;
    size_t bytes_held = 0;          // all layers, exactly what the block pool hands out
    size_t bytes_uncompressed = 0;  // tokens_seen of every layer in the cache dtype, no block rounding
    double lossy_ratio = 1.0;       // bytes_uncompressed / bytes_held (1 when both are 0)
    // The same tokens as fp16 rows, and bytes_f16 / bytes_held: what eviction and a quantised
    // dtype save together (lossy_ratio is eviction's part alone).
    size_t bytes_f16 = 0;
    double whole_model_ratio = 1.0;
    double policy_us = 0.0;
    double compact_us = 0.0;
    int64_t updates = 0;            // end_step calls that ran a policy update
};

// A kept-first token's (or block's) score: kKeptFirst + its own. Own scores (a pass's
// probabilities, predicted scores) lie in [0, 1], so the kept-first rank above every other and
// among themselves by their own, and subtracting it gives the own score back.
constexpr float kKeptFirst = 2.f;

class EvictionState {
public:
    // cache must be a valid KvCache configuration. Throws std::invalid_argument naming the bad
    // field if config is invalid for it.
    EvictionState(const EvictionConfig& config, const KvCacheConfig& cache);

    const EvictionConfig& config() const { return cfg_; }  // layer_end resolved
    // Whether eviction acts on layer: one of [layer_start, layer_end) without a sliding window
    // (KvCacheConfig::windows: a window layer holds its window, and nothing more to evict).
    bool collects(int layer) const {
        return layer >= cfg_.layer_start && layer < cfg_.layer_end && !window_of_[static_cast<size_t>(layer)];
    }
    int evicting_layers() const { return n_evicting_; }

    // The accumulator the kernel adds to for a collecting layer: [n_kv_heads][stride()].
    float* accumulator(int layer);
    size_t stride() const { return stride_; }
    // A step of n_q queries ran on a head that now holds n_keys tokens: count who saw what (the
    // window's queries too, after begin_window).
    void record_step(int layer, int head, int n_keys, int n_q);

    // Observation window, for policies whose signals() ask for it (else these do nothing and
    // window_accumulator is null). Before a collecting layer's step of n_q queries: how many of
    // its last queries go to the window, min(W, n_q) with W the policy's window_queries(). The
    // window holds the most recent queries, at most W: a step that would overflow it, and the
    // first step after an update, start it afresh; smaller steps add to it.
    int begin_window(int layer, int n_q);
    // Where the kernel adds the window queries' masses: [n_kv_heads][stride()].
    float* window_accumulator(int layer);
    bool wants_queries() const { return signals_.queries; }
    // The step's window queries (its last begin_window() ones) join the query statistics.
    // q: [n_q][n_kv_heads * group][head_dim], in the space of the stored keys.
    void record_queries(int layer, const float* q, int n_q);
    const PolicySignals& signals() const { return signals_; }

    // Context reconstruction (policies whose signals() ask for it; else null / nothing): where the
    // kernel keeps the largest probability each block of a collecting layer receives from the
    // pass's queries, [n_kv_heads][stride()]; then, once the pass is over, each held block's
    // reconstruction score becomes the larger of its score and that peak (blocks [0,
    // blocks_of(lengths[h])) of each head; a block without a score takes the peak), and the peaks
    // restart.
    float* reconstruction_accumulator(int layer);
    void finish_reconstruction(int layer, const int* lengths);
    // The pass's per-token peaks of a collecting layer, [n_kv_heads][token_stride()] (null unless
    // reconstruction): the largest probability each held token receives from the pass's queries
    // (token_peaks.h; the cache adds each step's). finish_reconstruction() keeps them, with the
    // block scores from before the pass, until the layer's next update: that update plans tokens,
    // not blocks (plan_tokens), and the compaction it makes gives each new block the largest
    // score of its kept tokens; then they are dropped.
    float* token_peak_accumulator(int layer);
    // Predicted peaks (signals().predicted): the last n of the `length` tokens head h holds get
    // scores[0, n) as their token peaks, and each of their blocks' reconstruction score the
    // largest of its tokens' so far; they wait for the next update as a pass's peaks do.
    // A token's predicted score joins the peaks it already has (KvCache::set_query_peaks) by their max.
    void add_token_scores(int layer, int head, int length, int n, const float* scores);
    // Around peaks the cache adds to head h's `length` tokens outside a pass (query peaks): before,
    // the tokens without a pending peak get 0 and the block scores are kept as those from before;
    // after, each block's score becomes the largest of its tokens' peaks and the tokens count as
    // scored, waiting for the next update as a pass's peaks do.
    void open_token_peaks(int layer, int head, int length);
    // The prompt's end (KvCache::set_prompt_end_share): of head h's tokens [first, length) (the
    // prompt's), the m with the largest `peaks` (ties: the later token) are kept first: their
    // token score becomes kKeptFirst + their own (0 for one without any yet), above any own score,
    // and their blocks' reconstruction scores at least that; the other tokens' scores are kept.
    // They wait for the next update as a pass's peaks do; the blocks the plan then makes from them
    // score kKeptFirst + their tokens' largest own score, until release_kept_first.
    void keep_top_tokens(int layer, int head, int first, int length, const float* peaks, int m);
    // The next prompt's end: the kept-first marks of head h's `length` tokens and blocks taken back
    // (their own scores again), so that each prompt's end keeps its share first and no more: the
    // marks of 32 turns do not pile up into a cache that keeps only its latest tokens.
    void release_kept_first(int layer, int head, int length);
    void close_token_peaks(int layer, int head, int length);
    int window_size() const { return window_size_; }
    size_t token_stride() const { return token_stride_; }
    bool token_peaks_pending(int layer) const;
    // A head's token score: the largest of its pass peak and its block's score from before the
    // pass; NaN for a token no pass has scored (written since). t < the head's length.
    float token_score(int layer, int head, int t) const;
    // A head's reconstruction score of block b: NaN if none (no pass has scored it, or the policy
    // takes none).
    float reconstruction_score(int layer, int head, int block) const;

    // Counts decode tokens; true when an update is due (every update_interval tokens).
    bool count_decode_tokens(int n_tokens);
    void count_update() { ++updates_; }
    int64_t updates() const { return updates_; }

    // Keep ratio of an evicting layer: target_keep_ratio, or the one that gives the whole model
    // target_lossy_ratio, or (kv_budget_bytes) the share of tokens_seen that cap_blocks() allows
    // (1 with no token yet). <= 0 when that target cannot be reached by the evicting layers alone.
    double keep_ratio(int64_t tokens_seen = 0) const;
    // kv_budget_bytes as blocks per head of an evicting layer: the cap's blocks (K and V, every
    // kv head) less those the layers outside the range hold (all blocks of tokens_seen tokens),
    // shared equally by the evicting layers, rounded down: held bytes stay <= the cap.
    double cap_blocks(int64_t tokens_seen) const;
    // The keep ratio of one evicting layer: keep_ratio(), or with layer_budget "pyramid" the
    // PyramidKV share: keep_ratio() * (1 + s * (1 - 2 i / (n - 1))) for the i-th of n evicting
    // layers, so the first keeps most and the last least, the mean (so the whole-model total) is
    // unchanged; the slope s = min(0.5, 1 / keep_ratio() - 1, 1 - F / (keep_ratio() * tokens_seen))
    // (>= 0) keeps every layer's keep ratio <= 1 and the last layer's budget >= the configured
    // floors F = sink_tokens + recent_tokens. layer < 0: keep_ratio().
    double layer_keep_ratio(int layer, int64_t tokens_seen) const;
    // Blocks a head of a layer that has seen tokens_seen tokens may keep: the blocks its budget
    // of layer_keep_ratio(layer, tokens_seen) * tokens_seen tokens needs (layer < 0: uniform).
    int budget_blocks(int64_t tokens_seen, int layer = -1) const;
    // The floors, in tokens, that apply to a head of `length` tokens in a layer that has seen
    // tokens_seen: the configured sink_tokens / recent_tokens, unless they take more than
    // max_floor_share of the head's budget; then both are shrunk in proportion, to whole blocks
    // (see select_head). Plans are validated against these.
    void floor_tokens(int64_t tokens_seen, int length, int* sink_tokens, int* recent_tokens, int layer = -1) const;
    // Whether an update would evict anything from the layer (the prefill trigger).
    bool over_budget(int layer, int64_t tokens_seen, const int* lengths) const;
    // layer_budget "global": one budget for every kv head of every evicting layer.
    bool global_budget() const { return cfg_.layer_budget == "global"; }

    // Folds the interval's scores of layer into the EMA and starts a new interval. lengths are
    // the tokens each kv head holds.
    void update_scores(int layer, const int* lengths);
    // The plan for each kv head of layer: (*plans)[h] empty leaves head h as it is. Heads left
    // alone are counted in stats->skipped.
    // rows: the head's K/V rows, needed by policies whose signals() ask for keys or values
    // (std::invalid_argument without).
    void plan(int layer, int64_t tokens_seen, const int* lengths, std::vector<std::vector<TokenRun>>* plans,
              EvictionLayerStats* stats, const HeadRowReader* rows = nullptr);
    // layer_budget "global" (KVzip): the eligible heads of all evicting layers keep the sum of their
    // budgets between them; their non-floor blocks are ranked together (floors stay per head). Arrays
    // over the evicting layers, i = layer - layer_start: tokens_seen[i], lengths[i * n_kv_heads + h],
    // (*plans)[i * n_kv_heads + h] (empty: head left alone); stats[layer] (indexed by layer).
    bool over_budget_global(const int64_t* tokens_seen, const int* lengths) const;
    // headroom: the plan keeps one block per pooled head less than the budget (at most 1/64 of
    // it, and while the floors allow), for decode: the cache grows by a token per head a step, so a plan made exactly to the
    // budget is followed by another on the next block boundary of any head, nearly every step, and
    // each plan ranks every held block (every held token under predicted scores).
    void plan_global(const int64_t* tokens_seen, const int* lengths, std::vector<std::vector<TokenRun>>* plans,
                     EvictionLayerStats* stats, const HeadRowReader* rows = nullptr, bool headroom = false);

    // A head of a collecting layer holding old_length tokens was compacted by runs (a valid
    // plan) or truncated to n_tokens: moves its scores along. A new block made of tokens of
    // several old blocks gets the token-weighted mean of their values.
    void compact(int layer, int head, const std::vector<TokenRun>& runs, int old_length);
    void truncate(int layer, int head, int old_length, int n_tokens);
    // Forgets every score and the schedule (the cache was emptied).
    void reset();

    // EMA of block b of a head; NaN if the block has not been through an update yet.
    float score(int layer, int head, int block) const;

    // The saved-session snapshot of this state (docs/session_format.md "KVCS", Eviction): config,
    // schedule, policy state and every evicting layer's scores (eviction_snapshot.cpp). load() reads
    // one into a fresh state made with the same config and cache shape; throws SnapshotError for
    // bytes that do not decode or a config that differs. Callers load into a new state and keep
    // it only on success.
    void save(SnapshotWriter& w) const;
    void load(SnapshotReader& r);

private:
    struct HeadScores {
        // Visibility counts in suffix-difference form: block b was seen sum_{j >= b} seen[j]
        // times, so a step adds to all blocks before k in O(1). Doubles: counts of a block
        // compacted from several are token-weighted means.
        std::vector<double> seen;
        std::vector<float> ema;
        int n_scored = 0;  // blocks [0, n_scored) have an EMA
        std::vector<double> wseen;  // the window's visibility counts, in the same form as seen
        int window_blocks = 0;      // blocks the window may have touched (what a restart zeroes)
        std::vector<double> pos;    // position of each block's first token
        int n_pos = 0;              // blocks [0, n_pos) have one
        std::vector<float> recon;   // reconstruction scores, NaN = none (reconstruction policies)
        // Pending token peaks (token_peak_accumulator): tokens [0, n_tpeak) have one; recon_prev
        // is recon from before the passes that made them; token_plan: the plan made from them is
        // about to be applied (compact() then scores the new blocks from them and drops them).
        int n_tpeak = 0;
        std::vector<float> recon_prev;
        bool token_plan = false;
    };
    struct LayerScores {
        std::vector<float> acc;        // [n_kv_heads][stride_]
        std::vector<float> wacc;       // the window's masses, [n_kv_heads][stride_] (window policies)
        std::vector<double> qsum, qsq; // the window's queries: [n_kv_heads][group][head_dim] sums
        int window_count = 0;          // queries in the window
        int step_window = 0;           // of them, from the current step
        bool window_restart = true;    // the next step starts a fresh window
        std::vector<float> rmax;       // a reconstruction pass's block peaks, [n_kv_heads][stride_]
        std::vector<float> tpeak;      // its token peaks, [n_kv_heads][token_stride_]
        std::vector<HeadScores> heads;
    };
    // One head taking part in a pooled selection (a layer's shared budget, or the global one).
    struct PoolHead {
        int layer, head, length, budget;
        EvictionLayerStats* stats;
        std::vector<TokenRun>* plan;
    };

    LayerScores& layer_scores(int layer);
    const LayerScores& layer_scores(int layer) const;
    int blocks_of(int n_tokens) const { return (n_tokens + block_tokens_ - 1) / block_tokens_; }
    // A head's selection with its floors for a budget of `budget` blocks (shrunk if they exceed
    // max_floor_share of it); its priorities are row `slot` of priority_.
    SelectHead select_head(int slot, int length, int budget, std::vector<uint8_t>* keep) const;
    // Positions of the blocks new since the last plan (the tokens a head dropped come before them).
    void place_blocks(int layer, int64_t tokens_seen, const int* lengths);
    // The pooled heads keep the sum of their budgets between them (per_head_budget within a layer,
    // or the global budget): ranked together, AdaKV's per-head minimum first.
    // headroom: plan_global's, spare_blocks() below the summed budget.
    void plan_pooled(const HeadRowReader* rows, bool headroom = false);
    int64_t spare_blocks(int64_t pooled) const;
    // plan_pooled() for a reconstruction policy's first update after a pass: the pooled heads keep
    // budget * block_tokens tokens between them (the floors in tokens), the highest token scores
    // (unscored tokens first); then, so the blocks held stay within the summed budget, the heads
    // with the smallest partial last blocks drop those tokens (their lowest-scored non-floor ones).
    void plan_tokens(bool headroom = false);
    float token_score(const LayerScores& ls, const HeadScores& hs, int head, int t) const;
    // Forgets a head's pending token peaks (its block scores already hold the pass's peaks).
    void drop_token_peaks(int layer, int head);
    // compact()'s part for a head with pending token peaks.
    void move_token_peaks(int layer, int head, const std::vector<TokenRun>& runs, int old_length);
    // Visibility counts (seen[] or wseen[] of a head) from suffix-difference form to plain
    // counts and back.
    static void materialise_seen(std::vector<double>& seen, int n_blocks);
    static void difference_seen(std::vector<double>& seen, int n_blocks);
    // Blocks of K (or V) a kv head of the layers eviction leaves alone holds after tokens_seen
    // tokens: every token's, or a window layer's window (less than a block more).
    double kept_blocks(int64_t tokens_seen) const;

    // The ScoreContext of head h for the policy, its inputs computed into the scratch below.
    ScoreContext context(int layer, int h, int length, const HeadRowReader* rows);

    EvictionConfig cfg_;
    int n_layers_, n_kv_heads_, group_, block_tokens_, head_dim_;
    double dtype_gain_;  // quantised dtypes: f16 row bytes / cache row bytes; float types: 1
    size_t block_bytes_; // a pool block of K or V, as BlockPool rounds it
    size_t stride_;
    size_t token_stride_;  // stride_ * block_tokens_: a token slot per position up to max_tokens
    std::unique_ptr<EvictionPolicy> policy_;
    PolicySignals signals_;
    int window_size_;  // queries in a full observation window
    std::vector<LayerScores> layers_;  // [layer - layer_start] (a window layer's: never used)
    std::vector<int> window_of_;       // [layer]: its sliding window, 0 for a global layer
    int n_evicting_ = 0;               // collecting layers
    std::vector<int> evicting_rank_;   // [layer]: its place among the collecting layers (pyramid)
    int64_t decode_tokens_ = 0;        // since the last decode update
    int64_t updates_ = 0;

    // Scratch reused by plan() and compact(), so updates allocate nothing once warm.
    std::vector<float> priority_;                // [slot][stride_]: a head, or a pooled head
    std::vector<std::vector<uint8_t>> keep_;     // [slot]
    std::vector<PoolHead> pool_;                 // plan_pooled()'s heads, slot = index
    std::vector<int> select_heads_;              // heads taking part in a selection
    std::vector<SelectHead> select_;             // and their floors, in the same order
    std::vector<SelectHead> one_;                // one head's selection (head_floor_share)
    std::vector<uint64_t> candidates_;
    std::vector<int> order_;                     // keep_top_tokens(): a head's tokens by peak
    std::vector<float> token_priority_;          // plan_tokens(): the pooled heads' tokens end to end
    std::vector<SelectTokensHead> token_heads_, one_token_head_;
    std::vector<std::pair<float, int>> trim_;
    std::vector<std::pair<int, int>> partial_;   // (tokens in the last block, pooled head)
    std::vector<double> remap_sum_, remap_count_;
    std::vector<float> window_, q_mean_, q_var_, k_rows_, v_rows_;  // a head's ScoreContext inputs
};

}  // namespace mnn_h2o
