#include "mnn_h2o/head/q8_matrix.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "mnn_h2o/cache/fp16.h"
#include "q8_matrix_kernels.h"

namespace mnn_h2o {

namespace {

// Rows per task: small enough that two threads balance, large enough that a task is not all
// hand-off (a task of 256 rows of 576 values is ~150 KB of codes).
constexpr int kRowsPerTask = 256;

void q8_rows_scalar(const HeadRowsProblem& p, int r0, int r1) {
    for_each_row(p, r0, r1, [](const int8_t* c, const uint16_t* s, const float* x, int nb) {
        float acc = 0.f;
        for (int b = 0; b < nb; ++b) {
            float dot = 0.f;
            for (int i = 0; i < kQ8Block; ++i) dot += static_cast<float>(c[b * kQ8Block + i]) * x[b * kQ8Block + i];
            acc += dot * fp16_to_fp32(s[b]);
        }
        return acc;
    });
}

}  // namespace

Q8Matrix::Q8Matrix(int rows, int cols, std::vector<int8_t> codes, std::vector<uint16_t> scales,
                   int n_threads)
    : rows_(rows), cols_(cols), codes_(std::move(codes)), scales_(std::move(scales)) {
    if (rows <= 0 || cols <= 0 || cols % kQ8Block != 0)
        throw std::invalid_argument("Q8Matrix: rows and cols must be positive, cols a multiple of 32 (got " +
                                    std::to_string(rows) + " x " + std::to_string(cols) + ")");
    const size_t n = static_cast<size_t>(rows) * cols;
    if (codes_.size() != n || scales_.size() != n / kQ8Block)
        throw std::invalid_argument("Q8Matrix: " + std::to_string(codes_.size()) + " codes and " +
                                    std::to_string(scales_.size()) + " scales for " + std::to_string(rows) +
                                    " x " + std::to_string(cols) + " (need " + std::to_string(n) + " and " +
                                    std::to_string(n / kQ8Block) + ")");
    if (n_threads < 1) throw std::invalid_argument("Q8Matrix: n_threads must be >= 1");
    pool_ = std::make_unique<ThreadPool>(n_threads);
}

namespace {

void (*row_kernel(Isa isa))(const HeadRowsProblem&, int, int) {
#if defined(MNN_H2O_HAVE_X86_KERNELS)
    if (isa == Isa::Avx512 && cpu_features().avx512) return q8_rows_avx512;
    if ((isa == Isa::Avx2 || isa == Isa::Avx512) && cpu_features().avx2_f16c_fma) return q8_rows_avx2;
#elif defined(__aarch64__)
    if (isa == Isa::Neon) return q8_rows_neon;
#else
    (void)isa;
#endif
    return q8_rows_scalar;
}

}  // namespace

void Q8Matrix::multiply(const float* x, int n, float* y, Isa isa) const {
    if (n <= 0) return;
    if (!x || !y) throw std::invalid_argument("Q8Matrix::multiply: null x or y");
    const HeadRowsProblem p{codes_.data(), scales_.data(), cols_, x, n, y, static_cast<size_t>(rows_)};
    const auto kernel = row_kernel(isa);
    const int n_tasks = (rows_ + kRowsPerTask - 1) / kRowsPerTask;
    pool_->parallel_for(n_tasks, [&](int task, int) {
        const int r0 = task * kRowsPerTask;
        kernel(p, r0, std::min(rows_, r0 + kRowsPerTask));
    });
}

void Q8Matrix::multiply_rows(const float* x, int n, int r0, int r1, float* y, Isa isa) const {
    if (n <= 0 || r0 >= r1) return;
    if (!x || !y) throw std::invalid_argument("Q8Matrix::multiply_rows: null x or y");
    if (r0 < 0 || r1 > rows_)
        throw std::out_of_range("Q8Matrix::multiply_rows: rows [" + std::to_string(r0) + ", " + std::to_string(r1) +
                                ") outside [0, " + std::to_string(rows_) + ")");
    const HeadRowsProblem p{codes_.data(), scales_.data(), cols_, x, n, y, static_cast<size_t>(rows_)};
    row_kernel(isa)(p, r0, r1);
}

void Q8Matrix::rows_of(const int32_t* ids, int n, float* out) const {
    for (int t = 0; t < n; ++t) {
        const int32_t r = ids[t];
        if (r < 0 || r >= rows_)
            throw std::out_of_range("Q8Matrix::rows_of: id " + std::to_string(r) + " outside [0, " +
                                    std::to_string(rows_) + ")");
        const int8_t* c = codes_.data() + static_cast<size_t>(r) * cols_;
        const uint16_t* s = scales_.data() + static_cast<size_t>(r) * (cols_ / kQ8Block);
        float* o = out + static_cast<size_t>(t) * cols_;
        for (int i = 0; i < cols_; ++i) o[i] = static_cast<float>(c[i]) * fp16_to_fp32(s[i / kQ8Block]);
    }
}

}  // namespace mnn_h2o
