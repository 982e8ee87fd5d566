// HugePageBytes (runtime/huge_page_bytes.h): a copy of the bytes (or a fill's), 2 MiB aligned from
// one huge page up, movable, and read-only (a write faults, tested in a child process).
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <utility>
#include <vector>

#include "mnn_h2o/runtime/huge_page_bytes.h"
#include "test_support.h"

using namespace mnn_h2o;

namespace {

constexpr size_t kHuge = size_t{2} << 20;

std::vector<uint8_t> random_bytes(size_t n, unsigned seed) {
    std::mt19937 rng(seed);
    std::vector<uint8_t> b(n);
    for (auto& v : b) v = static_cast<uint8_t>(rng());
    return b;
}

void copies(size_t n) {
    const std::vector<uint8_t> src = random_bytes(n, static_cast<unsigned>(n));
    const HugePageBytes b(src.data(), n);
    CHECK(b.size() == n, "size %zu for %zu bytes", b.size(), n);
    CHECK(n == 0 ? b.data() == nullptr : std::memcmp(b.data(), src.data(), n) == 0, "%zu bytes: not a copy", n);
    if (n >= kHuge)
        CHECK(reinterpret_cast<uintptr_t>(b.data()) % kHuge == 0, "%zu bytes at %p: not 2 MiB aligned", n,
              static_cast<const void*>(b.data()));
}

void moves() {
    const std::vector<uint8_t> src = random_bytes(3 * kHuge + 5, 1);
    HugePageBytes a(src.data(), src.size());
    const uint8_t* at = a.data();
    HugePageBytes b(std::move(a));
    CHECK(a.data() == nullptr && a.size() == 0, "moved-from holds bytes");
    CHECK(b.data() == at && b.size() == src.size() && std::memcmp(b.data(), src.data(), src.size()) == 0,
          "moved-to lost the bytes");
    HugePageBytes c(src.data(), 10);
    c = std::move(b);  // c's own mapping is released, b's taken
    CHECK(c.data() == at && c.size() == src.size() && b.data() == nullptr, "move assignment");
    c = std::move(c);
    CHECK(c.data() == at, "self move assignment released the bytes");
}

// The weights are never written: a write through the pointer is a fault, not a silent change.
void read_only() {
    const std::vector<uint8_t> src = random_bytes(kHuge + 100, 2);
    const HugePageBytes b(src.data(), src.size());
    std::fflush(stdout);
    const pid_t pid = fork();
    if (pid == 0) {
        std::signal(SIGSEGV, SIG_DFL);  // die of the fault (a sanitizer's handler would report it)
        const_cast<volatile uint8_t*>(b.data())[kHuge + 7] = 1;
        _exit(0);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid, "fork / wait");
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV, "a write to the bytes did not fault (status %d)", status);
}

}  // namespace

// Bytes written by a fill: what it wrote, read-only after; a fill that throws passes it on.
void fills() {
    const std::vector<uint8_t> src = random_bytes(kHuge + 7, 3);
    const HugePageBytes b(src.size(), [&src](uint8_t* dst) { std::memcpy(dst, src.data(), src.size()); });
    CHECK(b.size() == src.size() && std::memcmp(b.data(), src.data(), src.size()) == 0, "a fill's bytes");
    bool thrown = false;
    try {
        HugePageBytes(100, [](uint8_t*) { throw std::runtime_error("read failed"); });
    } catch (const std::runtime_error&) {
        thrown = true;
    }
    CHECK(thrown, "a failing fill's error was not passed on");
}

int main() {
    for (size_t n : {size_t{0}, size_t{1}, size_t{4095}, size_t{4096}, kHuge - 1, kHuge, 5 * kHuge + 3}) copies(n);
    fills();
    moves();
    read_only();
    std::printf("test_huge_page_bytes: %s\n", g_failures ? "FAILED" : "ok");
    return g_failures != 0;
}
