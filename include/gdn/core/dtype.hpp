#pragma once
// Element types. Checkpoints store weights as BF16 (sometimes F16 or F32; A_log and the GDN norm
// are often F32 even in BF16 checkpoints), so every kernel that reads weights is templated on the
// element type and accumulates in float.

#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace gdn {

enum class DType : std::uint8_t { f32, f16, bf16, i32, i64, u8, i8, i16, f64, boolean };

constexpr std::size_t dtype_size(DType t) noexcept {
  switch (t) {
    case DType::f64: case DType::i64: return 8;
    case DType::f32: case DType::i32: return 4;
    case DType::f16: case DType::bf16: case DType::i16: return 2;
    case DType::u8: case DType::i8: case DType::boolean: return 1;
  }
  return 0;
}

std::string_view dtype_name(DType t) noexcept;

// bfloat16: the upper half of an IEEE float32. Conversion to float is exact; conversion from float
// rounds to nearest even, as torch does, and keeps NaN a NaN.
struct bf16 {
  std::uint16_t bits;
};

inline float to_float(bf16 v) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(v.bits) << 16);
}

inline bf16 to_bf16(float f) noexcept {
  std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<std::uint16_t>((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<std::uint16_t>(u >> 16)};
}

// IEEE half precision, converted in software so the headers need no compiler extension.
struct f16 {
  std::uint16_t bits;
};

inline float to_float(f16 v) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(v.bits & 0x8000u) << 16;
  std::uint32_t exp = (v.bits >> 10) & 0x1fu;
  std::uint32_t man = v.bits & 0x3ffu;
  std::uint32_t out;
  if (exp == 0x1fu) {
    out = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    out = sign | ((exp + 112u) << 23) | (man << 13);
  } else if (man == 0) {
    out = sign;
  } else {  // subnormal: renormalise
    exp = 113;
    while ((man & 0x400u) == 0) { man <<= 1; --exp; }
    out = sign | (exp << 23) | ((man & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(out);
}

inline float to_float(float v) noexcept { return v; }

// Maps a C++ element type to its DType tag.
template <typename T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::f32; };
template <> struct dtype_of<bf16> { static constexpr DType value = DType::bf16; };
template <> struct dtype_of<f16> { static constexpr DType value = DType::f16; };
template <> struct dtype_of<std::int32_t> { static constexpr DType value = DType::i32; };
template <> struct dtype_of<std::int64_t> { static constexpr DType value = DType::i64; };

template <typename T>
concept WeightElement = std::same_as<T, float> || std::same_as<T, bf16> || std::same_as<T, f16>;

}  // namespace gdn
