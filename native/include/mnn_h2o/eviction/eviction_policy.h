// Which blocks of a kv head to keep when the cache evicts, and the plans that say so.
//
// In the style of kvpress, a policy only ranks blocks (a priority per block, higher is kept
// first); budgets, floors (sink and recent blocks are always kept) and turning the chosen blocks
// into a plan are shared (select_blocks, plan_from_blocks), so policies differ in one small
// method and are compared under exactly the same budget.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mnn_h2o {

// A run of kept tokens of one head: the tokens [offset, offset + length) of what the head holds.
struct TokenRun {
    int64_t offset = 0;
    int64_t length = 0;
};

// Why a plan of runs over a head holding `length` tokens cannot be applied, or an empty string.
// A valid plan is non-empty, its runs are non-empty, sorted, non-overlapping (touching is fine)
// and inside [0, length); it keeps the first min(sink_tokens, length) tokens, the last
// min(recent_tokens, length) tokens and always the last token.
std::string plan_error(const std::vector<TokenRun>& runs, int length, int sink_tokens, int recent_tokens);

// The plan keeping the blocks b with keep[b] of a head holding `length` tokens in blocks of
// block_tokens (adjacent kept blocks merge into one run). Written to *runs.
void plan_from_blocks(const std::vector<uint8_t>& keep, int length, int block_tokens, std::vector<TokenRun>* runs);

// Reads the rows a kv head holds, as f32 [length][head_dim] each, in the cache's storage space
// (a rotated dtype gives its rotated rows: norms and dot products with equally rotated queries are
// those of the true rows). k or v may be null: not read.
class HeadRowReader {
public:
    virtual ~HeadRowReader() = default;
    virtual void read(int layer, int head, float* k, float* v) const = 0;
};

// What a policy sees of one kv head at an update (docs/eviction.md "Policies"). Arrays are
// [n_blocks]; block b holds the head's tokens [b * block_tokens, ...) of its `length`.
struct ScoreContext {
    int layer = 0, head = 0;
    int n_blocks = 0, block_tokens = 0, length = 0, head_dim = 0;
    int group = 0;                  // query heads reading this kv head
    const float* ema = nullptr;     // EMA of the mean attention probability each block received
    // Mean attention probability each block got from the observation window: the most recent
    // queries, at most window_queries() of them (after the prompt's single cut: its last ones;
    // in decode: those since the last update). Null unless signals().window.
    const float* window = nullptr;
    const double* positions = nullptr;  // position of each block's first token (exact for block plans)
    // The window's queries of each of the group's query heads: mean and diagonal variance,
    // [group][head_dim], over q_count queries (0: none yet), in the same space as the rows the
    // reader gives. Null unless signals().queries.
    const float* q_mean = nullptr;
    const float* q_var = nullptr;
    int q_count = 0;
    // The head's keys and values, read at plan time (no per-block vectors are stored). Null
    // unless signals().keys or .values; rows are read into k_rows / v_rows then.
    const float* k_rows = nullptr;  // [length][head_dim]
    const float* v_rows = nullptr;
    // The largest attention probability each block received from the queries of the context
    // reconstruction passes so far (KVzip); NaN for a block no pass has scored (tokens written
    // since the last pass). Null unless signals().reconstruction.
    const float* reconstruction = nullptr;
};

// The inputs a policy uses beyond the EMA: the state collects or reads only these, so h2o,
// streaming and random cost what they did.
struct PolicySignals {
    bool window = false;   // observation-window masses (the kernel's second score output)
    bool queries = false;  // mean / variance of the window's queries
    bool keys = false;     // the head's K rows at plan time
    bool values = false;   // the head's V rows at plan time
    // Reconstruction scores, per block and (until the next update) per token, on KVzip's scale:
    // the peaks of a context reconstruction pass (KvCache::begin_reconstruction), which the engine
    // runs after each prompt for such a policy, unless `predicted`.
    bool reconstruction = false;
    // The reconstruction scores are predicted, not measured: the engine gives each token's as it
    // enters the cache (KvCache::set_token_scores), and no pass runs.
    bool predicted = false;
};

class EvictionPolicy {
public:
    virtual ~EvictionPolicy() = default;
    // Writes a priority for every block of head (higher = kept first) to priority[n_blocks].
    // select_blocks breaks ties in favour of the more recent block and ranks NaN lowest. With a
    // shared layer budget (per_head_budget) priorities of different heads are compared, so they
    // must be on one scale: attention probabilities, or a distribution over the head's blocks.
    virtual void rank(const ScoreContext& head, float* priority) = 0;
    virtual PolicySignals signals() const { return {}; }
    // Queries in the observation window, given eviction.observation_window (TOVA: the latest one).
    virtual int window_queries(int observation_window) const { return observation_window; }
    // Back to the state right after construction (the random policy reseeds).
    virtual void reset() {}
    // The state a policy carries between updates, as bytes (the saved-session snapshot), and back.
    // Stateless policies: empty. set_state throws std::invalid_argument for bytes state() of the
    // same policy did not write (nothing changes then).
    virtual std::string state() const { return {}; }
    virtual void set_state(const std::string& state);
};

// The registry: every policy's name, in a fixed order, is what config, bindings, the C API and
// the eval accept. Adding a policy = one class in eviction_policies.cpp, one entry there.
const std::vector<std::string>& policy_list();
// The names for messages: "'h2o', 'snapkv', ... or 'random'".
const char* policy_names();
bool is_policy_name(const std::string& name);
// Throws std::invalid_argument for an unknown name.
std::unique_ptr<EvictionPolicy> make_policy(const std::string& name, uint64_t seed);

// One head taking part in a selection: its priorities and floors.
struct SelectHead {
    int n_blocks = 0;
    const float* priority = nullptr;  // [n_blocks]
    int sink_blocks = 0;              // blocks [0, sink_blocks) are kept
    int recent_first = 0;             // blocks [recent_first, n_blocks) are kept
    std::vector<uint8_t>* keep = nullptr;  // out: keep[b] for b < n_blocks (resized)
};

// Number of floor blocks of a head (sink and recent, counted once where they overlap).
int floor_blocks(const SelectHead& head);

// select_blocks takes at most this many heads at once, and blocks below 2^20 (max_tokens <= 2^24
// with blocks of >= 16 tokens): a candidate is ranked by one 64-bit key.
constexpr int kMaxSelectHeads = 4096;

// Keeps every floor block of every head, then the `extra` highest-priority other blocks of all
// the heads together (one head: its own budget; all heads of a layer: a shared budget). extra is
// clamped to the number of candidates. `scratch` is reused between calls to avoid allocations.
// Throws std::invalid_argument for more than kMaxSelectHeads heads.
void select_blocks(std::vector<SelectHead>& heads, int extra, std::vector<uint64_t>* scratch);

// Token-granular selection (kvzip's first update after a reconstruction pass, docs/eviction.md
// "Reconstruction"): one head's tokens, priority per token, floors in tokens.
struct SelectTokensHead {
    int length = 0;
    const float* priority = nullptr;  // [length]
    int sink = 0;                     // tokens [0, sink) are kept
    int recent = 0;                   // tokens [length - recent, length) are kept
    std::vector<uint8_t>* keep = nullptr;  // out: keep[t] for t < length (resized)
};

// Keeps every floor token, then the `extra` highest-priority other tokens of all the heads
// together (clamped to the candidates); ties go to the later token (of the later head), NaN ranks
// lowest. Throws std::invalid_argument for 2^32 tokens or more in all.
void select_tokens(std::vector<SelectTokensHead>& heads, int64_t extra, std::vector<uint64_t>* scratch);

// The plan keeping the tokens t with keep[t] (adjacent kept tokens merge into one run).
void plan_from_tokens(const std::vector<uint8_t>& keep, std::vector<TokenRun>* runs);

}  // namespace mnn_h2o
