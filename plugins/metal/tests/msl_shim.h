// The declarations of Metal Shading Language that kc's Metal kernels use, as C++17, so that the system C++ compiler
// can syntax- and type-check rendered kernels on machines without Metal. What C++ sees: every name a kernel uses is
// declared, calls have matching arity and argument types, conversions are ones C++ (and so MSL, a C++14 dialect) allows,
// as_type<> reinterprets values of equal size. What it cannot see: address-space rules (the qualifiers are erased),
// Metal-only overload sets and attribute placement rules, and numerics.
#pragma once
#include <cmath>
#include <cstddef>
#include <type_traits>

#define kernel
#define device
#define threadgroup
#define constant
#define thread

typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;
static_assert(sizeof(long) == 8, "MSL's long is 64 bits");
typedef _Float16 half;

// MSL 3.1's bfloat: 16 bits, converts to and from float (kc does its arithmetic in float)
struct bfloat {
  ushort bits;
  bfloat() = default;
  bfloat(float f);
  operator float() const;
};

namespace metal {

template <class T, int N> struct vec;
#define KC_VEC_BODY(N)                                                                                       \
  vec() = default;                                                                                           \
  template <class... A, class = std::enable_if_t<sizeof...(A) == N && (std::is_convertible_v<A, T> && ...)>> \
  vec(A... a) { T v[N] = {T(a)...}; for (int i = 0; i < N; i++) (*this)[i] = v[i]; }                         \
  template <class U> explicit vec(const vec<U, N>& o) { for (int i = 0; i < N; i++) (*this)[i] = T(o[i]); }  \
  T& operator[](int i) { return (&x)[i]; }                                                                   \
  const T& operator[](int i) const { return (&x)[i]; }
template <class T> struct vec<T, 2> { T x, y; KC_VEC_BODY(2) };
template <class T> struct vec<T, 3> { T x, y, z; KC_VEC_BODY(3) };
template <class T> struct vec<T, 4> { T x, y, z, w; KC_VEC_BODY(4) };

#define KC_VEC_OP(OP)                                                                                         \
  template <class T, int N> vec<T, N> operator OP(const vec<T, N>& a, const vec<T, N>& b);                   \
  template <class T, int N, class S, class = std::enable_if_t<std::is_arithmetic_v<S>>>                      \
  vec<T, N> operator OP(const vec<T, N>& a, S b);                                                            \
  template <class T, int N, class S, class = std::enable_if_t<std::is_arithmetic_v<S>>>                      \
  vec<T, N> operator OP(S a, const vec<T, N>& b);
KC_VEC_OP(+) KC_VEC_OP(-) KC_VEC_OP(*) KC_VEC_OP(/)

#define KC_VEC_TYPES(T)                                                                                       \
  typedef vec<T, 2> T##2;                                                                                     \
  typedef vec<T, 3> T##3;                                                                                     \
  typedef vec<T, 4> T##4;
KC_VEC_TYPES(float) KC_VEC_TYPES(half) KC_VEC_TYPES(bfloat) KC_VEC_TYPES(int) KC_VEC_TYPES(uint) KC_VEC_TYPES(short)
KC_VEC_TYPES(ushort) KC_VEC_TYPES(char) KC_VEC_TYPES(uchar) KC_VEC_TYPES(long) KC_VEC_TYPES(ulong) KC_VEC_TYPES(bool)

// bit reinterpretation between types of one size
template <class T, class U> T as_type(U u) { static_assert(sizeof(T) == sizeof(U), "as_type<> needs types of one size"); return T(); }

enum class mem_flags { mem_none, mem_device, mem_threadgroup, mem_texture };
void threadgroup_barrier(mem_flags flags);

// math: MSL has these for float and half (and their vectors); an int argument is ambiguous here as it is an error there
#define KC_MATH1(F)                                                                                           \
  float F(float x);                                                                                           \
  half F(half x);                                                                                             \
  template <class T, int N> vec<T, N> F(const vec<T, N>& x);
KC_MATH1(sqrt) KC_MATH1(exp2) KC_MATH1(log2) KC_MATH1(sin) KC_MATH1(cos) KC_MATH1(exp) KC_MATH1(log) KC_MATH1(rsqrt)
KC_MATH1(fabs) KC_MATH1(trunc) KC_MATH1(floor) KC_MATH1(ceil)
float fma(float a, float b, float c);
half fma(half a, half b, half c);
float max(float a, float b);
half max(half a, half b);
float min(float a, float b);
half min(half a, half b);
bool isnan(float x);
bool isnan(half x);
bool isinf(float x);
bool isinf(half x);

// simdgroup matrices: 8x8 tiles spread over a simdgroup's 32 threads, 2 elements each (thread_elements())
template <class T, int Cols, int Rows> struct simdgroup_matrix {
  static_assert(Cols == 8 && Rows == 8, "kc uses 8x8 simdgroup matrices");
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, half> || std::is_same_v<T, bfloat>, "simdgroup matrices hold float, half or bfloat");
  vec<T, 2>& thread_elements();
};
typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;
typedef simdgroup_matrix<half, 8, 8> simdgroup_half8x8;
typedef simdgroup_matrix<bfloat, 8, 8> simdgroup_bfloat8x8;
template <class TD, class TA, class TB, class TC, int M, int N, int K>
void simdgroup_multiply_accumulate(simdgroup_matrix<TD, N, M>& d, const simdgroup_matrix<TA, K, M>& a, const simdgroup_matrix<TB, N, K>& b,
                                   const simdgroup_matrix<TC, N, M>& c);

}  // namespace metal
