#include "mnn_h2o/store/store_stats.h"

namespace mnn_h2o {

const char* store_fallback_name(StoreFallback reason) {
    switch (reason) {
        case StoreFallback::Incompressible: return "incompressible";
        case StoreFallback::EncodeError: return "encode_error";
        case StoreFallback::VerifyMismatch: return "verify_mismatch";
        case StoreFallback::AllocFailure: return "alloc_failure";
        case StoreFallback::WorkerException: return "worker_exception";
    }
    return "?";
}

StoreLayerStats& StoreLayerStats::operator+=(const StoreLayerStats& from) {
    chunks_encoded += from.chunks_encoded;
    chunks_stored += from.chunks_stored;
    raw_bytes += from.raw_bytes;
    compressed_bytes += from.compressed_bytes;
    stored_raw_bytes += from.stored_raw_bytes;
    stored_blob_bytes += from.stored_blob_bytes;
    encode_us += from.encode_us;
    verify_us += from.verify_us;
    decode_us += from.decode_us;
    verify_mismatches += from.verify_mismatches;
    cache_hits += from.cache_hits;
    cache_misses += from.cache_misses;
    dissolved += from.dissolved;
    repacked += from.repacked;
    merged += from.merged;
    decode_batches += from.decode_batches;
    for (int r = 0; r < kStoreFallbacks; ++r) fallbacks[r] += from.fallbacks[r];
    return *this;
}

}  // namespace mnn_h2o
