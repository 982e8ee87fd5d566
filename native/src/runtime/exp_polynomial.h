// Internal to the kernels that compute exp without libm (attention's vexp, SiLU in dense/):
// the Cephes expf polynomial after a reduction by ln 2, written once. exp(x) = 2^n e^r with
// n = round(x log2 e), r = x - n ln 2 (ln 2 in two parts, so r is exact), e^r ~ 1 + r + r^2 p(r);
// within ~2 ulp over the float range.
#pragma once

namespace mnn_h2o {
namespace exp_polynomial {

constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2High = 0.693359375f;    // r = x - n kLn2High + n kLn2Low
constexpr float kLn2Low = 2.12194440e-4f;
constexpr float kLowest = -87.3365478515625f;  // below it exp underflows to subnormals
// p(r), highest power first: p = ((((c0 r + c1) r + c2) r + c3) r + c4) r + c5.
constexpr float kP[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                         4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

}  // namespace exp_polynomial
}  // namespace mnn_h2o
