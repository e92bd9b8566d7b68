// SPDX-License-Identifier: Apache-2.0
// Element arithmetic shared, line for line, by the CPU reference and the CUDA
// kernels: half / bfloat16 / FP8 E4M3 conversions, the quantizer, and XXH3-64
// split so that a GPU can sum its stripes in parallel. Both sides compile this
// same code (KVTIER_HD), which is what makes the CUDA results bit-identical to
// the reference. No FMA contraction is relied on: every rounding step is a
// single IEEE operation.
#ifndef KVTIER_KERNELS_KV_MATH_H_
#define KVTIER_KERNELS_KV_MATH_H_

#include <cstdint>
#include <math.h>

#include <cstring>

#if defined(__CUDACC__)
#define KVTIER_HD __host__ __device__ __forceinline__
#else
#define KVTIER_HD inline
#endif

namespace kvtier::kernels::math {

KVTIER_HD uint32_t FloatBits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
KVTIER_HD float BitsFloat(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
KVTIER_HD bool IsFinite(float f) { return (FloatBits(f) & 0x7f800000u) != 0x7f800000u; }

// ---- IEEE half ----------------------------------------------------------

KVTIER_HD float HalfToFloat(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ff;
  if (exp == 0x1f) return BitsFloat(sign | 0x7f800000u | (man << 13));  // inf / nan
  if (exp != 0) return BitsFloat(sign | ((exp + 112) << 23) | (man << 13));
  if (man == 0) return BitsFloat(sign);
  // Subnormal: normalize.
  int e = -1;
  do {
    ++e;
    man <<= 1;
  } while ((man & 0x400) == 0);
  return BitsFloat(sign | ((112 - e) << 23) | ((man & 0x3ff) << 13));
}

// Round to nearest even; overflow to inf, NaN stays NaN.
KVTIER_HD uint16_t FloatToHalf(float f) {
  const uint32_t u = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs >= 0x7f800000u) return sign | (abs > 0x7f800000u ? 0x7e00 : 0x7c00);
  if (abs >= 0x477ff000u) return sign | 0x7c00;  // rounds past 65504
  if (abs >= 0x38800000u) {                      // normal half
    const uint32_t mant_odd = (abs >> 13) & 1;
    const uint32_t rounded = abs + 0xfff + mant_odd;
    return sign | static_cast<uint16_t>((rounded - 0x38000000u) >> 13);
  }
  if (abs < 0x33000000u) return sign;  // below half the smallest subnormal
  // Subnormal half: value = man * 2^-24.
  const uint32_t e = abs >> 23;
  const uint32_t m = (abs & 0x7fffff) | 0x800000;
  const uint32_t shift = 126 - e;  // 14..24 for e in 102..112
  const uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  const uint32_t r = q + ((rem > half || (rem == half && (q & 1))) ? 1 : 0);
  return sign | static_cast<uint16_t>(r);
}

// ---- bfloat16 -------------------------------------------------------------

KVTIER_HD float Bf16ToFloat(uint16_t b) { return BitsFloat(uint32_t{b} << 16); }
KVTIER_HD uint16_t FloatToBf16(float f) {
  const uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  return static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

// ---- FP8 E4M3 (OCP "e4m3fn": bias 7, no inf, 0x7f/0xff NaN, max 448) -------

KVTIER_HD float Fp8ToFloat(uint8_t v) {
  const uint32_t sign = uint32_t{v & 0x80u} << 24;
  const uint32_t exp = (v >> 3) & 0xf;
  const uint32_t man = v & 0x7;
  if (exp == 0xf && man == 0x7) return BitsFloat(sign | 0x7fc00000u);
  if (exp != 0) return BitsFloat(sign | ((exp + 120) << 23) | (man << 20));
  // Subnormal: man * 2^-9, exact in float.
  const float mag = static_cast<float>(man) * 0.001953125f;
  return BitsFloat(FloatBits(mag) | sign);
}

// Round to nearest even, saturating to +-448; NaN -> 0x7f.
KVTIER_HD uint8_t FloatToFp8(float f) {
  const uint32_t u = FloatBits(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return 0x7f;
  if (abs >= 0x43e00000u) return sign | 0x7e;  // >= 448 (and inf): saturate
  if (abs >= 0x3c800000u) {                    // >= 2^-6: normal fp8
    const uint32_t mant_odd = (abs >> 20) & 1;
    const uint32_t rounded = abs + 0x7ffff + mant_odd;
    const uint32_t r = (rounded - 0x3c000000u) >> 20;  // rebias 127 -> 7
    return sign | static_cast<uint8_t>(r > 0x7e ? 0x7e : r);
  }
  if (abs < 0x3a800000u) return sign;  // <= 2^-10: rounds to zero (ties to even 0)
  // Subnormal fp8: value = man * 2^-9, man in 0..8 (8 becomes the smallest normal).
  const uint32_t e = abs >> 23;
  const uint32_t m = (abs & 0x7fffff) | 0x800000;
  const uint32_t shift = 141 - e;  // value = m * 2^(e-150); / 2^-9 -> shift 141-e
  const uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  const uint32_t r = q + ((rem > half || (rem == half && (q & 1))) ? 1 : 0);
  return sign | static_cast<uint8_t>(r);
}

// ---- loading and storing cache elements ------------------------------------

// dtype codes match kernels::KvDtype: 0 f16, 1 bf16, 2 f32.
KVTIER_HD float LoadElement(const uint8_t* p, int dtype) {
  if (dtype == 2) {
    float f;
    memcpy(&f, p, 4);
    return f;
  }
  uint16_t h;
  memcpy(&h, p, 2);
  return dtype == 0 ? HalfToFloat(h) : Bf16ToFloat(h);
}
KVTIER_HD void StoreElement(uint8_t* p, int dtype, float f) {
  if (dtype == 2) {
    memcpy(p, &f, 4);
    return;
  }
  const uint16_t h = dtype == 0 ? FloatToHalf(f) : FloatToBf16(f);
  memcpy(p, &h, 2);
}

// ---- quantizer --------------------------------------------------------------
// Symmetric: scale = amax / qmax over the finite values of a group (1 when the
// group is all zero or not finite), code = round(x / scale) saturated. Inf
// saturates, NaN encodes as 0.

// codec codes match kernels::BlockCodec: 1 int8, 2 fp8 e4m3.
KVTIER_HD float QuantMax(int codec) { return codec == 1 ? 127.0f : 448.0f; }
KVTIER_HD float AbsForScale(float x) { return IsFinite(x) ? (x < 0 ? -x : x) : 0.0f; }
KVTIER_HD float ScaleFor(float amax, int codec) { return amax > 0.0f ? amax / QuantMax(codec) : 1.0f; }

KVTIER_HD uint8_t Quantize(float x, float scale, int codec) {
  if (x != x) return 0;  // NaN
  const float q = x / scale;
  if (codec == 1) {
    float r = q >= 127.0f ? 127.0f : (q <= -127.0f ? -127.0f : q);
    r = rintf(r);
    return static_cast<uint8_t>(static_cast<int8_t>(r));
  }
  return FloatToFp8(q);
}
KVTIER_HD float Dequantize(uint8_t code, float scale, int codec) {
  const float v = codec == 1 ? static_cast<float>(static_cast<int8_t>(code)) : Fp8ToFloat(code);
  return v * scale;
}

// ---- XXH3-64 (seed 0, default secret), split for parallel summing -----------
// For inputs over 240 bytes XXH3 walks 1024-byte blocks; inside a block each
// of the 8 accumulator lanes only adds, so a block's contribution to a lane
// (`Xxh3BlockLane`) can be computed by any thread, and only the per-block
// scramble runs in order. Matches XXH3_64bits() of libxxhash (the NVMe tier's
// payload checksum); xxh3_lanes_test checks it against the library.

namespace xxh3 {

constexpr uint64_t kPrime32_1 = 0x9E3779B1U;
constexpr uint64_t kPrime32_2 = 0x85EBCA77U;
constexpr uint64_t kPrime32_3 = 0xC2B2AE3DU;
constexpr uint64_t kPrime64_1 = 0x9E3779B185EBCA87ULL;
constexpr uint64_t kPrime64_2 = 0xC2B2AE3D27D4EB4FULL;
constexpr uint64_t kPrime64_3 = 0x165667B19E3779F9ULL;
constexpr uint64_t kPrime64_4 = 0x85EBCA77C2B2AE63ULL;
constexpr uint64_t kPrime64_5 = 0x27D4EB2F165667C5ULL;
constexpr uint32_t kBlockBytes = 1024;
constexpr uint32_t kStripeBytes = 64;
constexpr uint32_t kSecretBytes = 192;

// XXH3's default secret (xxhash.h, XXH3_kSecret).
#define KVTIER_XXH3_SECRET \
  {0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, \
   0xf7, 0x21, 0xad, 0x1c, 0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, \
   0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f, 0xcb, 0x79, 0xe6, 0x4e, \
   0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21, \
   0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, \
   0x81, 0x3a, 0x26, 0x4c, 0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, \
   0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3, 0x71, 0x64, 0x48, 0x97, \
   0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8, \
   0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, \
   0xc7, 0x0b, 0x4f, 0x1d, 0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, \
   0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64, 0xea, 0xc5, 0xac, 0x83, \
   0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb, \
   0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, \
   0x29, 0xd4, 0x68, 0x9e, 0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, \
   0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce, 0x45, 0xcb, 0x3a, 0x8f, \
   0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e}
inline constexpr uint8_t kSecretHost[kSecretBytes] = KVTIER_XXH3_SECRET;
#if defined(__CUDACC__)
// One copy per translation unit that compiles device code (there is one).
static __constant__ uint8_t kSecretDevice[kSecretBytes] = KVTIER_XXH3_SECRET;
__host__ __device__ __forceinline__ const uint8_t* Secret() {
#if defined(__CUDA_ARCH__)
  return kSecretDevice;
#else
  return kSecretHost;
#endif
}
#else
inline const uint8_t* Secret() { return kSecretHost; }
#endif

KVTIER_HD uint64_t Read64(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  if ((reinterpret_cast<uintptr_t>(p) & 7) == 0) return *reinterpret_cast<const uint64_t*>(p);
#endif
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}
KVTIER_HD uint32_t Read32(const uint8_t* p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}
KVTIER_HD uint64_t Rotl64(uint64_t v, int r) { return (v << r) | (v >> (64 - r)); }
KVTIER_HD uint64_t Swap64(uint64_t v) {
  v = ((v & 0x00000000FFFFFFFFULL) << 32) | ((v & 0xFFFFFFFF00000000ULL) >> 32);
  v = ((v & 0x0000FFFF0000FFFFULL) << 16) | ((v & 0xFFFF0000FFFF0000ULL) >> 16);
  return ((v & 0x00FF00FF00FF00FFULL) << 8) | ((v & 0xFF00FF00FF00FF00ULL) >> 8);
}
KVTIER_HD uint64_t MulFold64(uint64_t a, uint64_t b) {
#if defined(__CUDA_ARCH__)
  return (a * b) ^ __umul64hi(a, b);
#else
  const unsigned __int128 p = static_cast<unsigned __int128>(a) * b;
  return static_cast<uint64_t>(p) ^ static_cast<uint64_t>(p >> 64);
#endif
}
KVTIER_HD uint64_t Avalanche(uint64_t h) {
  h ^= h >> 37;
  h *= 0x165667919E3779F9ULL;
  return h ^ (h >> 32);
}
KVTIER_HD uint64_t Avalanche64(uint64_t h) {
  h ^= h >> 33;
  h *= kPrime64_2;
  h ^= h >> 29;
  h *= kPrime64_3;
  return h ^ (h >> 32);
}
KVTIER_HD uint64_t Rrmxmx(uint64_t h, uint64_t len) {
  h ^= Rotl64(h, 49) ^ Rotl64(h, 24);
  h *= 0x9FB21C651E98DF25ULL;
  h ^= (h >> 35) + len;
  h *= 0x9FB21C651E98DF25ULL;
  return h ^ (h >> 28);
}
KVTIER_HD uint64_t Mix16(const uint8_t* in, const uint8_t* secret) {
  return MulFold64(Read64(in) ^ Read64(secret), Read64(in + 8) ^ Read64(secret + 8));
}

// Inputs of 0..240 bytes: one thread, no long loop.
KVTIER_HD uint64_t HashShort(const uint8_t* in, uint64_t len) {
  const uint8_t* s = Secret();
  if (len <= 16) {
    if (len > 8) {
      const uint64_t lo = Read64(in) ^ (Read64(s + 24) ^ Read64(s + 32));
      const uint64_t hi = Read64(in + len - 8) ^ (Read64(s + 40) ^ Read64(s + 48));
      return Avalanche(len + Swap64(lo) + hi + MulFold64(lo, hi));
    }
    if (len >= 4) {
      const uint64_t in1 = Read32(in);
      const uint64_t in2 = Read32(in + len - 4);
      const uint64_t bitflip = Read64(s + 8) ^ Read64(s + 16);
      return Rrmxmx((in2 + (in1 << 32)) ^ bitflip, len);
    }
    if (len > 0) {
      const uint32_t combined = (uint32_t{in[0]} << 16) | (uint32_t{in[len >> 1]} << 24) |
                                uint32_t{in[len - 1]} | (static_cast<uint32_t>(len) << 8);
      const uint64_t bitflip = uint64_t{Read32(s) ^ Read32(s + 4)};
      return Avalanche64(uint64_t{combined} ^ bitflip);
    }
    return Avalanche64(Read64(s + 56) ^ Read64(s + 64));
  }
  uint64_t acc = len * kPrime64_1;
  if (len <= 128) {
    if (len > 32) {
      if (len > 64) {
        if (len > 96) {
          acc += Mix16(in + 48, s + 96);
          acc += Mix16(in + len - 64, s + 112);
        }
        acc += Mix16(in + 32, s + 64);
        acc += Mix16(in + len - 48, s + 80);
      }
      acc += Mix16(in + 16, s + 32);
      acc += Mix16(in + len - 32, s + 48);
    }
    acc += Mix16(in, s);
    acc += Mix16(in + len - 16, s + 16);
    return Avalanche(acc);
  }
  for (int i = 0; i < 8; ++i) acc += Mix16(in + 16 * i, s + 16 * i);
  acc = Avalanche(acc);
  const int rounds = static_cast<int>(len / 16);
  for (int i = 8; i < rounds; ++i) acc += Mix16(in + 16 * i, s + 16 * (i - 8) + 3);
  acc += Mix16(in + len - 16, s + 136 - 17);
  return Avalanche(acc);
}

KVTIER_HD uint64_t InitAcc(int lane) {
  switch (lane) {
    case 0: return kPrime32_3;
    case 1: return kPrime64_1;
    case 2: return kPrime64_2;
    case 3: return kPrime64_3;
    case 4: return kPrime64_4;
    case 5: return kPrime32_2;
    case 6: return kPrime64_5;
    default: return kPrime32_1;
  }
}

// What `stripes` stripes starting at `in` add to accumulator `lane`, with the
// secret starting at `secret` and advancing 8 bytes per stripe.
KVTIER_HD uint64_t StripesLane(const uint8_t* in, uint32_t stripes, const uint8_t* secret, int lane) {
  uint64_t sum = 0;
  for (uint32_t s = 0; s < stripes; ++s) {
    const uint8_t* p = in + s * kStripeBytes;
    const uint64_t v = Read64(p + 8 * lane);
    const uint64_t k = v ^ Read64(secret + 8 * s + 8 * lane);
    sum += (k & 0xFFFFFFFFULL) * (k >> 32);
    sum += Read64(p + 8 * (lane ^ 1));  // lane^1's data lands in this lane
  }
  return sum;
}
// A full 1024-byte block's contribution to one lane.
KVTIER_HD uint64_t BlockLane(const uint8_t* block, int lane) {
  return StripesLane(block, kBlockBytes / kStripeBytes, Secret(), lane);
}
// After each full block.
KVTIER_HD uint64_t Scramble(uint64_t acc, int lane) {
  acc ^= acc >> 47;
  acc ^= Read64(Secret() + kSecretBytes - kStripeBytes + 8 * lane);
  return acc * kPrime32_1;
}
// Number of full blocks a long input (> 240 bytes) scrambles after.
KVTIER_HD uint64_t FullBlocks(uint64_t len) { return (len - 1) / kBlockBytes; }
// The tail after the full blocks: the partial block, then the last stripe.
KVTIER_HD uint64_t TailLane(const uint8_t* in, uint64_t len, uint64_t acc, int lane) {
  const uint64_t start = FullBlocks(len) * kBlockBytes;
  const uint32_t stripes = static_cast<uint32_t>((len - 1 - start) / kStripeBytes);
  acc += StripesLane(in + start, stripes, Secret(), lane);
  return acc + StripesLane(in + len - kStripeBytes, 1, Secret() + kSecretBytes - kStripeBytes - 7, lane);
}
KVTIER_HD uint64_t Merge(const uint64_t acc[8], uint64_t len) {
  const uint8_t* s = Secret() + 11;
  uint64_t r = len * kPrime64_1;
  for (int i = 0; i < 4; ++i) {
    r += MulFold64(acc[2 * i] ^ Read64(s + 16 * i), acc[2 * i + 1] ^ Read64(s + 16 * i + 8));
  }
  return Avalanche(r);
}

}  // namespace xxh3
}  // namespace kvtier::kernels::math

#endif  // KVTIER_KERNELS_KV_MATH_H_
