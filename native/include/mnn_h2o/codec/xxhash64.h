// XXH64, the 64-bit xxHash (https://github.com/Cyan4973/xxHash/blob/dev/doc/xxhash_spec.md).
//
// The Gear codec checksums every frame. FNV-1a would do, but it handles one byte per multiply
// (about 1 GB/s) and would halve the decode speed; XXH64 runs four independent lanes of 8 bytes
// and costs a small fraction of a decode. The output is the standard XXH64, so frames can be
// checked with any xxHash tool.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mnn_h2o {

uint64_t xxh64(const void* data, size_t size, uint64_t seed = 0);

}  // namespace mnn_h2o
