#include "collectives/reduce.h"

#include <cctype>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "common/error.h"

namespace maestro {
namespace collectives {
namespace {

template <typename T>
T wrapAdd(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
}
template <typename T>
T wrapMul(T a, T b) {
  using U = std::make_unsigned_t<T>;
  // Promote to at least unsigned int so uint16 * uint16 cannot overflow int.
  using W = std::conditional_t<(sizeof(U) < sizeof(unsigned)), unsigned, U>;
  return static_cast<T>(static_cast<U>(static_cast<W>(static_cast<U>(a)) * static_cast<W>(static_cast<U>(b))));
}

template <typename T>
T nanMin(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(a)) return a;
    if (std::isnan(b)) return b;
  }
  return b < a ? b : a;
}
template <typename T>
T nanMax(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(a)) return a;
    if (std::isnan(b)) return b;
  }
  return a < b ? b : a;
}

// Plain loops the compiler vectorises.
template <typename T>
void reduceTyped(ReduceOp op, T* __restrict d, const T* __restrict s, size_t n) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      if constexpr (std::is_integral_v<T>) {
        for (size_t i = 0; i < n; ++i) d[i] = wrapAdd(d[i], s[i]);
      } else {
        for (size_t i = 0; i < n; ++i) d[i] = d[i] + s[i];
      }
      return;
    case ReduceOp::kProduct:
      if constexpr (std::is_integral_v<T>) {
        for (size_t i = 0; i < n; ++i) d[i] = wrapMul(d[i], s[i]);
      } else {
        for (size_t i = 0; i < n; ++i) d[i] = d[i] * s[i];
      }
      return;
    case ReduceOp::kMin:
      for (size_t i = 0; i < n; ++i) d[i] = nanMin(d[i], s[i]);
      return;
    case ReduceOp::kMax:
      for (size_t i = 0; i < n; ++i) d[i] = nanMax(d[i], s[i]);
      return;
    case ReduceOp::kBand:
    case ReduceOp::kBor:
    case ReduceOp::kBxor:
      if constexpr (std::is_integral_v<T>) {
        if (op == ReduceOp::kBand) for (size_t i = 0; i < n; ++i) d[i] = static_cast<T>(d[i] & s[i]);
        else if (op == ReduceOp::kBor) for (size_t i = 0; i < n; ++i) d[i] = static_cast<T>(d[i] | s[i]);
        else for (size_t i = 0; i < n; ++i) d[i] = static_cast<T>(d[i] ^ s[i]);
        return;
      } else {
        fail("reduce op ", reduceOpName(op), " is not defined for floating-point tensors");
      }
  }
}

// bool: SUM/MAX/BOR = logical or, PRODUCT/MIN/BAND = logical and (torch's
// semantics), BXOR = exclusive or.
void reduceBool(ReduceOp op, uint8_t* d, const uint8_t* s, size_t n) {
  if (op == ReduceOp::kBxor) {
    for (size_t i = 0; i < n; ++i) d[i] = (!d[i] != !s[i]) ? 1 : 0;
    return;
  }
  bool is_or = op == ReduceOp::kSum || op == ReduceOp::kMax || op == ReduceOp::kAvg || op == ReduceOp::kBor;
  if (is_or) {
    for (size_t i = 0; i < n; ++i) d[i] = (d[i] | s[i]) ? 1 : 0;
  } else {
    for (size_t i = 0; i < n; ++i) d[i] = (d[i] && s[i]) ? 1 : 0;
  }
}

// 16-bit floats: convert a block to float32, reduce, convert back.
template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void reduce16(ReduceOp op, uint16_t* d, const uint16_t* s, size_t n) {
  constexpr size_t kBlock = 256;
  float a[kBlock], b[kBlock];
  for (size_t base = 0; base < n; base += kBlock) {
    size_t m = std::min(kBlock, n - base);
    for (size_t i = 0; i < m; ++i) {
      a[i] = ToFloat(d[base + i]);
      b[i] = ToFloat(s[base + i]);
    }
    reduceTyped<float>(op, a, b, m);
    for (size_t i = 0; i < m; ++i) d[base + i] = FromFloat(a[i]);
  }
}

template <typename T>
void avgTyped(T* d, size_t n, int ranks) {
  if constexpr (std::is_integral_v<T>) {
    for (size_t i = 0; i < n; ++i) d[i] = static_cast<T>(static_cast<int64_t>(d[i]) / ranks);
  } else {
    const T div = static_cast<T>(ranks);
    for (size_t i = 0; i < n; ++i) d[i] = d[i] / div;
  }
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void avg16(uint16_t* d, size_t n, int ranks) {
  for (size_t i = 0; i < n; ++i) d[i] = FromFloat(ToFloat(d[i]) / static_cast<float>(ranks));
}

}  // namespace

size_t dtypeSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat64:
    case DType::kInt64: return 8;
    case DType::kFloat32:
    case DType::kInt32: return 4;
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kInt16: return 2;
    case DType::kInt8:
    case DType::kUInt8:
    case DType::kBool: return 1;
  }
  fail("unknown dtype ", int(dtype));
}

const char* dtypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kInt8: return "int8";
    case DType::kInt16: return "int16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kUInt8: return "uint8";
    case DType::kBool: return "bool";
  }
  return "?";
}

const char* reduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kProduct: return "product";
    case ReduceOp::kBand: return "band";
    case ReduceOp::kBor: return "bor";
    case ReduceOp::kBxor: return "bxor";
  }
  return "?";
}

namespace {
bool isBitwise(ReduceOp op) { return op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor; }
}  // namespace

bool defined(ReduceOp op, DType dtype) {
  if (op == ReduceOp::kAvg) return dtype != DType::kBool;
  if (!isBitwise(op)) return true;
  switch (dtype) {
    case DType::kFloat32:
    case DType::kFloat64:
    case DType::kFloat16:
    case DType::kBFloat16: return false;
    default: return true;
  }
}

void checkDefined(ReduceOp op, DType dtype) {
  if (defined(op, dtype)) return;
  std::string name = reduceOpName(op);
  for (char& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (isBitwise(op)) fail("ReduceOp.", name, " is defined for integer and bool tensors only, not ", dtypeName(dtype));
  fail("ReduceOp.", name, " is not defined for ", dtypeName(dtype), " tensors");
}

float halfToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while ((man & 0x400) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (man & 0x3ff) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000 | man << 13;  // inf / nan
  } else {
    bits = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t floatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  uint32_t exp = (x >> 23) & 0xff;
  uint32_t man = x & 0x7fffff;
  if (exp == 255) return static_cast<uint16_t>(sign | 0x7c00 | (man ? 0x200 | (man >> 13) : 0));  // inf/nan
  int e = static_cast<int>(exp) - 127 + 15;
  if (e >= 31) return static_cast<uint16_t>(sign | 0x7c00);  // overflow -> inf
  if (e <= 0) {
    if (e < -10) return sign;  // underflow -> signed zero
    // Subnormal: shift the implicit bit in, round to nearest even.
    man |= 0x800000;
    int shift = 14 - e;
    uint32_t half_man = man >> shift;
    uint32_t rem = man & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half_man & 1))) ++half_man;
    return static_cast<uint16_t>(sign | half_man);
  }
  uint32_t half = static_cast<uint32_t>(e) << 10 | (man >> 13);
  uint32_t rem = man & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) ++half;  // may carry into the exponent: correct
  return static_cast<uint16_t>(sign | half);
}

float bfloat16ToFloat(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t floatToBfloat16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((x >> 16) | 0x40);  // quiet nan
  uint32_t rounding = 0x7fff + ((x >> 16) & 1);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

void reduceInto(DType dtype, ReduceOp op, void* dst, const void* src, size_t count) {
  switch (dtype) {
    case DType::kFloat32: return reduceTyped(op, static_cast<float*>(dst), static_cast<const float*>(src), count);
    case DType::kFloat64: return reduceTyped(op, static_cast<double*>(dst), static_cast<const double*>(src), count);
    case DType::kInt8: return reduceTyped(op, static_cast<int8_t*>(dst), static_cast<const int8_t*>(src), count);
    case DType::kInt16: return reduceTyped(op, static_cast<int16_t*>(dst), static_cast<const int16_t*>(src), count);
    case DType::kInt32: return reduceTyped(op, static_cast<int32_t*>(dst), static_cast<const int32_t*>(src), count);
    case DType::kInt64: return reduceTyped(op, static_cast<int64_t*>(dst), static_cast<const int64_t*>(src), count);
    case DType::kUInt8: return reduceTyped(op, static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), count);
    case DType::kBool: return reduceBool(op, static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), count);
    case DType::kFloat16:
      return reduce16<halfToFloat, floatToHalf>(op, static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), count);
    case DType::kBFloat16:
      return reduce16<bfloat16ToFloat, floatToBfloat16>(op, static_cast<uint16_t*>(dst),
                                                          static_cast<const uint16_t*>(src), count);
  }
  fail("reduce: unknown dtype ", int(dtype));
}

void finishAvg(DType dtype, void* dst, size_t count, int n) {
  switch (dtype) {
    case DType::kFloat32: return avgTyped(static_cast<float*>(dst), count, n);
    case DType::kFloat64: return avgTyped(static_cast<double*>(dst), count, n);
    case DType::kInt8: return avgTyped(static_cast<int8_t*>(dst), count, n);
    case DType::kInt16: return avgTyped(static_cast<int16_t*>(dst), count, n);
    case DType::kInt32: return avgTyped(static_cast<int32_t*>(dst), count, n);
    case DType::kInt64: return avgTyped(static_cast<int64_t*>(dst), count, n);
    case DType::kUInt8: return avgTyped(static_cast<uint8_t*>(dst), count, n);
    case DType::kFloat16: return avg16<halfToFloat, floatToHalf>(static_cast<uint16_t*>(dst), count, n);
    case DType::kBFloat16: return avg16<bfloat16ToFloat, floatToBfloat16>(static_cast<uint16_t*>(dst), count, n);
    case DType::kBool: fail("AVG is not defined for bool tensors");
  }
}

}  // namespace collectives
}  // namespace maestro
