// Reduction kernels: dst[i] = dst[i] (op) src[i], for every dtype the
// backend supports. Integer arithmetic wraps (like torch's), float16 and
// bfloat16 are computed in float32 and rounded to nearest even, MIN/MAX
// propagate NaN (like torch.minimum/maximum). BAND/BOR/BXOR are defined on
// integers and bool only (bitwiseDefined); on bool they are and/or/xor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace maestro {
namespace collectives {

enum class DType : uint8_t { kFloat32 = 1, kFloat64, kFloat16, kBFloat16, kInt8, kInt16, kInt32, kInt64, kUInt8, kBool };
enum class ReduceOp : uint8_t { kSum = 1, kAvg, kMin, kMax, kProduct, kBand, kBor, kBxor };

size_t dtypeSize(DType dtype);
const char* dtypeName(DType dtype);
const char* reduceOpName(ReduceOp op);
// Whether `op` is defined on `dtype`: the bitwise ops on integers and bool
// only, AVG on everything but bool.
bool defined(ReduceOp op, DType dtype);
// Throws, saying why, where `op` is not defined on `dtype`.
void checkDefined(ReduceOp op, DType dtype);

// dst[i] = dst[i] op src[i] for i < count. AVG reduces as SUM (see finishAvg).
void reduceInto(DType dtype, ReduceOp op, void* dst, const void* src, size_t count);
// AVG's last step: dst[i] /= n (integers: truncating toward zero, like
// torch.div(..., rounding_mode="trunc")).
void finishAvg(DType dtype, void* dst, size_t count, int n);

// IEEE half / bfloat16 conversions (exposed for tests).
float halfToFloat(uint16_t h);
uint16_t floatToHalf(float f);
float bfloat16ToFloat(uint16_t b);
uint16_t floatToBfloat16(float f);

}  // namespace collectives
}  // namespace maestro
