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

// What a policy sees of one kv head.
struct HeadBlocks {
    int n_blocks = 0;               // blocks held
    const float* scores = nullptr;  // [n_blocks] EMA of the mean attention each block received
};

class EvictionPolicy {
public:
    virtual ~EvictionPolicy() = default;
    // Writes a priority for every block of head (higher = kept first) to priority[n_blocks].
    // select_blocks breaks ties in favour of the more recent block and ranks NaN lowest.
    virtual void rank(const HeadBlocks& head, float* priority) = 0;
    // Back to the state right after construction (the random policy reseeds).
    virtual void reset() {}
};

// The policy names make_policy knows, for messages.
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

}  // namespace mnn_h2o
