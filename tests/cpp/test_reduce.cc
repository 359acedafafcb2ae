#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "collectives/reduce.h"

namespace maestro {
namespace collectives {
namespace {

TEST(Half, RoundTripsEveryHalfValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    uint16_t v = static_cast<uint16_t>(h);
    float f = halfToFloat(v);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(halfToFloat(floatToHalf(f))));
      continue;
    }
    ASSERT_EQ(v, floatToHalf(f)) << std::hex << h;
  }
}

TEST(Half, RoundsToNearestEven) {
  EXPECT_EQ(0x3c00, floatToHalf(1.0f));
  EXPECT_EQ(0x3c00, floatToHalf(1.0f + 1.0f / 4096));       // below half an ulp
  EXPECT_EQ(0x3c02, floatToHalf(1.0f + 3.0f / 2048));       // tie -> even
  EXPECT_EQ(0x7c00, floatToHalf(70000.0f));                 // overflow -> inf
  EXPECT_EQ(0x0001, floatToHalf(5.96046448e-08f));          // smallest subnormal
  EXPECT_EQ(0x0000, floatToHalf(2.0e-08f));                 // underflow
}

TEST(BFloat16, RoundTripsAndRounds) {
  for (uint32_t b = 0; b < 0x10000; b += 7) {
    float f = bfloat16ToFloat(static_cast<uint16_t>(b));
    if (!std::isnan(f)) ASSERT_EQ(b, floatToBfloat16(f));
  }
  EXPECT_EQ(0x3f80, floatToBfloat16(1.0f));
  EXPECT_EQ(0x3f80, floatToBfloat16(1.00390625f));  // tie -> even
  EXPECT_EQ(0x3f82, floatToBfloat16(1.01171875f));  // tie -> even (up)
}

// Two vectors of n values drawn from [lo, hi] (seeded: the same every run).
template <typename T>
std::pair<std::vector<T>, std::vector<T>> randomPair(unsigned seed, int lo, int hi, size_t n) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(lo, hi);
  std::vector<T> a(n), b(n);
  for (size_t i = 0; i < n; ++i) {
    a[i] = static_cast<T>(d(rng));
    b[i] = static_cast<T>(d(rng));
  }
  return {a, b};
}

template <typename T>
void checkOps(DType dt) {
  const size_t n = 1000;
  auto [a, b] = randomPair<T>(42, -100, 100, n);
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct, ReduceOp::kAvg}) {
    std::vector<T> x = a;
    reduceInto(dt, op, x.data(), b.data(), n);
    for (size_t i = 0; i < n; ++i) {
      T want;
      switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kAvg: want = static_cast<T>(a[i] + b[i]); break;
        case ReduceOp::kMin: want = std::min(a[i], b[i]); break;
        case ReduceOp::kMax: want = std::max(a[i], b[i]); break;
        case ReduceOp::kProduct: want = static_cast<T>(a[i] * b[i]); break;
      }
      ASSERT_EQ(want, x[i]) << dtypeName(dt) << " " << reduceOpName(op) << " at " << i;
    }
  }
}

TEST(Reduce, EveryOpOnEveryPlainDtype) {
  checkOps<float>(DType::kFloat32);
  checkOps<double>(DType::kFloat64);
  checkOps<int8_t>(DType::kInt8);
  checkOps<int16_t>(DType::kInt16);
  checkOps<int32_t>(DType::kInt32);
  checkOps<int64_t>(DType::kInt64);
  checkOps<uint8_t>(DType::kUInt8);
}

template <typename T>
void checkBitwise(DType dt) {
  const size_t n = 333;
  auto [a, b] = randomPair<T>(7, -128, 127, n);
  for (ReduceOp op : {ReduceOp::kBand, ReduceOp::kBor, ReduceOp::kBxor}) {
    ASSERT_TRUE(defined(op, dt));
    std::vector<T> x = a;
    reduceInto(dt, op, x.data(), b.data(), n);
    for (size_t i = 0; i < n; ++i) {
      T want = op == ReduceOp::kBand ? static_cast<T>(a[i] & b[i])
               : op == ReduceOp::kBor ? static_cast<T>(a[i] | b[i])
                                      : static_cast<T>(a[i] ^ b[i]);
      ASSERT_EQ(want, x[i]) << dtypeName(dt) << " " << reduceOpName(op) << " at " << i;
    }
  }
}

TEST(Reduce, BitwiseOpsOnIntegersAndBool) {
  checkBitwise<int8_t>(DType::kInt8);
  checkBitwise<int16_t>(DType::kInt16);
  checkBitwise<int32_t>(DType::kInt32);
  checkBitwise<int64_t>(DType::kInt64);
  checkBitwise<uint8_t>(DType::kUInt8);
  // bool: and, or, xor over every pair.
  const uint8_t a[4] = {0, 0, 1, 1}, b[4] = {0, 1, 0, 1};
  const uint8_t want_and[4] = {0, 0, 0, 1}, want_or[4] = {0, 1, 1, 1}, want_xor[4] = {0, 1, 1, 0};
  for (auto [op, want] : {std::pair{ReduceOp::kBand, want_and}, std::pair{ReduceOp::kBor, want_or},
                          std::pair{ReduceOp::kBxor, want_xor}}) {
    uint8_t x[4];
    std::memcpy(x, a, 4);
    reduceInto(DType::kBool, op, x, b, 4);
    EXPECT_EQ(0, std::memcmp(x, want, 4)) << reduceOpName(op);
  }
}

TEST(Reduce, BitwiseOpsAreRefusedOnFloatingPoint) {
  for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    EXPECT_FALSE(defined(ReduceOp::kBor, dt)) << dtypeName(dt);
    EXPECT_TRUE(defined(ReduceOp::kSum, dt));
    EXPECT_TRUE(defined(ReduceOp::kAvg, dt));
  }
  EXPECT_FALSE(defined(ReduceOp::kAvg, DType::kBool));
  EXPECT_THROW(checkDefined(ReduceOp::kBand, DType::kFloat16), std::exception);
  float a[1] = {1}, b[1] = {2};
  EXPECT_THROW(reduceInto(DType::kFloat32, ReduceOp::kBxor, a, b, 1), std::exception);
}

TEST(Reduce, IntegersWrapLikeTorch) {
  int8_t a[2] = {127, -128}, b[2] = {1, -1};
  reduceInto(DType::kInt8, ReduceOp::kSum, a, b, 2);
  EXPECT_EQ(-128, a[0]);
  EXPECT_EQ(127, a[1]);
  int64_t c[1] = {std::numeric_limits<int64_t>::max()}, e[1] = {2};
  reduceInto(DType::kInt64, ReduceOp::kProduct, c, e, 1);
  EXPECT_EQ(-2, c[0]);
  uint8_t u[1] = {200}, v[1] = {100};
  reduceInto(DType::kUInt8, ReduceOp::kSum, u, v, 1);
  EXPECT_EQ(44, u[0]);
  int16_t s[1] = {300}, t[1] = {300};
  reduceInto(DType::kInt16, ReduceOp::kProduct, s, t, 1);
  EXPECT_EQ(static_cast<int16_t>(90000 & 0xffff), s[0]);
}

TEST(Reduce, HalfPrecisionSumsInFloat) {
  uint16_t a[3] = {floatToHalf(1.5f), floatToHalf(-2.0f), floatToHalf(1000.0f)};
  uint16_t b[3] = {floatToHalf(2.25f), floatToHalf(0.5f), floatToHalf(24.0f)};
  reduceInto(DType::kFloat16, ReduceOp::kSum, a, b, 3);
  EXPECT_EQ(3.75f, halfToFloat(a[0]));
  EXPECT_EQ(-1.5f, halfToFloat(a[1]));
  EXPECT_EQ(1024.0f, halfToFloat(a[2]));
  uint16_t c[1] = {floatToBfloat16(3.0f)}, d[1] = {floatToBfloat16(5.0f)};
  reduceInto(DType::kBFloat16, ReduceOp::kMax, c, d, 1);
  EXPECT_EQ(5.0f, bfloat16ToFloat(c[0]));
}

TEST(Reduce, MinMaxPropagateNaN) {
  float a[2] = {NAN, 1.0f}, b[2] = {1.0f, NAN};
  reduceInto(DType::kFloat32, ReduceOp::kMax, a, b, 2);
  EXPECT_TRUE(std::isnan(a[0]) && std::isnan(a[1]));
}

TEST(Reduce, AvgTruncatesIntegersAndDividesFloats) {
  int32_t i[3] = {7, -7, 8};
  finishAvg(DType::kInt32, i, 3, 2);
  EXPECT_EQ(3, i[0]);
  EXPECT_EQ(-3, i[1]);
  EXPECT_EQ(4, i[2]);
  float f[1] = {7};
  finishAvg(DType::kFloat32, f, 1, 2);
  EXPECT_EQ(3.5f, f[0]);
}

}  // namespace
}  // namespace collectives
}  // namespace maestro
