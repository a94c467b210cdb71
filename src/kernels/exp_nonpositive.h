// exp for the arguments a softmax takes after its maximum is subtracted, shared by the kernels
// that compute one (cross-entropy, attention).
#pragma once

#include <cstdint>
#include <cstring>

namespace afterburner::kernels {

// exp(v) for v <= 0 (or NaN) in float, with no libm call so that the loops around it vectorize:
// v = n ln2 + r with n = round(v / ln2) and |r| <= ln2 / 2 (ln2 split into a part exact in float
// and the rest, so n ln2 is subtracted without rounding), exp(r) by its degree-7 Taylor polynomial
// (truncation below 1e-8 relative), times 2^n written straight into the exponent bits. Below -87.3
// exp(v) is under float's smallest normal and the result is 0 (-inf too); NaN stays NaN. Small
// positive v (a rounding above a maximum) is fine up to about 88.
inline float exp_nonpositive(float v) {
  const float x = v >= -87.3f ? v : -87.3f;                        // NaN too: restored at the end
  const float n = (x * 1.44269504f + 12582912.0f) - 12582912.0f;  // round to nearest via 1.5 * 2^23
  const float r = (x - n * 0.693145752f) - n * 1.42860677e-6f;
  float p = 1.0f / 5040;
  for (const float coefficient : {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f}) p = p * r + coefficient;
  const int32_t exponent_bits = (static_cast<int32_t>(n) + 127) << 23;
  float two_to_n;
  std::memcpy(&two_to_n, &exponent_bits, sizeof two_to_n);
  return v >= -87.3f ? p * two_to_n : (v != v ? v : 0.0f);
}

}  // namespace afterburner::kernels
