// The store's jobs: an encode job's work (hash, checked frame), encode jobs on workers collected
// in full, cancelled when their head settles, failed when a worker throws; prefetch jobs handed
// back decoded or cancelled before they start; reset and destruction with jobs queued.
#include <algorithm>
#include <atomic>
#include <memory>
#include <random>
#include <vector>

#include "mnn_h2o/store/store_jobs.h"
#include "mnn_h2o/codec/xxhash64.h"

#include "store_test_support.h"
#include "test_support.h"

using namespace mnn_h2o;
using namespace mnn_h2o::store;
using namespace store_test;

namespace {

struct Blocks {
    Blocks(const ChunkCodec& codec, int n, uint32_t seed) {
        std::mt19937 rng(seed);
        for (int i = 0; i < 2 * n; ++i) bytes.push_back(kv_bytes(rng, codec.block_bytes()));
    }
    std::vector<std::vector<uint8_t>> bytes;  // K of block b at 2b, V at 2b + 1
};

std::unique_ptr<Job> encode_job(const ChunkCodec& codec, const Blocks& blocks, int layer, int head, int n) {
    auto job = std::make_unique<Job>();
    job->layer = layer;
    job->head = head;
    job->n_blocks = n;
    job->raw_size = codec.raw_bytes(n);
    for (int j = 0; j < n; ++j) {
        job->k_src.push_back(blocks.bytes[2 * j].data());
        job->v_src.push_back(blocks.bytes[2 * j + 1].data());
    }
    return job;
}

StoreConfig async_config(int threads, int max_queue = 64) {
    StoreConfig s = store_config();
    s.async_threads = threads;
    s.max_queue = max_queue;
    return s;
}

}  // namespace

static void test_run_encode() {
    const ChunkCodec codec(store_config(), cache_config());
    const Blocks blocks(codec, 2, 7);
    auto job = encode_job(codec, blocks, 0, 0, 2);
    auto b = codec.buffers();
    run_encode(codec, *job, *b, false);
    std::vector<uint8_t> raw;
    for (int j = 0; j < 2; ++j) raw.insert(raw.end(), blocks.bytes[2 * j].begin(), blocks.bytes[2 * j].end());
    for (int j = 0; j < 2; ++j) raw.insert(raw.end(), blocks.bytes[2 * j + 1].begin(), blocks.bytes[2 * j + 1].end());
    CHECK(job->hash == xxh64(raw.data(), raw.size()), "hash of K then V");
    CHECK(job->encoded && job->verified && job->blob.size() < raw.size(), "frame %zu", job->blob.size());
    CHECK(job->blob == frame_of(codec, raw, 2), "a different frame than the codec's");
    CHECK(throws<std::runtime_error>([&] { run_encode(codec, *job, *b, true); }), "injected fault");
}

static void test_async_encodes() {
    const StoreConfig cfg = async_config(2);
    const ChunkCodec codec(cfg, cache_config());
    const Blocks blocks(codec, 2, 8);
    int prefetches = 0;
    StoreJobs jobs(cfg, codec, [&](Job&, bool) { ++prefetches; });
    CHECK(jobs.async() && !jobs.full(), "workers");
    for (int i = 0; i < 8; ++i) jobs.submit(encode_job(codec, blocks, 0, i % 2, 2));
    jobs.drain();
    const auto done = jobs.take_finished();
    CHECK(done.size() == 8 && prefetches == 0, "%zu finished", done.size());
    for (const auto& job : done) CHECK(job->verified && !job->failed && job->progress.load() == kDone, "job");
    CHECK(jobs.peak() >= 1, "peak %d", jobs.peak());
    CHECK(jobs.bytes() > 0, "the workers' buffers are not counted");
    jobs.reset();
    CHECK(jobs.bytes() == 0 && jobs.peak() == 0, "reset kept %zu bytes", jobs.bytes());
}

static void test_worker_exception() {
    StoreConfig cfg = async_config(1);
    cfg.faults.worker_exception = true;
    const ChunkCodec codec(cfg, cache_config());
    const Blocks blocks(codec, 1, 9);
    StoreJobs jobs(cfg, codec, [](Job&, bool) {});
    jobs.submit(encode_job(codec, blocks, 0, 0, 1));
    jobs.drain();
    const auto done = jobs.take_finished();
    CHECK(done.size() == 1 && done[0]->failed, "a throwing job is a failed completion");
}

// Jobs of a settled head never run afterwards: the finished ones are those that ran before.
static void test_settle_encodes() {
    const StoreConfig cfg = async_config(1);
    const ChunkCodec codec(cfg, cache_config());
    const Blocks blocks(codec, 2, 10);
    StoreJobs jobs(cfg, codec, [](Job&, bool) {});
    for (int i = 0; i < 16; ++i) jobs.submit(encode_job(codec, blocks, 1, i % 2, 2));
    jobs.settle_encodes(1, 0);
    jobs.collect();
    const size_t before = jobs.take_finished().size();
    jobs.drain();
    size_t head0 = 0;
    for (const auto& job : jobs.take_finished()) head0 += job->head == 0;
    CHECK(head0 == 0, "%zu jobs of the settled head ran after it settled (%zu before)", head0, before);
}

static void test_prefetch() {
    const StoreConfig cfg = async_config(1, 4);
    const ChunkCodec codec(cfg, cache_config());
    std::mt19937 rng(11);
    const std::vector<uint8_t> raw = kv_bytes(rng, codec.raw_bytes(2));
    std::vector<std::unique_ptr<Chunk>> chunks;
    int decoded = 0, failed = 0;
    StoreJobs jobs(cfg, codec, [&](Job& job, bool f) {
        job.chunk->prefetch = nullptr;
        if (!f && job.decoded_ok && std::equal(raw.begin(), raw.end(), job.dest->data)) ++decoded;
        else ++failed;
    });
    for (int round = 0; round < 2; ++round) {
        for (int i = 0; i < 4; ++i) {
            chunks.push_back(std::make_unique<Chunk>());
            Chunk& c = *chunks.back();
            c.n_blocks = 2;
            c.blob = frame_of(codec, raw, 2);
            c.frame_size = c.blob.size();
            auto job = std::make_unique<Job>();
            job->kind = Job::Kind::Prefetch;
            job->chunk = &c;
            job->dest = std::make_unique<AlignedBytes>(raw.size());
            c.prefetch = job.get();
            jobs.submit(std::move(job));
        }
        CHECK(jobs.full(), "4 jobs fill a queue of 4");
        int cancelled = 0;
        if (round == 1)
            jobs.cancel_waiting_prefetches([&](Job& job) {
                job.chunk->prefetch = nullptr;
                job.chunk = nullptr;
                ++cancelled;
            });
        jobs.wait_until([&] {
            for (const auto& c : chunks)
                if (c->prefetch) return false;
            return true;
        });
        jobs.drain();
        CHECK(decoded + cancelled == 4 * (round + 1) && failed == 0, "decoded %d cancelled %d failed %d", decoded,
              cancelled, failed);
        decoded += cancelled;
    }
}

static void test_teardown_with_jobs_queued() {
    const StoreConfig cfg = async_config(2);
    const ChunkCodec codec(cfg, cache_config());
    const Blocks blocks(codec, 2, 12);
    for (int reset_first = 0; reset_first < 2; ++reset_first) {
        StoreJobs jobs(cfg, codec, [](Job&, bool) {});
        for (int i = 0; i < 32; ++i) jobs.submit(encode_job(codec, blocks, 0, 0, 2));
        if (reset_first) {
            jobs.reset();
            CHECK(jobs.take_finished().empty() && jobs.bytes() == 0, "reset left jobs");
            jobs.submit(encode_job(codec, blocks, 0, 0, 2));
            jobs.drain();
            CHECK(jobs.take_finished().size() == 1, "no work after reset");
        }
    }
}

int main() {
    test_run_encode();
    test_async_encodes();
    test_worker_exception();
    test_settle_encodes();
    test_prefetch();
    test_teardown_with_jobs_queued();
    std::printf("%s\n", g_failures ? "FAILED" : "ok");
    return g_failures != 0;
}
