// The Python KvCache object: the native cache and the lock that serialises the Python threads
// entering it; shared by the bindings that take a cache (bind_kv_cache.cpp, bind_decode_token.cpp).
#pragma once

#include <pybind11/pybind11.h>

#include <mutex>

#include "mnn_h2o/cache/kv_cache.h"

// The cache plus a lock: the GIL is released during native work, so two Python threads could
// otherwise enter one cache at once.
struct PyKvCache {
    explicit PyKvCache(const mnn_h2o::KvCacheConfig& config) : cache(config) {}
    mnn_h2o::KvCache cache;
    std::mutex mutex;
};

// Scope of one native call: releases the GIL, then takes the cache lock (in that order, so a
// thread never waits for the cache while holding the GIL); undone in reverse.
class NativeCall {
public:
    explicit NativeCall(PyKvCache& c) : lock_(c.mutex) {}

private:
    pybind11::gil_scoped_release release_;
    std::lock_guard<std::mutex> lock_;
};

