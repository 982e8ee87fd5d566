// The block lists of one (layer, kv head) of the KV cache, shared by the cache and the parts it
// owns that change them (the lossless store, lossless_stage.h).
#pragma once

#include <vector>

namespace mnn_h2o {

// Block i holds tokens [i*block_tokens, (i+1)*block_tokens) of the head, K and V in separate
// pool blocks; the first `length` tokens are valid. A block the store holds compressed has
// nullptr in both lists (its bytes live in a Gear frame; lossless_stage.h).
struct KvHeadBlocks {
    std::vector<void*> k_blocks, v_blocks;
    int length = 0;
};

}  // namespace mnn_h2o
