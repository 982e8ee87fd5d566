// The store's timings (encode_us, decode_us, async_wait_us, ...) in microseconds of a steady clock.
#pragma once

#include <chrono>

namespace mnn_h2o::store {

using Clock = std::chrono::steady_clock;

inline double micros_since(Clock::time_point t0) {
    return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

}  // namespace mnn_h2o::store
