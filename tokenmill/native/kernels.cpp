// tokenmill's native CPU decode kernels: plain C++ (no torch headers), called through ctypes from
// tokenmill/native/kernels.py, which checks shapes, dtypes and strides before calling.
//
//   tm_add_rms_norm   residual += x (optional); out = rmsnorm(residual) * w      rows of D
//   tm_add_layer_norm the same with a LayerNorm (the mean taken out, no bias: Cohere's)
//   tm_head_rms_norm  each head of each row normalized in place, one weight for all heads (Qwen3's q / k norms;
//                     Gemma's with (1 + w))
//   tm_silu_and_mul   out = silu(gate) * up, from the fused (T, 2I) gate|up rows
//   tm_gelu_tanh_and_mul
//                     out = gelu_tanh(gate) * up, the same rows (Gemma's MLP)
//   tm_sigmoid_mul    x *= sigmoid(g) in place, per head (Qwen3.5's attention output gate)
//   tm_sigmoid_f32    sigmoid of a vector into fp32 (a gated shared expert's per-token weight)
//   tm_rotary_part    q and k heads rotated in place (HF rotate-half) by per-token cos / signed-sin rows: each
//                     head's leading dims (all of them, or partial rotary's)
//   tm_argmax_rows    greedy picks: the index of each row's first maximum (logits rows)
//   tm_paged_decode_attention
//                     one query token per sequence against its paged K/V: for each KV head, all its
//                     query heads against tiles of 16 keys, online softmax; the context is cut into
//                     fixed partitions (flash-decoding), merged at the end
//   tm_gdn_decode     a Gated DeltaNet layer's decode step between its projections (conv, norms, delta rule,
//                     gated norm), over the recurrent state pools: each sequence's state read from one slot
//                     (or zero) and written to another (or the same, in place)
//   tm_paged_attention_rows
//                     the same, with the rows from one index on marked as a prompt's: at bf16 with
//                     AVX512_BF16 those take lane-wise tiles (query heads in the lanes; attend_range_lanes)
//   tm_mamba2_decode  a Mamba2 layer's decode step between in_proj and out_proj (conv, selective scan, gated
//                     norm), over the recurrent state pools, src / dst slots as tm_gdn_decode's
//   tm_shortconv_decode
//                     an LFM2 short conv layer's decode step between in_proj and out_proj (C * conv(B * x)), over
//                     the conv state pool, src / dst slots as tm_gdn_decode's
//
// Element types: fp32 (`float`) and bf16 (`uint16_t`, converted to fp32 in registers; all arithmetic is
// fp32, results rounded to nearest even once; but prompt rows' lane-wise tiles, AVX512_BF16's: q.k as bf16
// products summed in fp32, p.v with each probability as the sum of two bf16). The `dtype` argument: 0 = fp32, 1 = bf16.
//
// Every result is a function of its own row (or sequence) only (and of whether it is a prompt row): the partition size is fixed, never
// chosen from the batch or the thread count, so a sequence gets the same bits alone or in any batch.
//
// OpenMP: each entry point takes the thread count explicitly, and opens a parallel region only above a
// work threshold (a region costs microseconds when idle and far more on a busy machine).
//
// Vector code: AVX2 + FMA intrinsics when the compiler targets them (-march=native), otherwise (or with
// -DTM_PORTABLE) the same kernels over a plain 8-float struct that the compiler vectorizes as it can.
// Where it targets AVX-512 too, 16-float vectors (V16) take the wide loops: silu*mul and the norm (the
// same operations per element, so the same bits as 8 lanes) and bf16 decode attention's tiles; -DTM_NO_AVX512
// builds the 8-lane code alone (for A/B runs).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>
#include <type_traits>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#if defined(__AVX2__) && defined(__FMA__) && !defined(TM_PORTABLE)
#include <immintrin.h>
#define TM_AVX2 1
#endif

namespace {

using bf16 = uint16_t;

// ---- scalar conversions ---------------------------------------------------------------------------
inline float to_f32(float x) { return x; }
inline float to_f32(bf16 x) {
    uint32_t u = uint32_t(x) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline void store1(float* p, float x) { *p = x; }
inline void store1(bf16* p, float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep it a (quiet) NaN
        *p = bf16((u >> 16) | 0x40);
        return;
    }
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
    *p = bf16(u >> 16);
}

// ---- 8-float vectors ------------------------------------------------------------------------------
#ifdef TM_AVX2
struct V8 {
    __m256 v;
};
inline V8 vzero() { return {_mm256_setzero_ps()}; }
inline V8 vset1(float x) { return {_mm256_set1_ps(x)}; }
inline V8 vload(const float* p) { return {_mm256_loadu_ps(p)}; }
inline V8 vload(const bf16* p) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return {_mm256_castsi256_ps(_mm256_slli_epi32(w, 16))};
}
inline void vstore(float* p, V8 a) { _mm256_storeu_ps(p, a.v); }
inline void vstore(bf16* p, V8 a) {
    __m256i u = _mm256_castps_si256(a.v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(a.v, a.v, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(u, _mm256_set1_epi32(0x400000)), nan);
    r = _mm256_srli_epi32(r, 16);
    __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
}
inline V8 operator+(V8 a, V8 b) { return {_mm256_add_ps(a.v, b.v)}; }
inline V8 operator-(V8 a, V8 b) { return {_mm256_sub_ps(a.v, b.v)}; }
inline V8 operator*(V8 a, V8 b) { return {_mm256_mul_ps(a.v, b.v)}; }
inline V8 operator/(V8 a, V8 b) { return {_mm256_div_ps(a.v, b.v)}; }
inline V8 fma(V8 a, V8 b, V8 c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }  // a * b + c
inline V8 vmax(V8 a, V8 b) { return {_mm256_max_ps(a.v, b.v)}; }
inline V8 vmin(V8 a, V8 b) { return {_mm256_min_ps(a.v, b.v)}; }
inline float hsum(V8 a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a.v), _mm256_extractf128_ps(a.v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
inline float hmax(V8 a) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(a.v), _mm256_extractf128_ps(a.v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
// lane j of the result = the sum of the lanes of a[j]
inline V8 reduce8(const V8* a) {
    __m256 s01 = _mm256_hadd_ps(a[0].v, a[1].v), s23 = _mm256_hadd_ps(a[2].v, a[3].v);
    __m256 s45 = _mm256_hadd_ps(a[4].v, a[5].v), s67 = _mm256_hadd_ps(a[6].v, a[7].v);
    __m256 s0123 = _mm256_hadd_ps(s01, s23), s4567 = _mm256_hadd_ps(s45, s67);
    // s0123 = [a0 a1 a2 a3 (low halves) | a0 a1 a2 a3 (high halves)], likewise s4567
    __m256 lo = _mm256_permute2f128_ps(s0123, s4567, 0x20), hi = _mm256_permute2f128_ps(s0123, s4567, 0x31);
    return {_mm256_add_ps(lo, hi)};
}
// Makes the compiler materialize `a` in a register here: a vector used by several FMAs is then loaded
// once, where GCC would otherwise fold the load into each FMA (the load ports, not the FMAs, then bound
// the attention loops)
inline void in_register(V8& a) { asm("" : "+x"(a.v)); }
// lanes 0-3 to lo[0..4), lanes 4-7 to hi[0..4)
inline void vstore_halves(float* lo, float* hi, V8 a) {
    _mm_storeu_ps(lo, _mm256_castps256_ps128(a.v));
    _mm_storeu_ps(hi, _mm256_extractf128_ps(a.v, 1));
}
// lanes where a < b get x, the others y
inline V8 select_lt(V8 a, V8 b, V8 x, V8 y) { return {_mm256_blendv_ps(y.v, x.v, _mm256_cmp_ps(a.v, b.v, _CMP_LT_OQ))}; }
inline V8 vround(V8 a) { return {_mm256_round_ps(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)}; }
// 2^n for integral n in [-126, 127], as a float
inline V8 vpow2i(V8 n) {
    __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(n.v), _mm256_set1_epi32(127));
    return {_mm256_castsi256_ps(_mm256_slli_epi32(e, 23))};
}
#else
struct V8 {
    float f[8];
};
#define TM_LANES(expr)          \
    V8 r;                       \
    for (int i = 0; i < 8; ++i) \
        r.f[i] = (expr);        \
    return r
inline V8 vzero() { TM_LANES(0.0f); }
inline V8 vset1(float x) { TM_LANES(x); }
inline V8 vload(const float* p) { TM_LANES(p[i]); }
inline V8 vload(const bf16* p) { TM_LANES(to_f32(p[i])); }
inline void vstore(float* p, V8 a) {
    for (int i = 0; i < 8; ++i) p[i] = a.f[i];
}
inline void vstore(bf16* p, V8 a) {
    for (int i = 0; i < 8; ++i) store1(p + i, a.f[i]);
}
inline V8 operator+(V8 a, V8 b) { TM_LANES(a.f[i] + b.f[i]); }
inline V8 operator-(V8 a, V8 b) { TM_LANES(a.f[i] - b.f[i]); }
inline V8 operator*(V8 a, V8 b) { TM_LANES(a.f[i] * b.f[i]); }
inline V8 operator/(V8 a, V8 b) { TM_LANES(a.f[i] / b.f[i]); }
inline V8 fma(V8 a, V8 b, V8 c) { TM_LANES(std::fma(a.f[i], b.f[i], c.f[i])); }
inline V8 vmax(V8 a, V8 b) { TM_LANES(a.f[i] > b.f[i] ? a.f[i] : b.f[i]); }
inline V8 vmin(V8 a, V8 b) { TM_LANES(a.f[i] < b.f[i] ? a.f[i] : b.f[i]); }
inline float hsum(V8 a) {
    float s0 = (a.f[0] + a.f[4]) + (a.f[2] + a.f[6]), s1 = (a.f[1] + a.f[5]) + (a.f[3] + a.f[7]);
    return s0 + s1;
}
inline float hmax(V8 a) {
    float m = a.f[0];
    for (int i = 1; i < 8; ++i) m = a.f[i] > m ? a.f[i] : m;
    return m;
}
inline V8 reduce8(const V8* a) { TM_LANES(hsum(a[i])); }
inline void in_register(V8&) {}
inline void vstore_halves(float* lo, float* hi, V8 a) {
    for (int i = 0; i < 4; ++i) lo[i] = a.f[i], hi[i] = a.f[4 + i];
}
inline V8 select_lt(V8 a, V8 b, V8 x, V8 y) { TM_LANES(a.f[i] < b.f[i] ? x.f[i] : y.f[i]); }
inline V8 vround(V8 a) { TM_LANES(std::nearbyint(a.f[i])); }
inline V8 vpow2i(V8 n) {
    V8 r;
    for (int i = 0; i < 8; ++i) {
        uint32_t u = uint32_t(int32_t(n.f[i]) + 127) << 23;
        std::memcpy(&r.f[i], &u, 4);
    }
    return r;
}
#undef TM_LANES
#endif

// ---- 16-float vectors (AVX-512) ----------------------------------------------------------------------
// The wide loops use them (silu*mul, the norm) and bf16 decode attention's tiles (Lanes16), where the cache's
// head rows are 64 or 128 wide: a key or value row widened 16 lanes at a time halves the instructions per
// element of the 8-lane path, which bounds bf16 attention below the memory's speed on AVX-512 CPUs.
#if defined(TM_AVX2) && defined(__AVX512F__) && !defined(TM_NO_AVX512)
#define TM_AVX512 1
struct V16 {
    __m512 v;
};
inline V16 vzero16() { return {_mm512_setzero_ps()}; }
inline V16 vset16(float x) { return {_mm512_set1_ps(x)}; }
inline V16 vload16(const float* p) { return {_mm512_loadu_ps(p)}; }
inline V16 vload16(const bf16* p) {
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return {_mm512_castsi512_ps(_mm512_slli_epi32(w, 16))};
}
inline void vstore(float* p, V16 a) { _mm512_storeu_ps(p, a.v); }
inline void vstore(bf16* p, V16 a) {  // as vstore(bf16*, V8), 16 lanes
    __m512i u = _mm512_castps_si512(a.v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
    r = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(a.v, a.v, _CMP_UNORD_Q), r,
                                _mm512_or_si512(u, _mm512_set1_epi32(0x400000)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
}
inline V16 operator+(V16 a, V16 b) { return {_mm512_add_ps(a.v, b.v)}; }
inline V16 operator-(V16 a, V16 b) { return {_mm512_sub_ps(a.v, b.v)}; }
inline V16 operator*(V16 a, V16 b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline V16 operator/(V16 a, V16 b) { return {_mm512_div_ps(a.v, b.v)}; }
inline V16 fma(V16 a, V16 b, V16 c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
inline V16 vmax(V16 a, V16 b) { return {_mm512_max_ps(a.v, b.v)}; }
inline V16 vmin(V16 a, V16 b) { return {_mm512_min_ps(a.v, b.v)}; }
inline float hmax(V16 a) { return _mm512_reduce_max_ps(a.v); }
inline float hsum(V16 a) { return _mm512_reduce_add_ps(a.v); }
inline void in_register(V16& a) { asm("" : "+v"(a.v)); }
// the low and high 8 lanes
inline V8 lo8(V16 a) { return {_mm512_castps512_ps256(a.v)}; }
inline V8 hi8(V16 a) { return {_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a.v), 1))}; }
inline V8 fold(V16 a) { return lo8(a) + hi8(a); }  // lanes 0-7 + lanes 8-15
inline V16 select_lt(V16 a, V16 b, V16 x, V16 y) {
    return {_mm512_mask_blend_ps(_mm512_cmp_ps_mask(a.v, b.v, _CMP_LT_OQ), y.v, x.v)};
}
inline V16 vround(V16 a) { return {_mm512_roundscale_ps(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)}; }
inline V16 vpow2i(V16 n) {
    __m512i e = _mm512_add_epi32(_mm512_cvtps_epi32(n.v), _mm512_set1_epi32(127));
    return {_mm512_castsi512_ps(_mm512_slli_epi32(e, 23))};
}
#endif

template <typename V>
inline V splat(float x);
template <>
inline V8 splat<V8>(float x) { return vset1(x); }
#ifdef TM_AVX512
template <>
inline V16 splat<V16>(float x) { return vset16(x); }
#endif

// exp(x), relative error ~2e-7; 0 below -87.3 (and for -inf); clamped at 88 (exp(88) ~ 1.7e38, finite).
// x = n ln2 + r with |r| <= ln2/2; exp(r) by its Taylor series to r^7 (truncation < 1e-8). V: V8 or V16.
template <typename V>
inline V vexp(V x) {
    const V lo = splat<V>(-87.3f);
    V xc = vmin(vmax(x, lo), splat<V>(88.0f));
    V n = vround(xc * splat<V>(1.44269504088896341f));  // in [-126, 127]
    V r = fma(n, splat<V>(-0.693359375f), xc);  // ln2 in two parts: n * hi is exact
    r = fma(n, splat<V>(2.12194440e-4f), r);
    V p = splat<V>(1.0f / 5040);
    p = fma(p, r, splat<V>(1.0f / 720));
    p = fma(p, r, splat<V>(1.0f / 120));
    p = fma(p, r, splat<V>(1.0f / 24));
    p = fma(p, r, splat<V>(1.0f / 6));
    p = fma(p, r, splat<V>(0.5f));
    p = fma(p, r, splat<V>(1.0f));
    p = fma(p, r, splat<V>(1.0f));
    return select_lt(x, lo, splat<V>(0.0f), p * vpow2i(n));
}

inline float exp1(float x) { return x < -87.3f ? 0.0f : std::exp(x); }

// Work of at least this many elements (or multiply-adds) gets an OpenMP region; below it, one thread.
constexpr int64_t kParallelMinWork = int64_t(1) << 18;

inline int threads_for(int64_t work, int nthreads) { return (nthreads > 1 && work >= kParallelMinWork) ? nthreads : 1; }

// f(t) for t in [0, rows): on nt threads, or (nt == 1) as a plain loop that never enters OpenMP
template <typename F>
void for_rows(int64_t rows, int nt, F&& f) {
    if (nt > 1) {
#pragma omp parallel for num_threads(nt) schedule(static)
        for (int64_t t = 0; t < rows; ++t) f(t);
    } else {
        for (int64_t t = 0; t < rows; ++t) f(t);
    }
}

// The row a fused norm normalizes: res after res += x (each sum rounded to T) when there is a residual, else x.
// Read back from res: in bf16 the norm sees the rounded sum, as the unfused ops would.
template <typename T>
const T* add_residual(const T* x, T* res, int64_t D) {
    if (res == nullptr) return x;
    int64_t i = 0;
#ifdef TM_AVX512
    for (; i + 16 <= D; i += 16) vstore(res + i, vload16(res + i) + vload16(x + i));
#endif
    for (; i + 8 <= D; i += 8) vstore(res + i, vload(res + i) + vload(x + i));
    for (; i < D; ++i) store1(res + i, to_f32(res[i]) + to_f32(x[i]));
    return res;
}

// ---- fused residual add + RMSNorm -----------------------------------------------------------------
// w: the scale, in T or (an offset norm's 1 + w, tm_head_rms_norm) fp32
template <typename T, typename W>
void add_rms_norm_row(T* out, const T* x, T* res, const W* w, int64_t D, float eps) {
    const T* src = add_residual(x, res, D);
    V8 acc[4] = {vzero(), vzero(), vzero(), vzero()};
    int64_t i = 0;
#ifdef TM_AVX512  // lanes 0-15 and 16-31 of each 32: acc[0] | acc[1] and acc[2] | acc[3], the same sums
    if (D >= 32) {
        V16 a01 = vzero16(), a23 = vzero16();
        for (; i + 32 <= D; i += 32) {
            const V16 v0 = vload16(src + i), v1 = vload16(src + i + 16);
            a01 = fma(v0, v0, a01);
            a23 = fma(v1, v1, a23);
        }
        acc[0] = lo8(a01), acc[1] = hi8(a01), acc[2] = lo8(a23), acc[3] = hi8(a23);
    }
#endif
    for (; i + 32 <= D; i += 32)
        for (int u = 0; u < 4; ++u) {
            V8 v = vload(src + i + 8 * u);
            acc[u] = fma(v, v, acc[u]);
        }
    for (; i + 8 <= D; i += 8) {
        V8 v = vload(src + i);
        acc[0] = fma(v, v, acc[0]);
    }
    float ss = hsum((acc[0] + acc[1]) + (acc[2] + acc[3]));
    for (; i < D; ++i) ss += to_f32(src[i]) * to_f32(src[i]);
    const float inv = 1.0f / std::sqrt(ss / float(D) + eps);
    const V8 vinv = vset1(inv);
    i = 0;
#ifdef TM_AVX512
    const V16 vinv16 = vset16(inv);
    for (; i + 16 <= D; i += 16) vstore(out + i, (vload16(src + i) * vinv16) * vload16(w + i));
#endif
    for (; i + 8 <= D; i += 8) vstore(out + i, (vload(src + i) * vinv) * vload(w + i));
    for (; i < D; ++i) store1(out + i, (to_f32(src[i]) * inv) * to_f32(w[i]));
}

template <typename T>
void add_rms_norm(T* out, int64_t out_stride, const T* x, int64_t x_stride, T* res, int64_t res_stride,
                  const T* w, int64_t rows, int64_t D, float eps, int nthreads) {
    for_rows(rows, threads_for(rows * D, nthreads), [&](int64_t t) {
        add_rms_norm_row(out + t * out_stride, x + t * x_stride, res ? res + t * res_stride : nullptr, w, D, eps);
    });
}

// ---- fused residual add + LayerNorm without a bias (Cohere's) ---------------------------------------------
// out = (r - mean(r)) / sqrt(var(r) + eps) * w for r = (res += x) (rounded as the residual add of the RMSNorm), or
// r = x; the mean, then the variance about it, each summed in fp32 over 8 lanes.
template <typename T>
void add_layer_norm_row(T* out, const T* x, T* res, const T* w, int64_t D, float eps) {
    const T* src = add_residual(x, res, D);
    V8 acc = vzero();
    int64_t i = 0;
    for (; i + 8 <= D; i += 8) acc = acc + vload(src + i);
    float sum = hsum(acc);
    for (; i < D; ++i) sum += to_f32(src[i]);
    const float mean = sum / float(D);
    const V8 vmean = vset1(mean);
    acc = vzero();
    for (i = 0; i + 8 <= D; i += 8) {
        const V8 d = vload(src + i) - vmean;
        acc = fma(d, d, acc);
    }
    float ss = hsum(acc);
    for (; i < D; ++i) ss += (to_f32(src[i]) - mean) * (to_f32(src[i]) - mean);
    const float inv = 1.0f / std::sqrt(ss / float(D) + eps);
    const V8 vinv = vset1(inv);
    for (i = 0; i + 8 <= D; i += 8) vstore(out + i, ((vload(src + i) - vmean) * vinv) * vload(w + i));
    for (; i < D; ++i) store1(out + i, ((to_f32(src[i]) - mean) * inv) * to_f32(w[i]));
}

// ---- silu(gate) * up ------------------------------------------------------------------------------
template <typename T>
void silu_and_mul(T* out, int64_t out_stride, const T* in, int64_t in_stride, int64_t rows, int64_t I,
                  int nthreads) {
    for_rows(rows, threads_for(rows * I, nthreads), [&](int64_t t) {
        const T* g = in + t * in_stride;
        const T* u = g + I;
        T* o = out + t * out_stride;
        const V8 one = vset1(1.0f);
        int64_t i = 0;
#ifdef TM_AVX512  // the same operations on 16 lanes: the same bits
        for (; i + 16 <= I; i += 16) {
            V16 gv = vload16(g + i);
            vstore(o + i, (gv / (vset16(1.0f) + vexp(vzero16() - gv))) * vload16(u + i));
        }
#endif
        for (; i + 8 <= I; i += 8) {
            V8 gv = vload(g + i);
            vstore(o + i, (gv / (one + vexp(vzero() - gv))) * vload(u + i));
        }
        for (; i < I; ++i) {
            float gv = to_f32(g[i]);
            store1(o + i, (gv / (1.0f + std::exp(-gv))) * to_f32(u[i]));
        }
    });
}

// ---- gelu(gate, tanh approximation) * up ----------------------------------------------------------------------
// gelu_tanh(g) = g (1 + tanh(z)) / 2 with z = sqrt(2 / pi) (g + 0.044715 g^3), computed as g / (1 + exp(-2 z))
// (the same function: (1 + tanh z) / 2 = sigmoid(2 z)), which keeps its precision where 1 + tanh(z) cancels.
template <typename T>
void gelu_tanh_and_mul(T* out, int64_t out_stride, const T* in, int64_t in_stride, int64_t rows, int64_t I,
                       int nthreads) {
    constexpr float kC = -2.0f * 0.7978845608028654f, kA = 0.044715f;  // -2 sqrt(2 / pi)
    for_rows(rows, threads_for(rows * I, nthreads), [&](int64_t t) {
        const T* g = in + t * in_stride;
        const T* u = g + I;
        T* o = out + t * out_stride;
        int64_t i = 0;
#ifdef TM_AVX512  // the same operations on 16 lanes: the same bits
        for (; i + 16 <= I; i += 16) {
            V16 gv = vload16(g + i);
            V16 z = (gv + (vset16(kA) * gv) * (gv * gv)) * vset16(kC);
            vstore(o + i, (gv / (vset16(1.0f) + vexp(z))) * vload16(u + i));
        }
#endif
        for (; i + 8 <= I; i += 8) {
            V8 gv = vload(g + i);
            V8 z = (gv + (vset1(kA) * gv) * (gv * gv)) * vset1(kC);
            vstore(o + i, (gv / (vset1(1.0f) + vexp(z))) * vload(u + i));
        }
        for (; i < I; ++i) {
            float gv = to_f32(g[i]);
            float z = (gv + (kA * gv) * (gv * gv)) * kC;
            store1(o + i, (gv / (1.0f + std::exp(std::min(z, 88.0f)))) * to_f32(u[i]));
        }
    });
}

// ---- x *= sigmoid(g), per head (Qwen3.5's attention output gate) ---------------------------------------------
// x (rows, heads, hd), heads hd apart; g's heads g_head_stride apart: x / (1 + exp(-g)), rounded once.
template <typename T>
void sigmoid_mul(T* x, int64_t x_stride, const T* g, int64_t g_stride, int64_t g_head_stride, int64_t rows,
                 int64_t heads, int64_t hd, int nthreads) {
    for_rows(rows * heads, threads_for(rows * heads * hd, nthreads), [&](int64_t r) {
        T* o = x + (r / heads) * x_stride + (r % heads) * hd;
        const T* gg = g + (r / heads) * g_stride + (r % heads) * g_head_stride;
        int64_t i = 0;
#ifdef TM_AVX512  // the same operations on 16 lanes: the same bits
        for (; i + 16 <= hd; i += 16)
            vstore(o + i, vload16(o + i) / (vset16(1.0f) + vexp(vzero16() - vload16(gg + i))));
#endif
        for (; i + 8 <= hd; i += 8) vstore(o + i, vload(o + i) / (vset1(1.0f) + vexp(vzero() - vload(gg + i))));
        for (; i < hd; ++i) store1(o + i, to_f32(o[i]) / (1.0f + std::exp(std::min(-to_f32(gg[i]), 88.0f))));
    });
}

// ---- rotary, in place -----------------------------------------------------------------------------
// x[i] = x[i] cos[i] + x[i + h] ssin[i];  x[i + h] = x[i + h] cos[i + h] + x[i] ssin[i + h]   (i < h = hd/2)
// Each product is rounded before the sum (no FMA), as torch's x * cos + roll(x) * ssin: in fp32 the
// result is bit-identical to the torch path.
// hd: the rotating dims, the leading ones of each head (partial rotary where head_stride > hd).
template <typename T>
void rotary(T* x, int64_t x_stride, int64_t heads, int64_t head_stride, int64_t hd, const T* cos, const T* ssin,
            int64_t tab_stride, int64_t rows, int nthreads) {
    const int64_t h = hd / 2;
    for_rows(rows, threads_for(rows * heads * hd, nthreads), [&](int64_t t) {
        const T* c = cos + t * tab_stride;
        const T* s = ssin + t * tab_stride;
        for (int64_t hh = 0; hh < heads; ++hh) {
            T* a = x + t * x_stride + hh * head_stride;
            T* b = a + h;
            int64_t i = 0;
            for (; i + 8 <= h; i += 8) {
                V8 av = vload(a + i), bv = vload(b + i);
                V8 p1 = av * vload(c + i), p2 = bv * vload(s + i);
                V8 p3 = bv * vload(c + h + i), p4 = av * vload(s + h + i);
                vstore(a + i, p1 + p2);
                vstore(b + i, p3 + p4);
            }
            for (; i < h; ++i) {
                float av = to_f32(a[i]), bv = to_f32(b[i]);
                float p1 = av * to_f32(c[i]), p2 = bv * to_f32(s[i]);
                float p3 = bv * to_f32(c[h + i]), p4 = av * to_f32(s[h + i]);
                store1(a + i, p1 + p2);
                store1(b + i, p3 + p4);
            }
        }
    });
}

// ---- greedy picks: the first maximum of each row ---------------------------------------------------
// out[r] = the index of the first maximum of row r of x (rows, V; rows `stride` apart), or -1 where the row
// holds a NaN or an infinity (the caller asks torch for those rows' answer; its rules for NaN are its own).
// One pass: the maximum of each run of 64 values, the first run whose maximum beats all before it, then
// the first value in that run equal to it.
template <typename T>
void argmax_rows(const T* x, int64_t stride, int64_t rows, int64_t V, int64_t* out, int nthreads) {
    for_rows(rows, threads_for(rows * V, nthreads), [&](int64_t r) {
        const T* p = x + r * stride;
        float best = -std::numeric_limits<float>::infinity();
        int64_t run = -1, at = -1;  // the best's run of 64 (searched below), or its exact index in the tail
        V8 z = vzero();  // x * 0 summed: NaN once any value is NaN or infinite
        int64_t i = 0;
        for (; i + 64 <= V; i += 64) {
            V8 c = vload(p + i);
            z = z + c * vzero();
            for (int k = 8; k < 64; k += 8) {
                const V8 v = vload(p + i + k);
                c = vmax(v, c);
                z = z + v * vzero();
            }
            const float cm = hmax(c);
            if (cm > best) best = cm, run = i;
        }
        float zs = hsum(z);
        for (; i < V; ++i) {
            const float v = to_f32(p[i]);
            zs += v * 0.0f;
            if (v > best) best = v, at = i, run = -1;
        }
        if (zs != zs || (run < 0 && at < 0)) {  // a NaN or an infinity, or nothing above -inf
            out[r] = -1;
            return;
        }
        if (run >= 0)
            for (at = run; to_f32(p[at]) != best; ++at) {
            }
        out[r] = at;
    });
}

// ---- paged decode attention -----------------------------------------------------------------------
constexpr int kTile = 16;  // keys per tile
constexpr int64_t kMaxRun = 16;  // rows attended together (paged_decode's runs)

struct AttnArgs {
    int64_t nh, nkv, hd, bs;
    int64_t kv_slot_stride;  // elements between consecutive cache slots (nkv * hd)
    float scale;
    float softcap;  // > 0: each score s becomes softcap * tanh(s / softcap) before the softmax (Gemma 2)
    const float* sinks = nullptr;  // (nh,): one more logit per query head in each softmax, with no value (gpt-oss)
};

// Vectors for the tiles: L::V holds L::N floats; loads (fp32, or bf16 widened), zero, broadcast, and the
// fold to 8 lanes (the sum of the two halves; the identity on 8 lanes). Lanes8 is the AVX2 (or portable)
// vector, Lanes16 AVX-512's.
struct Lanes8 {
    using V = V8;
    static constexpr int64_t N = 8;
    template <typename U>
    static V load(const U* p) { return vload(p); }
    static V zero() { return vzero(); }
    static V set1(float x) { return vset1(x); }
    static V8 fold(V8 a) { return a; }
};
#ifdef TM_AVX512
struct Lanes16 {
    using V = V16;
    static constexpr int64_t N = 16;
    template <typename U>
    static V load(const U* p) { return vload16(p); }
    static V zero() { return vzero16(); }
    static V set1(float x) { return vset16(x); }
    static V8 fold(V16 a) { return ::fold(a); }
};
#endif

// Register blocking for G query heads (G <= 8) of one KV head, for the vectors L: widened scores take KJ keys
// at a time (G * KJ accumulators, each key vector widened once for all G heads), values CB vectors of the
// head dim at a time (G * CB accumulators, each value vector loaded once for all G heads). 16 registers of
// 8 lanes, 32 of 16.
template <int G, typename L>
struct Block {
    static constexpr int KJ = L::N == 8 ? (G == 1 ? 8 : G == 2 ? 4 : G <= 4 ? 2 : 1) : (G <= 2 ? 8 : G <= 4 ? 4 : 2);
    static constexpr int CB = KJ;
};

// sc[g][j] = q[g] . k_j for the tile's 16 rows (rows past n: anything; the caller masks them), NC vectors of
// L::N a head. fp32 keys on 8 lanes: per head, 8 keys at a time, their 8 sums reduced into one vector of the
// 8 scores and stored whole (the softmax loads it back as one vector, which stores of scattered lanes make
// wait: ~25% of a 5-row verification's attention; measured in benchmarks/README.md). Widened keys (bf16): KJ
// keys at a time for all G heads, so each key vector is widened once (widening it per head measured ~20%
// slower); each sum folded to 8 lanes, 8 sums reduced into one vector.
template <int G, typename L, typename U>
inline void tile_scores(const float* q, int64_t NC, const U* const* kp, int n, float (*sc)[kTile]) {
    using V = typename L::V;
    const int64_t hd = NC * L::N;
    if constexpr (std::is_same<U, float>::value && L::N == 8) {
        for (int j0 = 0; j0 < n; j0 += 8)
            for (int g = 0; g < G; ++g) {
                asm volatile("" ::: "memory");
                V8 s[8];  // s[j]: key j0 + j
                for (int j = 0; j < 8; ++j) s[j] = vzero();
                V8 qv;
                for (int64_t c = 0; c < NC; ++c) {
                    qv = vload(q + g * hd + 8 * c);
                    in_register(qv);
                    for (int j = 0; j < 8; ++j) s[j] = fma(qv, vload(kp[j0 + j] + 8 * c), s[j]);
                }
                vstore(&sc[g][j0], reduce8(s));
            }
    } else {
        constexpr int KJ = Block<G, L>::KJ, NS = G * KJ, N8 = (NS + 7) / 8;
        for (int j0 = 0; j0 < n; j0 += KJ) {
            asm volatile("" ::: "memory");
            V s[NS];  // s[g * KJ + j]: head g, key j0 + j
            for (int i = 0; i < NS; ++i) s[i] = L::zero();
            for (int64_t c = 0; c < NC; ++c) {
                V k[KJ];
                for (int j = 0; j < KJ; ++j) {
                    k[j] = L::load(kp[j0 + j] + L::N * c);
                    if (G > 1) in_register(k[j]);
                }
                for (int g = 0; g < G; ++g) {
                    const V qv = L::load(q + g * hd + L::N * c);
                    for (int j = 0; j < KJ; ++j) s[g * KJ + j] = fma(qv, k[j], s[g * KJ + j]);
                }
            }
            alignas(32) float t[N8 * 8];
            for (int b = 0; b < N8; ++b) {
                V8 h[8];
                for (int i = 0; i < 8; ++i) h[i] = b * 8 + i < NS ? L::fold(s[b * 8 + i]) : vzero();
                vstore(t + 8 * b, reduce8(h));
            }
            for (int g = 0; g < G; ++g)
                for (int j = 0; j < KJ; ++j) sc[g][j0 + j] = t[g * KJ + j];
        }
    }
}

// acc[g] += sum_j p[g][j] v_j over the tile's 16 rows (p = 0 past the valid ones)
template <int G, typename L, typename U>
inline void tile_accumulate(float* acc, int64_t NC, const U* const* vp, const float (*p)[kTile]) {
    using V = typename L::V;
    constexpr int CB = Block<G, L>::CB;
    const int64_t hd = NC * L::N;
    for (int64_t c0 = 0; c0 < NC; c0 += CB) {
        // a compiler barrier: without it GCC hoists the 16 x G broadcasts of p out of this loop into
        // stack slots and reloads them (measured slower than broadcasting again)
        asm volatile("" ::: "memory");
        const int64_t cn = NC - c0 < CB ? NC - c0 : CB;
        V o[G][CB];
        for (int g = 0; g < G; ++g)
            for (int c = 0; c < CB; ++c) o[g][c] = c < cn ? L::load(acc + g * hd + L::N * (c0 + c)) : L::zero();
        for (int j = 0; j < kTile; ++j) {
            V v[CB];
            for (int c = 0; c < CB; ++c) {
                v[c] = c < cn ? L::load(vp[j] + L::N * (c0 + c)) : L::zero();
                if (G > 1) in_register(v[c]);
            }
            for (int g = 0; g < G; ++g) {
                const V pg = L::set1(p[g][j]);
                for (int c = 0; c < CB; ++c) o[g][c] = fma(pg, v[c], o[g][c]);
            }
        }
        for (int g = 0; g < G; ++g)
            for (int c = 0; c < CB; ++c)
                if (c < cn) vstore(acc + g * hd + L::N * (c0 + c), o[g][c]);
    }
}

// One tile (kp, vp: its 16 key and value rows of one KV head, n of them read) for G query heads (q: G x
// hd, fp32, already scaled; NC vectors of L::N a head), head g seeing the first ns[g] <= n rows: online
// softmax into the running max m[g], sum l[g] and unnormalized acc[g]. A head that sees none of the rows
// (ns[g] == 0, only after tiles it did see, so m[g] is finite) gets probabilities of exactly 0: its m, l and
// acc keep their bits. softcap > 0: the scores capped first, softcap * tanh(s / softcap).
template <int G, typename L, typename T>
inline void attend_tile(int64_t NC, const float* q, const T* const* kp, const T* const* vp, int n, const int* ns,
                        float* m, float* l, float* acc, float softcap) {
    using V = typename L::V;
    constexpr int NV = kTile / L::N;  // vectors of a head's 16 scores
    const int64_t hd = NC * L::N;
    alignas(64) float sc[G][kTile];
    tile_scores<G, L>(q, NC, kp, n, sc);
    if (softcap > 0.0f)
        for (int g = 0; g < G; ++g)
            for (int j = 0; j < n; ++j) sc[g][j] = softcap * std::tanh(sc[g][j] / softcap);
    for (int g = 0; g < G; ++g) {  // mask, new max, rescale what was accumulated, probabilities into sc
        for (int j = ns[g]; j < kTile; ++j) sc[g][j] = -std::numeric_limits<float>::infinity();
        V s[NV];
        for (int i = 0; i < NV; ++i) s[i] = L::load(&sc[g][L::N * i]);
        V mx = s[0];
        for (int i = 1; i < NV; ++i) mx = vmax(mx, s[i]);
        const float mt = hmax(mx);
        if (mt > m[g]) {
            const float alpha = exp1(m[g] - mt);
            if (l[g] != 0.0f) {
                const V va = L::set1(alpha);
                for (int64_t c = 0; c < NC; ++c)
                    vstore(acc + g * hd + L::N * c, L::load(acc + g * hd + L::N * c) * va);
            }
            l[g] *= alpha;
            m[g] = mt;
        }
        const V vm = L::set1(m[g]);
        float sum = 0.0f;
        for (int i = 0; i < NV; ++i) {
            s[i] = vexp(s[i] - vm);
            sum += hsum(s[i]);
        }
        l[g] += sum;
        for (int i = 0; i < NV; ++i) vstore(&sc[g][L::N * i], s[i]);
    }
    tile_accumulate<G, L>(acc, NC, vp, sc);
}

// All G query heads of one KV head on one tile, in groups (each group reads the tile once) of at most 4 for
// fp32 keys (Block<4> sums two value vectors per broadcast probability: 1.09-1.11x over groups of 8 for a
// prefill chunk's rows, 1.04x for a 5-row verification run) and 8 for bf16 keys (each key widened once
// for more heads: groups of 4 measured 0.89-0.97x). A head's bits do not depend on its group.
// On AVX-512, bf16 keys of head dims that are multiples of 16 take 16-lane tiles (Lanes16), groups of
// up to 8: on the AMX Xeon, 64 sequences of 232 keys, 30 layers, 1.08-1.16x the 8-lane tiles (9 / 3 heads
// of 64; 32 / 8 of 128), then bound by reading the cache (~15 GB/s of the ~24 a plain sum streams); fp32
// keys stay on 8 lanes there (16 lanes measured 0.95x at head dim 64). A head's bits then depend on the
// lanes, not on the batch.
template <typename T, int NCT>
inline void attend_tile_heads(int64_t NC, int64_t G, const float* q, const T* const* kp, const T* const* vp, int n,
                              const int* ns, float* m, float* l, float* acc, float softcap) {
    const int64_t hd = NC * 8;
#ifdef TM_AVX512
    if (std::is_same<T, bf16>::value && NC % 2 == 0) {  // 16-lane tiles, groups of up to 8 heads
        for (int64_t g0 = 0; g0 < G; g0 += 8) {
            const float* qg = q + g0 * hd;
            float* ag = acc + g0 * hd;
#define TM_CASE(N) \
    case N: attend_tile<N, Lanes16>(NC / 2, qg, kp, vp, n, ns + g0, m + g0, l + g0, ag, softcap); break;
            switch (G - g0 < 8 ? G - g0 : 8) {
                TM_CASE(1) TM_CASE(2) TM_CASE(3) TM_CASE(4) TM_CASE(5) TM_CASE(6) TM_CASE(7) TM_CASE(8)
            }
#undef TM_CASE
        }
        return;
    }
#endif
    constexpr int64_t kGroup = std::is_same<T, float>::value ? 4 : 8;
    for (int64_t g0 = 0; g0 < G; g0 += kGroup) {
        const float* qg = q + g0 * hd;
        float* ag = acc + g0 * hd;
        const int64_t gn = G - g0 < kGroup ? G - g0 : kGroup;
#define TM_CASE(N) \
    case N: attend_tile<N, Lanes8>(NC, qg, kp, vp, n, ns + g0, m + g0, l + g0, ag, softcap); break;
        if constexpr (kGroup > 4) {  // groups of 5-8 heads only where they can occur (bf16 keys)
            if (gn > 4) {
                switch (gn) { TM_CASE(5) TM_CASE(6) TM_CASE(7) TM_CASE(8) }
                continue;
            }
        }
        switch (gn) { TM_CASE(1) TM_CASE(2) TM_CASE(3) TM_CASE(4) }
#undef TM_CASE
    }
}

// The key and value rows of the tile at `pos` (n of them, n >= 1) from element `at` of each slot (head h0's
// first); past the end, the last valid row again.
template <typename T>
inline void tile_slots(const AttnArgs& a, const int64_t* table, const T* kc, const T* vc, int64_t at, int64_t pos,
                       int n, const T** kr, const T** vr) {
    int64_t bi = pos / a.bs, off = pos % a.bs;
    if (off + n <= a.bs) {  // within one block (always, when bs is a multiple of 16)
        const int64_t base = (table[bi] * a.bs + off) * a.kv_slot_stride + at;
        for (int j = 0; j < kTile; ++j) {
            const int64_t r = base + (j < n ? j : n - 1) * a.kv_slot_stride;
            kr[j] = kc + r;
            vr[j] = vc + r;
        }
        return;
    }
    for (int j = 0; j < kTile; ++j) {
        if (j < n) {
            const int64_t r = (table[bi] * a.bs + off) * a.kv_slot_stride + at;
            kr[j] = kc + r;
            vr[j] = vc + r;
            if (++off == a.bs) off = 0, ++bi;
        } else {
            kr[j] = kr[n - 1];
            vr[j] = vr[n - 1];
        }
    }
}

// KV heads [h0, h1) over positions [p0, p1) of one sequence's blocks, for R query rows that read them
// (R > 1: rows of one sequence at successive positions, as speculative verification has them): row r sees
// [p0, ends[r]), p0 < ends[r] <= p1. Their query heads (q: (h1 - h0) * R * G rows of hd, fp32, scaled;
// KV head h's are rows [(h - h0) R G, (h - h0 + 1) R G), row r's G of them together) against each tile of
// 16 positions in turn, all the heads of a tile before the next tile, so the cache is read once, in slot
// order. Leaves m, l, acc per query head (rows of hd). A head's bits do not depend on R or on the other
// rows: its tiles, its mask and its order of operations are those it has alone.
template <typename T, int NCT>
void attend_range(const AttnArgs& a, int64_t nc_rt, const float* q, int64_t G, const T* kc, const T* vc,
                  const int64_t* table, int64_t h0, int64_t h1, int64_t p0, int64_t p1, const int64_t* ends,
                  int64_t R, float* m, float* l, float* acc) {
    const int64_t NC = NCT ? NCT : nc_rt;  // vectors of 8 per head
    const int64_t hd = NC * 8;
    thread_local std::vector<int> ns;  // per query head of one KV head: rows of the current tile it sees
    ns.resize(size_t(R * G));
    G *= R;  // query heads per KV head, from here on
    for (int64_t g = 0; g < (h1 - h0) * G; ++g) {
        m[g] = -std::numeric_limits<float>::infinity();
        l[g] = 0.0f;
        for (int64_t c = 0; c < NC; ++c) vstore(acc + g * hd + 8 * c, vzero());
    }
    const int64_t span_bytes = (h1 - h0) * hd * int64_t(sizeof(T));  // of each slot, for these heads
    auto tile_rows = [&](int64_t pos, int n, const T** kr, const T** vr) {
        tile_slots(a, table, kc, vc, h0 * hd, pos, n, kr, vr);
    };
    const T* rk[kTile];
    const T* rv[kTile];
    const T* nrk[kTile];
    const T* nrv[kTile];
    const T* kp[kTile];
    const T* vp[kTile];
    tile_rows(p0, int(p1 - p0 < kTile ? p1 - p0 : kTile), nrk, nrv);
    int pf_n = 0;
    for (int64_t pos = p0; pos < p1; pos += kTile) {
        const int n = int(p1 - pos < kTile ? p1 - pos : kTile);
        std::memcpy(rk, nrk, sizeof(rk));
        std::memcpy(rv, nrv, sizeof(rv));
        // the next tile's rows, prefetched (the blocks are scattered, and the hardware prefetchers stop
        // at page boundaries)
        if (pos + kTile < p1) {
            const int nn = int(p1 - pos - kTile < kTile ? p1 - pos - kTile : kTile);
            tile_rows(pos + kTile, nn, nrk, nrv);
            pf_n = nn;
        } else {
            pf_n = 0;
        }
        for (int64_t r = 0; r < R; ++r) {
            const int64_t e = ends[r] - pos, nr = e < 0 ? 0 : e < kTile ? e : kTile;
            for (int64_t g = 0; g < G / R; ++g) ns[size_t(r * (G / R) + g)] = int(nr);
        }
        for (int64_t h = 0; h < h1 - h0; ++h) {
            // the next tile's lines of this head, requested into L2 while this one is worked on
            for (int j = 0; j < pf_n; ++j)
                for (int64_t b = h * hd * int64_t(sizeof(T)); b < (h + 1) * hd * int64_t(sizeof(T)); b += 64) {
                    __builtin_prefetch(reinterpret_cast<const char*>(nrk[j]) + b, 0, 2);
                    __builtin_prefetch(reinterpret_cast<const char*>(nrv[j]) + b, 0, 2);
                }
            for (int j = 0; j < kTile; ++j) kp[j] = rk[j] + h * hd, vp[j] = rv[j] + h * hd;
            const int64_t q0 = h * G;
            attend_tile_heads<T, NCT>(NC, G, q + q0 * hd, kp, vp, n, ns.data(), m + q0, l + q0, acc + q0 * hd,
                                      a.softcap);
        }
    }
}

#if defined(TM_AVX512) && defined(__AVX512BF16__) && !defined(TM_NO_DPBF16)
#define TM_PROMPT_LANES 1
// Prompt rows at bf16 on AVX-512 with AVX512_BF16 (the caller's rows from `lanes_from`): attend_range's inputs
// and outputs, with the query heads in the vector lanes instead of the head dim. A prompt's run has R (up to 16)
// rows of G query heads on each KV head: scores for 16 heads at once against each key, no horizontal sums
// (attend_tile's fold and reduce of every score cost about what its multiply-adds do at head dim 64), the
// softmax lane-wise over the tile's 16 score vectors. The products are vdpbf16ps's on bf16 pairs, summed in
// fp32: q.k on q's pairs (q as given, `qb16`: the item's first row's first head of KV head h0, rows q_stride
// apart; transposed once per item, lane i = query head 16 b + i in attend_range's order) against each key's
// pair broadcast from the cache as it lies, then scaled; p.v on each probability split into two bf16 (hi, and
// lo = p - hi rounded: ~16 significant bits, where one bf16 (as bf16 flash attention rounds it) flipped the
// default model's near-tie first token of "What is the capital of France?") against the tile's values
// interleaved by key pairs. On the default model's shapes 1.4-1.5x attend_range for a prompt's rows (1.6-1.8x
// with one bf16 per probability); a run of one row (3 of 16 lanes busy) is slower, which is why the backend
// keeps rows under a sliding window (never in runs) off it.
// A head's bits depend on its own q and keys only (not on R, its lane or the other rows), so a prompt row
// gets the same bits alone or in any batch or chunk; not those a decode row gets on attend_range (prompt
// rows of positions a preempted request decoded then differ in their last bits: bf16 is held to closeness,
// fp32 keeps one path for every row).
template <int NCT>
void attend_range_lanes(const AttnArgs& a, int64_t nc_rt, const bf16* qb16, int64_t q_stride, int64_t G,
                        const bf16* kc, const bf16* vc, const int64_t* table, int64_t h0, int64_t h1, int64_t p0,
                        int64_t p1, const int64_t* ends, int64_t R, float* m, float* l, float* acc) {
    const int64_t NC = NCT ? NCT : nc_rt;  // vectors of 8 per head
    const int64_t hd = NC * 8, N16 = hd / 16, H = R * G, HB = (H + 15) / 16, nk = h1 - h0;
    // qp (nk, HB, hd / 2, 16) bf16 pairs: lane i's d and d + 1; mv, lv (nk, HB, 16); the tile's values as
    // (8 key pairs, hd) bf16 pairs; the probabilities as (8 key pairs, 16 lanes) bf16 pairs; each lane's
    // rescale factor; each lane's keys seen in the current tile
    thread_local std::vector<uint32_t> qbuf, vbuf, pbuf;
    thread_local std::vector<float> fbuf;
    thread_local std::vector<int32_t> seen_buf;
    qbuf.resize(size_t(nk * HB * (hd / 2) * 16));
    vbuf.resize(size_t((kTile / 2) * hd));
    pbuf.resize(size_t(2 * (kTile / 2) * 16));
    fbuf.resize(size_t(2 * nk * HB * 16 + 16));
    seen_buf.resize(size_t(HB * 16));
    uint32_t* qp = qbuf.data();
    uint32_t* vp2 = vbuf.data();
    uint32_t* pp = pbuf.data();
    float* mv = fbuf.data();
    float* lv = mv + nk * HB * 16;
    float* al = lv + nk * HB * 16;
    int32_t* seen = seen_buf.data();
    const float ninf = -std::numeric_limits<float>::infinity();
    for (int64_t hh = 0; hh < nk; ++hh)
        for (int64_t i = 0; i < HB * 16; ++i) {
            const bf16* row = qb16 + (i / G) * q_stride + (hh * G + i % G) * hd;  // row i / G, head i % G of hh
            for (int64_t d = 0; d < hd; d += 2)
                qp[((hh * HB + i / 16) * (hd / 2) + d / 2) * 16 + i % 16] =
                    i < H ? uint32_t(row[d]) | uint32_t(row[d + 1]) << 16 : 0u;
        }
    for (int64_t i = 0; i < nk * HB * 16; ++i) mv[i] = ninf, lv[i] = 0.0f;
    for (int64_t i = 0; i < nk * H * hd; ++i) acc[i] = 0.0f;
    const __m512 scale = _mm512_set1_ps(a.scale);
    // 16-bit lane 2i of the result: lane i of the first half; 2i + 1: lane i of the second
    alignas(64) int16_t idx[32];
    for (int i = 0; i < 16; ++i) idx[2 * i] = int16_t(i), idx[2 * i + 1] = int16_t(16 + i);
    const __m512i pair_index = _mm512_load_si512(idx);
    const bf16* kr[kTile];
    const bf16* vr[kTile];
    for (int64_t pos = p0; pos < p1; pos += kTile) {
        const int n = int(p1 - pos < kTile ? p1 - pos : kTile);
        tile_slots(a, table, kc, vc, h0 * hd, pos, n, kr, vr);
        for (int64_t i = 0; i < HB * 16; ++i) {  // row r's heads see its keys; pad lanes all (their q is 0)
            const int64_t e = i < H ? ends[i / G] - pos : kTile;
            seen[i] = int32_t(e < 0 ? 0 : e < kTile ? e : kTile);
        }
        for (int64_t hh = 0; hh < nk; ++hh) {
            // values as (8 key pairs, hd) pairs of bf16: lane d of pair t is (v_2t[d], v_2t+1[d])
            for (int t = 0; t < kTile / 2; ++t)
                for (int64_t c = 0; c < N16; ++c) {
                    const auto* v0 = reinterpret_cast<const __m256i*>(vr[2 * t] + hh * hd + 16 * c);
                    const auto* v1 = reinterpret_cast<const __m256i*>(vr[2 * t + 1] + hh * hd + 16 * c);
                    const __m512i two = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(v0)),
                                                           _mm256_loadu_si256(v1), 1);
                    _mm512_storeu_si512(vp2 + t * hd + 16 * c, _mm512_permutexvar_epi16(pair_index, two));
                }
            if (pos + kTile < p1)  // the next tile's first lines of this head, requested while this one is worked on
                for (int j = 0; j < kTile; ++j) {
                    __builtin_prefetch(kr[j] + kTile * a.kv_slot_stride + hh * hd, 0, 2);
                    __builtin_prefetch(vr[j] + kTile * a.kv_slot_stride + hh * hd, 0, 2);
                }
            for (int64_t b = 0; b < HB; ++b) {
                __m512 s[kTile];
                for (int j = 0; j < kTile; ++j) s[j] = _mm512_setzero_ps();
                const uint32_t* qb = qp + (hh * HB + b) * (hd / 2) * 16;
                for (int64_t d = 0; d < hd / 2; ++d) {
                    const __m512bh qv = (__m512bh)_mm512_loadu_si512(qb + d * 16);
                    for (int j = 0; j < kTile; ++j) {
                        const int32_t kpair = *reinterpret_cast<const int32_t*>(kr[j] + hh * hd + 2 * d);
                        s[j] = _mm512_dpbf16_ps(s[j], qv, (__m512bh)_mm512_set1_epi32(kpair));
                    }
                }
                for (int j = 0; j < kTile; ++j) s[j] = _mm512_mul_ps(s[j], scale);
                if (a.softcap > 0.0f)
                    for (int j = 0; j < kTile; ++j) {
                        alignas(64) float t[16];
                        _mm512_store_ps(t, s[j]);
                        for (int i = 0; i < 16; ++i) t[i] = a.softcap * std::tanh(t[i] / a.softcap);
                        s[j] = _mm512_load_ps(t);
                    }
                const __m512i nsv = _mm512_loadu_si512(seen + 16 * b);
                __m512 mt = _mm512_set1_ps(ninf);
                for (int j = 0; j < kTile; ++j) {
                    s[j] = _mm512_mask_blend_ps(_mm512_cmpgt_epi32_mask(nsv, _mm512_set1_epi32(j)),
                                                _mm512_set1_ps(ninf), s[j]);
                    mt = _mm512_max_ps(mt, s[j]);
                }
                float* mb = mv + (hh * HB + b) * 16;
                float* lb = lv + (hh * HB + b) * 16;
                const __m512 mo = _mm512_loadu_ps(mb), mn = _mm512_max_ps(mo, mt);
                // exp(m_old - m_new): 0 on a lane's first keys, 1 where the max holds (and where nothing was seen)
                const __mmask16 none = _mm512_cmp_ps_mask(mn, _mm512_set1_ps(ninf), _CMP_EQ_OQ);
                const __m512 alpha = _mm512_mask_blend_ps(none, vexp(V16{_mm512_sub_ps(mo, mn)}).v,
                                                          _mm512_set1_ps(1.0f));
                const __m512 base = _mm512_mask_blend_ps(none, mn, _mm512_setzero_ps());
                __m512 sum = _mm512_setzero_ps();
                for (int j = 0; j < kTile; ++j) {
                    s[j] = vexp(V16{_mm512_sub_ps(s[j], base)}).v;
                    sum = _mm512_add_ps(sum, s[j]);
                }
                // the probabilities as bf16 pairs of keys: lane i of pair t is (p_2t[i], p_2t+1[i]); each p as the
                // sum of two bf16 (hi, then lo = p - hi rounded), so that p.v loses what fp32 products would
                for (int t = 0; t < kTile / 2; ++t) {
                    const __m512bh hi = _mm512_cvtne2ps_pbh(s[2 * t + 1], s[2 * t]);
                    const __m512i two = _mm512_castps_si512((__m512)hi);
                    _mm512_storeu_si512(pp + t * 16, _mm512_permutexvar_epi16(pair_index, two));
                    const __m512i hw = _mm512_castps_si512((__m512)hi);
                    const __m512 hi0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(hw)), 16));
                    const __m512 hi1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(hw, 1)), 16));
                    const __m512bh lo = _mm512_cvtne2ps_pbh(_mm512_sub_ps(s[2 * t + 1], hi1), _mm512_sub_ps(s[2 * t], hi0));
                    _mm512_storeu_si512(pp + (kTile / 2 + t) * 16,
                                        _mm512_permutexvar_epi16(pair_index, _mm512_castps_si512((__m512)lo)));
                }
                _mm512_storeu_ps(mb, mn);
                _mm512_storeu_ps(lb, _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(lb), alpha), sum));
                _mm512_storeu_ps(al, alpha);
                // acc[head] = acc[head] * alpha + sum_j p[j] v_j: 4 heads x 4 vectors of the head dim at a time
                const int64_t lanes = H - 16 * b < 16 ? H - 16 * b : 16;
                for (int64_t c0 = 0; c0 < N16; c0 += 4) {
                    const int64_t cn = N16 - c0 < 4 ? N16 - c0 : 4;
                    for (int64_t i0 = 0; i0 < lanes; i0 += 4) {
                        const int64_t in = lanes - i0 < 4 ? lanes - i0 : 4;
                        asm volatile("" ::: "memory");
                        __m512 o[4][4];
                        for (int i = 0; i < 4; ++i)
                            for (int c = 0; c < 4; ++c)
                                o[i][c] = i < in && c < cn
                                    ? _mm512_mul_ps(_mm512_loadu_ps(acc + (hh * H + 16 * b + i0 + i) * hd + 16 * (c0 + c)),
                                                    _mm512_set1_ps(al[i0 + i]))
                                    : _mm512_setzero_ps();
                        for (int t = 0; t < kTile / 2; ++t) {
                            __m512bh v[4];
                            for (int c = 0; c < 4; ++c)
                                v[c] = (__m512bh)(c < cn ? _mm512_loadu_si512(vp2 + t * hd + 16 * (c0 + c))
                                                         : _mm512_setzero_si512());
                            for (int i = 0; i < 4; ++i) {
                                const __m512bh pb = (__m512bh)_mm512_set1_epi32(int32_t(pp[t * 16 + i0 + i]));
                                const __m512bh pl = (__m512bh)_mm512_set1_epi32(int32_t(pp[(kTile / 2 + t) * 16 + i0 + i]));
                                for (int c = 0; c < 4; ++c) o[i][c] = _mm512_dpbf16_ps(o[i][c], pb, v[c]);
                                for (int c = 0; c < 4; ++c) o[i][c] = _mm512_dpbf16_ps(o[i][c], pl, v[c]);
                            }
                        }
                        for (int i = 0; i < in; ++i)
                            for (int c = 0; c < cn; ++c)
                                _mm512_storeu_ps(acc + (hh * H + 16 * b + i0 + i) * hd + 16 * (c0 + c), o[i][c]);
                    }
                }
            }
        }
    }
    for (int64_t hh = 0; hh < nk; ++hh)
        for (int64_t i = 0; i < H; ++i) {
            m[hh * H + i] = mv[(hh * HB + i / 16) * 16 + i % 16];
            l[hh * H + i] = lv[(hh * HB + i / 16) * 16 + i % 16];
        }
}
#endif

template <typename T, int NCT>
void paged_decode(T* out, int64_t out_stride, const T* q, int64_t q_stride, const T* kc, const T* vc,
                  const int64_t* tables, int64_t table_stride, const int64_t* lens, const int64_t* starts,
                  int64_t num_seqs, const AttnArgs& a, int64_t part, int nthreads, int64_t lanes_from) {
    const int64_t G = a.nh / a.nkv, hd = a.hd, nc = hd / 8;
    // rows from lanes_from on (prompt rows) take attend_range_lanes where it is built (AVX512_BF16): bf16, hd % 16 == 0
    bool lanes_here = false;
#ifdef TM_PROMPT_LANES
    lanes_here = std::is_same<T, bf16>::value && hd % 16 == 0;
#endif
    if (!lanes_here) lanes_from = num_seqs;
    // the keys of sequence b: positions [S(b), lens[b]), S(b) = starts[b] (a sliding window's first) or 0
    auto key_start = [&](int64_t b) -> int64_t {
        const int64_t s = starts ? starts[b] : 0;
        return s > 0 ? s : 0;
    };
    // partitions: each sequence's keys cut every `part` from S(b) (the result depends on this cut only)
    std::vector<int64_t> first(num_seqs + 1);  // first partition index of each sequence
    int64_t total_keys = 0;
    first[0] = 0;
    for (int64_t b = 0; b < num_seqs; ++b) {
        const int64_t S = key_start(b);
        const int64_t L = lens[b] > S ? lens[b] - S : 0;
        first[b + 1] = first[b] + (L + part - 1) / part;
        total_keys += L;
    }
    // runs: consecutive sequences that read the same keys, attended together so that each tile is read
    // once for all of them (speculative verification: one request's rows at successive positions). b
    // joins the run of b - 1 when both start at the same key, b's context is no shorter and b's block
    // table agrees with b - 1's over every block b - 1 reads; the run's last sequence then holds the
    // blocks every row of the run reads. At most kMaxRun rows.
    std::vector<int64_t> run_first{0};  // first sequence of each run, then num_seqs
    for (int64_t b = 1; b < num_seqs; ++b) {
        const int64_t S = key_start(b), c = b - 1;
        bool join = b - run_first.back() < kMaxRun && S == key_start(c) && lens[c] > S && lens[b] >= lens[c] &&
                    (b >= lanes_from) == (c >= lanes_from);
        if (join) {
            const int64_t blocks = (lens[c] + a.bs - 1) / a.bs;
            join = std::equal(tables + c * table_stride, tables + c * table_stride + blocks, tables + b * table_stride);
        }
        if (!join) run_first.push_back(b);
    }
    const int64_t nruns = int64_t(run_first.size());
    run_first.push_back(num_seqs);
    int64_t max_run = 1;  // the longest run: the thread buffers hold its query heads
    for (int64_t u = 0; u < nruns; ++u) max_run = std::max(max_run, run_first[u + 1] - run_first[u]);
    // a run's partitions are its last sequence's; part_first[u]: index of run u's first among all runs'
    std::vector<int64_t> part_first(nruns + 1, 0);
    for (int64_t u = 0; u < nruns; ++u) {
        const int64_t last = run_first[u + 1] - 1;
        part_first[u + 1] = part_first[u] + first[last + 1] - first[last];
    }
    const int64_t run_parts = part_first[nruns];
    std::vector<int64_t> run_of(run_parts);
    for (int64_t u = 0; u < nruns; ++u)
        for (int64_t p = part_first[u]; p < part_first[u + 1]; ++p) run_of[p] = u;
    // partial results of sequences with more than one partition: m, l, acc per (partition, q head), the
    // partitions of such sequences only (sfirst: index of b's first among them)
    std::vector<int64_t> sfirst(num_seqs + 1);
    sfirst[0] = 0;
    for (int64_t b = 0; b < num_seqs; ++b) {
        const int64_t np = first[b + 1] - first[b];
        sfirst[b + 1] = sfirst[b] + (np > 1 ? np : 0);
    }
    const int64_t sparts = sfirst[num_seqs];
    thread_local std::vector<float> scratch;
    const size_t need = size_t(sparts) * a.nh * (hd + 2);
    if (scratch.size() < need) scratch.resize(need);
    float* pm = scratch.data();
    float* pl = pm + sparts * a.nh;
    float* pacc = pl + sparts * a.nh;
    const int nt = threads_for(total_keys * a.nh * hd, nthreads);
    // work items: (a run's partition, group of KV heads). A head's result does not depend on its group,
    // so the groups are free to follow the thread count: one group (reading each slot whole) when there
    // are enough partitions to go round, more when there are few
    int64_t groups = 1;
    if (nt > 1 && run_parts < 4 * nt) groups = std::min<int64_t>(a.nkv, (4 * nt + run_parts - 1) / run_parts);
    const int64_t heads_per_group = (a.nkv + groups - 1) / groups;
    groups = (a.nkv + heads_per_group - 1) / heads_per_group;
    const int64_t items = run_parts * groups;

    // one item: attend, then normalize into out or leave the partial result
    auto work = [&](int64_t it, float* qs, float* acc, float* m, float* l) {
        const int64_t rp = it / groups, h0 = (it % groups) * heads_per_group, u = run_of[rp];
        const int64_t h1 = std::min(a.nkv, h0 + heads_per_group), pi = rp - part_first[u];
        const int64_t last = run_first[u + 1] - 1, p0 = key_start(last) + pi * part;
        int64_t b0 = run_first[u];  // the rows with keys in this partition: [b0, last]
        while (lens[b0] <= p0) ++b0;
        const int64_t R = last + 1 - b0, nq = (h1 - h0) * R * G;
        int64_t ends[kMaxRun];
        for (int64_t r = 0; r < R; ++r) ends[r] = std::min(p0 + part, lens[b0 + r]);
#ifdef TM_PROMPT_LANES
        if constexpr (std::is_same<T, bf16>::value) {
            if (b0 >= lanes_from)  // q read as given (transposed there)
                attend_range_lanes<NCT>(a, nc, q + b0 * q_stride + h0 * G * hd, q_stride, G, kc, vc,
                                        tables + last * table_stride, h0, h1, p0, ends[R - 1], ends, R, m, l, acc);
        }
#endif
        if (b0 < lanes_from) {
            // q rows in attend_range's order, scaled to fp32: KV head, then row, then the head's G query heads
            for (int64_t h = h0; h < h1; ++h)
                for (int64_t r = 0; r < R; ++r) {
                    const T* qrow = q + (b0 + r) * q_stride + h * G * hd;
                    float* qd = qs + (((h - h0) * R + r) * G) * hd;
                    for (int64_t i = 0; i < G * hd; i += 8) vstore(qd + i, vload(qrow + i) * vset1(a.scale));
                }
            attend_range<T, NCT>(a, nc, qs, G, kc, vc, tables + last * table_stride, h0, h1, p0, ends[R - 1], ends,
                                 R, m, l, acc);
        }
        for (int64_t i = 0; i < nq; ++i) {
            const int64_t h = h0 + i / (R * G), b = b0 + (i / G) % R, qh = h * G + i % G;
            if (first[b + 1] - first[b] == 1) {  // the whole context: normalize into out
                T* o = out + b * out_stride + qh * hd;
                const V8 inv = vset1(1.0f / (a.sinks ? l[i] + exp1(a.sinks[qh] - m[i]) : l[i]));
                for (int64_t c = 0; c < nc; ++c) vstore(o + 8 * c, vload(acc + i * hd + 8 * c) * inv);
            } else {
                const int64_t p = sfirst[b] + pi;
                pm[p * a.nh + qh] = m[i];
                pl[p * a.nh + qh] = l[i];
                std::memcpy(pacc + (p * a.nh + qh) * hd, acc + i * hd, sizeof(float) * hd);
            }
        }
    };
    // a sequence of several partitions: merge them, in partition order
    auto merge = [&](int64_t b, float* tmp) {
        const int64_t p_begin = sfirst[b], np = first[b + 1] - first[b];
        if (np <= 1) {
            if (np == 0)  // empty context: zeros
                for (int64_t i = 0; i < a.nh * hd; ++i) store1(out + b * out_stride + i, 0.0f);
            return;
        }
        for (int64_t qh = 0; qh < a.nh; ++qh) {
            float M = -std::numeric_limits<float>::infinity();
            for (int64_t p = p_begin; p < p_begin + np; ++p) M = pm[p * a.nh + qh] > M ? pm[p * a.nh + qh] : M;
            float Lsum = 0.0f;
            for (int64_t p = p_begin; p < p_begin + np; ++p) Lsum += exp1(pm[p * a.nh + qh] - M) * pl[p * a.nh + qh];
            if (a.sinks) Lsum += exp1(a.sinks[qh] - M);  // the sink's share of the softmax
            for (int64_t c = 0; c < nc; ++c) {
                V8 o = vzero();
                for (int64_t p = p_begin; p < p_begin + np; ++p)
                    o = fma(vset1(exp1(pm[p * a.nh + qh] - M)), vload(pacc + (p * a.nh + qh) * hd + 8 * c), o);
                vstore(tmp + 8 * c, o);
            }
            const V8 inv = vset1(1.0f / Lsum);
            T* o = out + b * out_stride + qh * hd;
            for (int64_t c = 0; c < nc; ++c) vstore(o + 8 * c, vload(tmp + 8 * c) * inv);
        }
    };
    // per thread: q scaled, acc, m, l for one item's query heads (at most all nh of the longest run's rows)
    auto thread_buffers = [&]() {
        thread_local std::vector<float> buf;
        const int64_t heads = max_run * a.nh;
        const size_t floats = size_t(heads) * (2 * hd + 2);
        if (buf.size() < floats) buf.resize(floats);
        float* qs = buf.data();
        return std::make_tuple(qs, qs + heads * hd, qs + 2 * heads * hd, qs + 2 * heads * hd + heads);
    };
    if (nt > 1) {
#pragma omp parallel num_threads(nt)
        {
            auto [qs, acc, m, l] = thread_buffers();
#pragma omp for schedule(dynamic, 1)
            for (int64_t it = 0; it < items; ++it) work(it, qs, acc, m, l);
#pragma omp for schedule(dynamic, 1)
            for (int64_t b = 0; b < num_seqs; ++b) merge(b, acc);
        }
    } else {
        auto [qs, acc, m, l] = thread_buffers();
        for (int64_t it = 0; it < items; ++it) work(it, qs, acc, m, l);
        for (int64_t b = 0; b < num_seqs; ++b) merge(b, acc);
    }
}

template <typename T>
int paged_decode_dispatch(void* out, int64_t out_stride, const void* q, int64_t q_stride, const void* kc,
                          const void* vc, const int64_t* tables, int64_t table_stride, const int64_t* lens,
                          const int64_t* starts, int64_t num_seqs, const AttnArgs& a, int64_t part, int nthreads,
                          int64_t lanes_from) {
    auto run = [&](auto nct) {
        paged_decode<T, decltype(nct)::value>(static_cast<T*>(out), out_stride, static_cast<const T*>(q), q_stride,
                                              static_cast<const T*>(kc), static_cast<const T*>(vc), tables,
                                              table_stride, lens, starts, num_seqs, a, part, nthreads, lanes_from);
    };
    switch (a.hd) {
        case 64: run(std::integral_constant<int, 8>{}); break;
        case 128: run(std::integral_constant<int, 16>{}); break;
        default: run(std::integral_constant<int, 0>{}); break;
    }
    return 0;
}

// One channel's step of a depthwise causal conv of K taps: returns w . [window, x] (w (K,), the taps in order, the
// sum from the oldest input up); the window (K - 1,) read from `src` (nullptr: zeros, the sequence starts here) and
// written shifted to `dst` (when they are one slot, dst[j] = src[j + 1] in ascending j reads each element before it
// is overwritten).
inline float conv_window_step(const float* src, float* dst, const float* w, float x, int64_t K) {
    const int64_t K1 = K - 1;
    float acc = 0.0f;
    for (int64_t j = 0; j < K1; ++j) acc += w[j] * (src ? src[j] : 0.0f);
    acc += w[K1] * x;
    for (int64_t j = 0; j + 1 < K1; ++j) dst[j] = src ? src[j + 1] : 0.0f;
    if (K1 > 0) dst[K1 - 1] = x;
    return acc;
}

// One sequence's step of a depthwise causal conv of K taps over C channels, then SiLU: the window (C, K - 1) read
// from `src` and written shifted to `dst` (conv_window_step's, per channel); m (C,) = silu(w . [window, x] + b)
// (bias b may be nullptr). Shared by the Gated DeltaNet and Mamba2 decode kernels.
template <typename T>
inline void conv_silu_step(float* m, const T* x, const float* src, float* dst, const float* conv_w,
                           const float* conv_b, int64_t C, int64_t K) {
    const int64_t K1 = K - 1;
    for (int64_t c = 0; c < C; ++c) {
        float acc = conv_window_step(src ? src + c * K1 : nullptr, dst + c * K1, conv_w + c * K, to_f32(x[c]), K);
        if (conv_b) acc += conv_b[c];
        m[c] = acc / (1.0f + std::exp(-acc));
    }
}

// ---- Gated DeltaNet decode (Qwen3.5's linear attention, one token per sequence) ------------------------
// Everything between a layer's input projections and its output projection, for N sequences each at its
// next token, over the state pools (float32): conv_pool (S, C, K - 1) the causal conv's last inputs, ssm_pool
// (S, Hv, dk, dv) the delta rule's matrices; sequence n's state is read from slot src_slots[n] (-1: it starts
// here, its state is zero) and written to slot dst_slots[n]: in place when they are equal, and otherwise the
// src slot is left as it was. No two sequences write one slot, and none reads a slot another one writes (the
// sequences run in parallel); two may read one src slot. Per sequence: the conv window [state, x] ->
// silu(w . window) (C channels: q | k | v), the state shifted; q and k l2-normalized per key head (eps inside
// the root), q scaled by dk^-1/2; then per value head j (key head j % Hk when tiled, else j / (Hv / Hk)):
//     beta = sigmoid(b_j), a = exp(neg_a_j * softplus(a_j + dt_bias_j)),
//     S = a S + k (beta (v - a S^T k))^T,  o = S^T q  (one read of the old S gives S^T k and S^T q),
//     out_j = rmsnorm(o) * norm_w * silu(z_j).
// Each (sequence, value head) is computed on its own: the same bits alone or in any batch.
template <typename T>
void gdn_decode(T* out, int64_t out_stride, const T* qkv, int64_t qkv_stride, const T* z, int64_t z_stride,
                const T* ba, int64_t ba_stride, const float* conv_w, float* conv_pool, float* ssm_pool,
                const int64_t* src_slots, const int64_t* dst_slots, const float* neg_a, const float* dt_bias,
                const float* norm_w, int64_t N, int64_t Hk, int64_t Hv, int64_t dk, int64_t dv, int64_t K, bool tiled,
                float eps, int nthreads) {
    const int64_t C = 2 * Hk * dk + Hv * dv, R = Hv / Hk, K1 = K - 1;
    std::vector<float> mixed(static_cast<size_t>(N * C));
    // the conv and the l2 norms: cheap (C * K a sequence), so one thread unless the batch is big
#pragma omp parallel for num_threads(nthreads) if (N * C * K >= (int64_t(1) << 18)) schedule(static)
    for (int64_t n = 0; n < N; ++n) {
        float* m = mixed.data() + n * C;
        conv_silu_step(m, qkv + n * qkv_stride, src_slots[n] < 0 ? nullptr : conv_pool + src_slots[n] * C * K1,
                       conv_pool + dst_slots[n] * C * K1, conv_w, static_cast<const float*>(nullptr), C, K);
        for (int64_t h = 0; h < 2 * Hk; ++h) {  // q heads, then k heads
            float* v = m + h * dk;
            float ss = 0.0f;
            for (int64_t i = 0; i < dk; ++i) ss += v[i] * v[i];
            const float inv = 1.0f / std::sqrt(ss + 1e-6f) * (h < Hk ? 1.0f / std::sqrt(float(dk)) : 1.0f);
            for (int64_t i = 0; i < dk; ++i) v[i] *= inv;
        }
    }
#pragma omp parallel num_threads(nthreads) if (N * Hv * dk * dv >= (int64_t(1) << 15))
    {
        std::vector<float> rk(static_cast<size_t>(dv)), rq(static_cast<size_t>(dv)), delta(static_cast<size_t>(dv));
#pragma omp for schedule(static)
        for (int64_t task = 0; task < N * Hv; ++task) {
            const int64_t n = task / Hv, j = task % Hv, kh = tiled ? j % Hk : j / R;
            const float* m = mixed.data() + n * C;
            const float* q = m + kh * dk;
            const float* k = m + Hk * dk + kh * dk;
            const float* v = m + 2 * Hk * dk + j * dv;
            // (dk, dv) matrices: Sd written, Sr read (Sd itself when in place, or when fresh: zeroed first)
            float* Sd = ssm_pool + (dst_slots[n] * Hv + j) * dk * dv;
            const float* Sr = Sd;
            if (src_slots[n] < 0)
                std::fill(Sd, Sd + dk * dv, 0.0f);
            else
                Sr = ssm_pool + (src_slots[n] * Hv + j) * dk * dv;
            const float b = to_f32(ba[n * ba_stride + j]), a_in = to_f32(ba[n * ba_stride + Hv + j]) + dt_bias[j];
            const float beta = 1.0f / (1.0f + std::exp(-b));
            const float decay = std::exp(neg_a[j] * (a_in > 20.0f ? a_in : std::log1p(std::exp(a_in))));
            std::fill(rk.begin(), rk.end(), 0.0f);
            std::fill(rq.begin(), rq.end(), 0.0f);
            float qk = 0.0f;
            for (int64_t i = 0; i < dk; ++i) {
                const float* row = Sr + i * dv;
                const float ki = k[i], qi = q[i];
                qk += qi * ki;
                for (int64_t t = 0; t < dv; ++t) {
                    rk[t] += row[t] * ki;
                    rq[t] += row[t] * qi;
                }
            }
            float ss = 0.0f;
            for (int64_t t = 0; t < dv; ++t) {
                delta[t] = beta * (v[t] - decay * rk[t]);
                rq[t] = decay * rq[t] + qk * delta[t];  // o
                ss += rq[t] * rq[t];
            }
            for (int64_t i = 0; i < dk; ++i) {
                const float* row = Sr + i * dv;
                float* drow = Sd + i * dv;  // row itself when in place: each element read, then written
                const float ki = k[i];
                for (int64_t t = 0; t < dv; ++t) drow[t] = decay * row[t] + ki * delta[t];
            }
            const float inv = 1.0f / std::sqrt(ss / float(dv) + eps);
            const T* zj = z + n * z_stride + j * dv;
            T* oj = out + n * out_stride + j * dv;
            for (int64_t t = 0; t < dv; ++t) {
                const float zt = to_f32(zj[t]);
                store1(oj + t, rq[t] * inv * norm_w[t] * (zt / (1.0f + std::exp(-zt))));
            }
        }
    }
}


// ---- Mamba2 decode (Granite 4.0-H's recurrent layers, one token per sequence) -------------------------------
// Everything between a Mamba2 layer's in_proj and its out_proj, for N sequences each at its next token, over the
// state pools (float32): conv_pool (S, C, K - 1) the causal conv's last inputs (C = H P + 2 G Ns: x | B | C),
// ssm_pool (S, H, P, Ns) the scan's states; src / dst slots as gdn_decode's (-1: fresh, a zero state; in place
// when equal, otherwise the src slot is left as it was). Per sequence: the conv window [state, xBC] ->
// silu(w . window + bias), the state shifted; then per head h (group g = h / (H / G)):
//     dt = softplus(dt_h + dt_bias_h) (x itself above 20, as torch's softplus), dA = exp(dt neg_a_h),
//     S = dA S + (dt x_h) B_g^T,  y_h = S C_g + D_h x_h        (S (P, Ns), the updated one read for y)
// then the gated norm per group of I / G channels (transformers' GraniteMoeHybridRMSNormGated, mamba2.py's
// gated_rms_norm): u = y silu(z), out = norm_w * (u rsqrt(mean(u^2) + eps) rounded to T), rounded to T.
// The conv's output and y stay float32 (the torch path rounds them to T at bf16). Each (sequence, head) is
// computed on its own, its sums in a fixed order: the same bits alone or in any batch.
template <typename T>
void mamba2_decode(T* out, int64_t out_stride, const T* xbc, int64_t xbc_stride, const T* z, int64_t z_stride,
                   const T* dt_in, int64_t dt_stride, const float* conv_w, const float* conv_b, float* conv_pool,
                   float* ssm_pool, const int64_t* src_slots, const int64_t* dst_slots, const float* neg_a,
                   const float* dt_bias, const float* Dskip, const float* norm_w, int64_t N, int64_t H, int64_t G,
                   int64_t P, int64_t Ns, int64_t K, float eps, int nthreads) {
    const int64_t I = H * P, C = I + 2 * G * Ns, R = H / G, K1 = K - 1, gw = I / G;
    std::vector<float> mixed(static_cast<size_t>(N * C)), y(static_cast<size_t>(N * I));
    // the conv: cheap (C * K a sequence), so one thread unless the batch is big
#pragma omp parallel for num_threads(nthreads) if (N * C * K >= (int64_t(1) << 18)) schedule(static)
    for (int64_t n = 0; n < N; ++n) {
        float* m = mixed.data() + n * C;
        conv_silu_step(m, xbc + n * xbc_stride, src_slots[n] < 0 ? nullptr : conv_pool + src_slots[n] * C * K1,
                       conv_pool + dst_slots[n] * C * K1, conv_w, conv_b, C, K);
    }
    // the scan, one task per (sequence, head): (P, Ns) state read and written once
    const int64_t Nv = Ns - Ns % 8;
#pragma omp parallel for num_threads(nthreads) if (N * H * P * Ns >= (int64_t(1) << 15)) schedule(static)
    for (int64_t task = 0; task < N * H; ++task) {
        const int64_t n = task / H, h = task % H, g = h / R;
        const float* m = mixed.data() + n * C;
        const float* x = m + h * P;
        const float* Bg = m + I + g * Ns;
        const float* Cg = m + I + G * Ns + g * Ns;
        float* Sd = ssm_pool + (dst_slots[n] * H + h) * P * Ns;
        const float* Sr = Sd;
        if (src_slots[n] < 0)
            std::fill(Sd, Sd + P * Ns, 0.0f);
        else
            Sr = ssm_pool + (src_slots[n] * H + h) * P * Ns;
        const float a_in = to_f32(dt_in[n * dt_stride + h]) + dt_bias[h];
        const float dt = a_in > 20.0f ? a_in : std::log1p(std::exp(a_in));
        const float dA = std::exp(dt * neg_a[h]);
        const V8 dAv = vset1(dA);
        float* yh = y.data() + n * I + h * P;
        for (int64_t p = 0; p < P; ++p) {
            const float* row = Sr + p * Ns;
            float* drow = Sd + p * Ns;  // row itself when in place: each element read, then written
            const float dx = dt * x[p];
            const V8 dxv = vset1(dx);
            V8 acc = vzero();
            for (int64_t i = 0; i < Nv; i += 8) {
                const V8 s = dAv * vload(row + i) + dxv * vload(Bg + i);
                vstore(drow + i, s);
                acc = acc + s * vload(Cg + i);
            }
            float yp = hsum(acc);
            for (int64_t i = Nv; i < Ns; ++i) {
                const float s = dA * row[i] + dx * Bg[i];
                drow[i] = s;
                yp += s * Cg[i];
            }
            yh[p] = yp + Dskip[h] * x[p];
        }
    }
    // the gated norm per (sequence, group): cheap (I a sequence)
#pragma omp parallel for num_threads(nthreads) if (N * I >= (int64_t(1) << 18)) schedule(static)
    for (int64_t task = 0; task < N * G; ++task) {
        const int64_t n = task / G, g = task % G;
        float* u = y.data() + n * I + g * gw;
        const T* zg = z + n * z_stride + g * gw;
        T* og = out + n * out_stride + g * gw;
        float ss = 0.0f;
        for (int64_t i = 0; i < gw; ++i) {
            const float zi = to_f32(zg[i]);
            u[i] *= zi / (1.0f + std::exp(-zi));
            ss += u[i] * u[i];
        }
        const float inv = 1.0f / std::sqrt(ss / float(gw) + eps);
        for (int64_t i = 0; i < gw; ++i) {
            T r;
            store1(&r, u[i] * inv);  // the normed value rounded to T before the weight, as the reference
            store1(og + i, norm_w[g * gw + i] * to_f32(r));
        }
    }
}

// ---- LFM2 short conv decode (one token per sequence) --------------------------------------------------------------
// Everything between a ShortConv layer's in_proj and its out_proj, for N sequences each at its next token: bcx rows
// (3C: B | C | x, in_proj's chunk order) -> out (C) = C * conv(B * x), over the conv pool (S, C, K - 1) float32 (each
// slot the sequence's last K - 1 values of B * x, older first); src / dst slots as gdn_decode's (-1: fresh, a zero
// window; in place when equal, otherwise the src slot is left as it was). u = B x (the window's new value) and the
// conv (taps conv_w (C, K), no bias, no activation) stay float32 (the torch path rounds both to T at bf16); out
// rounded to T once.
// Each sequence is computed on its own: the same bits alone or in any batch.
template <typename T>
void shortconv_decode(T* out, int64_t out_stride, const T* bcx, int64_t bcx_stride, const float* conv_w,
                      float* conv_pool, const int64_t* src_slots, const int64_t* dst_slots, int64_t N, int64_t C,
                      int64_t K, int nthreads) {
    // the taps as a constant where LFM2 has them (3) or others might (4), so the compiler unrolls the window; KC 0:
    // any K. The same operations in the same order either way.
    auto run = [&](auto kc) {
        constexpr int64_t KC = decltype(kc)::value;
        const int64_t Kn = KC > 0 ? KC : K, K1 = Kn - 1;
        // C * K multiply-adds a sequence: one thread unless the batch is big
        for_rows(N, threads_for(N * C * Kn, nthreads), [&](int64_t n) {
            const T* b = bcx + n * bcx_stride;
            const T* cg = b + C;
            const T* x = b + 2 * C;
            const float* src = src_slots[n] < 0 ? nullptr : conv_pool + src_slots[n] * C * K1;
            float* dst = conv_pool + dst_slots[n] * C * K1;
            T* o = out + n * out_stride;
            for (int64_t c = 0; c < C; ++c) {
                const float y = conv_window_step(src ? src + c * K1 : nullptr, dst + c * K1, conv_w + c * Kn,
                                                 to_f32(b[c]) * to_f32(x[c]), Kn);
                store1(o + c, to_f32(cg[c]) * y);
            }
        });
    };
    switch (K) {
        case 3: run(std::integral_constant<int64_t, 3>{}); break;
        case 4: run(std::integral_constant<int64_t, 4>{}); break;
        default: run(std::integral_constant<int64_t, 0>{}); break;
    }
}

}  // namespace

extern "C" {

// Version of this interface: kernels.py refuses a library that answers differently.
// 17: tm_add_layer_norm; 16: tm_sigmoid_f32; 15: tm_sigmoid_mul; 14: tm_gelu_tanh_and_mul, tm_head_rms_norm takes an offset; 13: tm_rotary gone (tm_rotary_part takes whole heads too); 12: tm_rotary_part; 11: tm_head_rms_norm; 10: tm_shortconv_decode; 9: tm_mamba2_decode; 8: tm_gdn_decode reads src_slots and writes dst_slots (was slots +
// fresh); 7: tm_gdn_decode; 6: tm_paged_attention_rows takes attention sinks
int tm_abi_version() { return 17; }

// `dtype`: 0 = fp32, 1 = bf16. Strides are in elements. Returns 0, or -1 for an unknown dtype.

// x (rows, heads, hd) in place, rows x_stride apart and heads hd apart: each head's hd values rmsnorm'ed, times
// w (hd,), or with offset != 0 times (offset + w) taken in fp32 (Gemma's and Qwen3.5's (1 + w) norms, as HF
// computes them); each head as tm_add_rms_norm computes a row (the same bits as rows of D = hd). -2: hd > 1024
// with an offset.
int tm_head_rms_norm(int dtype, void* x, int64_t x_stride, int64_t rows, int64_t heads, int64_t hd, const void* w,
                     float offset, float eps, int nthreads) {
    float scale[1024];
    if (offset != 0.0f && hd > 1024) return -2;
    auto run = [&](auto* p, const auto* wt) {
        if (offset != 0.0f) {
            for (int64_t i = 0; i < hd; ++i) scale[i] = offset + to_f32(wt[i]);
            for_rows(rows * heads, threads_for(rows * heads * hd, nthreads), [&](int64_t r) {
                auto* head = p + (r / heads) * x_stride + (r % heads) * hd;
                add_rms_norm_row(head, head, decltype(p)(nullptr), static_cast<const float*>(scale), hd, eps);
            });
            return;
        }
        for_rows(rows * heads, threads_for(rows * heads * hd, nthreads), [&](int64_t r) {
            auto* head = p + (r / heads) * x_stride + (r % heads) * hd;
            add_rms_norm_row(head, head, decltype(p)(nullptr), wt, hd, eps);
        });
    };
    if (dtype == 0)
        run(static_cast<float*>(x), static_cast<const float*>(w));
    else if (dtype == 1)
        run(static_cast<bf16*>(x), static_cast<const bf16*>(w));
    else
        return -1;
    return 0;
}

// out[r] (int64) = the index of the first maximum of row r of x (rows, V), rows x_stride apart; -1 for a
// row holding a NaN or an infinity
int tm_argmax_rows(int dtype, const void* x, int64_t x_stride, int64_t rows, int64_t V, int64_t* out, int nthreads) {
    if (dtype == 0)
        argmax_rows(static_cast<const float*>(x), x_stride, rows, V, out, nthreads);
    else if (dtype == 1)
        argmax_rows(static_cast<const bf16*>(x), x_stride, rows, V, out, nthreads);
    else
        return -1;
    return 0;
}

// out (rows, D) = rmsnorm(res + x) * w, with res (rows, D) += x first; res == NULL: out = rmsnorm(x) * w.
int tm_add_rms_norm(int dtype, void* out, int64_t out_stride, const void* x, int64_t x_stride, void* res,
                    int64_t res_stride, const void* w, int64_t rows, int64_t D, float eps, int nthreads) {
    if (dtype == 0)
        add_rms_norm(static_cast<float*>(out), out_stride, static_cast<const float*>(x), x_stride,
                     static_cast<float*>(res), res_stride, static_cast<const float*>(w), rows, D, eps, nthreads);
    else if (dtype == 1)
        add_rms_norm(static_cast<bf16*>(out), out_stride, static_cast<const bf16*>(x), x_stride,
                     static_cast<bf16*>(res), res_stride, static_cast<const bf16*>(w), rows, D, eps, nthreads);
    else
        return -1;
    return 0;
}

// out (rows, D) = layernorm(res + x) * w (no bias), with res (rows, D) += x first; res == NULL: out = layernorm(x) * w.
int tm_add_layer_norm(int dtype, void* out, int64_t out_stride, const void* x, int64_t x_stride, void* res,
                      int64_t res_stride, const void* w, int64_t rows, int64_t D, float eps, int nthreads) {
    auto run = [&](auto* o, const auto* xx, auto* r, const auto* ww) {
        for_rows(rows, threads_for(rows * D, nthreads), [&](int64_t t) {
            add_layer_norm_row(o + t * out_stride, xx + t * x_stride, r ? r + t * res_stride : nullptr, ww, D, eps);
        });
    };
    if (dtype == 0)
        run(static_cast<float*>(out), static_cast<const float*>(x), static_cast<float*>(res),
            static_cast<const float*>(w));
    else if (dtype == 1)
        run(static_cast<bf16*>(out), static_cast<const bf16*>(x), static_cast<bf16*>(res), static_cast<const bf16*>(w));
    else
        return -1;
    return 0;
}

// out (rows, I) = silu(in[:, :I]) * in[:, I:2I]
int tm_silu_and_mul(int dtype, void* out, int64_t out_stride, const void* in, int64_t in_stride, int64_t rows,
                    int64_t I, int nthreads) {
    if (dtype == 0)
        silu_and_mul(static_cast<float*>(out), out_stride, static_cast<const float*>(in), in_stride, rows, I, nthreads);
    else if (dtype == 1)
        silu_and_mul(static_cast<bf16*>(out), out_stride, static_cast<const bf16*>(in), in_stride, rows, I, nthreads);
    else
        return -1;
    return 0;
}

// out (rows, I) = gelu_tanh(in[:, :I]) * in[:, I:2I]
int tm_gelu_tanh_and_mul(int dtype, void* out, int64_t out_stride, const void* in, int64_t in_stride, int64_t rows,
                         int64_t I, int nthreads) {
    if (dtype == 0)
        gelu_tanh_and_mul(static_cast<float*>(out), out_stride, static_cast<const float*>(in), in_stride, rows, I,
                          nthreads);
    else if (dtype == 1)
        gelu_tanh_and_mul(static_cast<bf16*>(out), out_stride, static_cast<const bf16*>(in), in_stride, rows, I,
                          nthreads);
    else
        return -1;
    return 0;
}

// out (n,) fp32 = sigmoid(x) = 1 / (1 + exp(-x)) of x (n,) (a gated shared expert's weight per token: Qwen2-MoE's,
// Qwen3.5 MoE's), x widened first
int tm_sigmoid_f32(int dtype, const void* x, int64_t n, float* out) {
    if (dtype != 0 && dtype != 1) return -1;
    for (int64_t i = 0; i < n; ++i) {
        const float v = dtype == 0 ? static_cast<const float*>(x)[i] : to_f32(static_cast<const bf16*>(x)[i]);
        out[i] = 1.0f / (1.0f + std::exp(-v));
    }
    return 0;
}

// x (rows, heads, hd) *= sigmoid(g) in place: x's heads hd apart, rows x_stride apart; g's rows g_stride apart and
// heads g_head_stride apart (Qwen3.5's gate: each head's hd values after its q's)
int tm_sigmoid_mul(int dtype, void* x, int64_t x_stride, const void* g, int64_t g_stride, int64_t g_head_stride,
                   int64_t rows, int64_t heads, int64_t hd, int nthreads) {
    if (dtype == 0)
        sigmoid_mul(static_cast<float*>(x), x_stride, static_cast<const float*>(g), g_stride, g_head_stride, rows,
                    heads, hd, nthreads);
    else if (dtype == 1)
        sigmoid_mul(static_cast<bf16*>(x), x_stride, static_cast<const bf16*>(g), g_stride, g_head_stride, rows,
                    heads, hd, nthreads);
    else
        return -1;
    return 0;
}

// x (rows, heads, head_dim), heads head_dim apart, rows x_stride apart: each head's leading `rot` dims (all of
// them, or partial rotary's) rotated in place by cos and signed sin (rows, rot), rows tab_stride apart. rot even.
int tm_rotary_part(int dtype, void* x, int64_t x_stride, int64_t heads, int64_t head_dim, int64_t rot,
                   const void* cos, const void* ssin, int64_t tab_stride, int64_t rows, int nthreads) {
    if (rot % 2 || rot > head_dim) return -2;
    if (dtype == 0)
        rotary(static_cast<float*>(x), x_stride, heads, head_dim, rot, static_cast<const float*>(cos),
               static_cast<const float*>(ssin), tab_stride, rows, nthreads);
    else if (dtype == 1)
        rotary(static_cast<bf16*>(x), x_stride, heads, head_dim, rot, static_cast<const bf16*>(cos),
               static_cast<const bf16*>(ssin), tab_stride, rows, nthreads);
    else
        return -1;
    return 0;
}

// One query token per sequence b: q (num_seqs, nh, hd) rows q_stride apart -> out (num_seqs, nh, hd)
// rows out_stride apart, over positions [starts[b], lens[b]) (starts NULL: from 0; a sliding window's
// first key otherwise) of the paged caches k_cache, v_cache
// (num_blocks, block_size, nkv, hd; contiguous): position p is in block tables[b * table_stride + p / bs]
// at offset p % bs. Query head h reads KV head h / (nh / nkv). The context is cut into partitions of
// `partition` positions (a multiple of 16), attended independently and merged. softcap > 0: each score s (after
// the scale) becomes softcap * tanh(s / softcap) before the softmax (Gemma 2's attention); 0: none.
// prefill_from: the rows from this one on are a prompt's (the rest decodes and verification rows); at bf16 on
// AVX-512 with AVX512_BF16 they take the lane-wise tiles (attend_range_lanes), elsewhere the same as the others.
// sinks (nh,) fp32, or NULL: each query head's softmax has one more logit, sinks[h], that selects no value
// (gpt-oss's attention sinks): out = sum_j e^(s_j) v_j / (e^(sinks[h]) + sum_j e^(s_j)).
// Returns 0; -1 unknown dtype; -2 shapes it does not handle (hd % 8 != 0, nh % nkv != 0).
int tm_paged_attention_rows(int dtype, void* out, int64_t out_stride, const void* q, int64_t q_stride,
                            const void* k_cache, const void* v_cache, const int64_t* tables, int64_t table_stride,
                            const int64_t* lens, const int64_t* starts, int64_t num_seqs, int64_t nh, int64_t nkv,
                            int64_t hd, int64_t block_size, float scale, float softcap, int64_t partition,
                            int nthreads, int64_t prefill_from, const float* sinks) {
    if (hd <= 0 || hd % 8 || nkv <= 0 || nh % nkv || block_size <= 0 || partition <= 0 || partition % kTile)
        return -2;
    const AttnArgs a{nh, nkv, hd, block_size, nkv * hd, scale, softcap > 0.0f ? softcap : 0.0f, sinks};
    const int64_t from = prefill_from < 0 ? 0 : prefill_from > num_seqs ? num_seqs : prefill_from;
    if (dtype == 0)
        return paged_decode_dispatch<float>(out, out_stride, q, q_stride, k_cache, v_cache, tables, table_stride,
                                            lens, starts, num_seqs, a, partition, nthreads, from);
    if (dtype == 1)
        return paged_decode_dispatch<bf16>(out, out_stride, q, q_stride, k_cache, v_cache, tables, table_stride,
                                           lens, starts, num_seqs, a, partition, nthreads, from);
    return -1;
}

// gdn_decode above: out (N, Hv dv), qkv (N, C), z (N, Hv dv), ba (N, 2 Hv: b | a), rows *_stride apart, of `dtype`;
// the weights and pools float32, contiguous; src_slots (-1: fresh, a zero state), dst_slots (N,) int64.
// Returns 0; -1 unknown dtype; -2 shapes it does not handle.
int tm_gdn_decode(int dtype, void* out, int64_t out_stride, const void* qkv, int64_t qkv_stride, const void* z,
                  int64_t z_stride, const void* ba, int64_t ba_stride, const float* conv_w, float* conv_pool,
                  float* ssm_pool, const int64_t* src_slots, const int64_t* dst_slots, const float* neg_a,
                  const float* dt_bias, const float* norm_w, int64_t N, int64_t Hk, int64_t Hv, int64_t dk,
                  int64_t dv, int64_t K, int tiled, float eps, int nthreads) {
    if (Hk <= 0 || Hv % Hk || dk <= 0 || dv <= 0 || K < 1) return -2;
    if (dtype == 0)
        gdn_decode(static_cast<float*>(out), out_stride, static_cast<const float*>(qkv), qkv_stride,
                   static_cast<const float*>(z), z_stride, static_cast<const float*>(ba), ba_stride, conv_w,
                   conv_pool, ssm_pool, src_slots, dst_slots, neg_a, dt_bias, norm_w, N, Hk, Hv, dk, dv, K, tiled != 0,
                   eps, nthreads);
    else if (dtype == 1)
        gdn_decode(static_cast<bf16*>(out), out_stride, static_cast<const bf16*>(qkv), qkv_stride,
                   static_cast<const bf16*>(z), z_stride, static_cast<const bf16*>(ba), ba_stride, conv_w, conv_pool,
                   ssm_pool, src_slots, dst_slots, neg_a, dt_bias, norm_w, N, Hk, Hv, dk, dv, K, tiled != 0, eps,
                   nthreads);
    else
        return -1;
    return 0;
}

// mamba2_decode above: out (N, I), xbc (N, C), z (N, I), dt (N, H), rows *_stride apart, of `dtype` (I = H P,
// C = I + 2 G Ns); the weights and pools float32, contiguous (conv_b NULL: no bias); src_slots (-1: fresh, a zero
// state), dst_slots (N,) int64. Returns 0; -1 unknown dtype; -2 shapes it does not handle.
int tm_mamba2_decode(int dtype, void* out, int64_t out_stride, const void* xbc, int64_t xbc_stride, const void* z,
                     int64_t z_stride, const void* dt, int64_t dt_stride, const float* conv_w, const float* conv_b,
                     float* conv_pool, float* ssm_pool, const int64_t* src_slots, const int64_t* dst_slots,
                     const float* neg_a, const float* dt_bias, const float* D, const float* norm_w, int64_t N,
                     int64_t H, int64_t G, int64_t P, int64_t Ns, int64_t K, float eps, int nthreads) {
    if (G <= 0 || H % G || P <= 0 || Ns <= 0 || K < 1) return -2;
    if (dtype == 0)
        mamba2_decode(static_cast<float*>(out), out_stride, static_cast<const float*>(xbc), xbc_stride,
                      static_cast<const float*>(z), z_stride, static_cast<const float*>(dt), dt_stride, conv_w, conv_b,
                      conv_pool, ssm_pool, src_slots, dst_slots, neg_a, dt_bias, D, norm_w, N, H, G, P, Ns, K, eps,
                      nthreads);
    else if (dtype == 1)
        mamba2_decode(static_cast<bf16*>(out), out_stride, static_cast<const bf16*>(xbc), xbc_stride,
                      static_cast<const bf16*>(z), z_stride, static_cast<const bf16*>(dt), dt_stride, conv_w, conv_b,
                      conv_pool, ssm_pool, src_slots, dst_slots, neg_a, dt_bias, D, norm_w, N, H, G, P, Ns, K, eps,
                      nthreads);
    else
        return -1;
    return 0;
}

// shortconv_decode above: out (N, C), bcx (N, 3C: B | C | x), rows *_stride apart, of `dtype`; conv_w (C, K) and
// conv_pool (S, C, K - 1) float32, contiguous; src_slots (-1: fresh, a zero window), dst_slots (N,) int64.
// Returns 0; -1 unknown dtype; -2 shapes it does not handle.
int tm_shortconv_decode(int dtype, void* out, int64_t out_stride, const void* bcx, int64_t bcx_stride,
                        const float* conv_w, float* conv_pool, const int64_t* src_slots, const int64_t* dst_slots,
                        int64_t N, int64_t C, int64_t K, int nthreads) {
    if (C <= 0 || K < 1) return -2;
    if (dtype == 0)
        shortconv_decode(static_cast<float*>(out), out_stride, static_cast<const float*>(bcx), bcx_stride, conv_w,
                         conv_pool, src_slots, dst_slots, N, C, K, nthreads);
    else if (dtype == 1)
        shortconv_decode(static_cast<bf16*>(out), out_stride, static_cast<const bf16*>(bcx), bcx_stride, conv_w,
                         conv_pool, src_slots, dst_slots, N, C, K, nthreads);
    else
        return -1;
    return 0;
}

// tm_paged_attention_rows with every row a decode (the native decode step's entry).
int tm_paged_decode_attention(int dtype, void* out, int64_t out_stride, const void* q, int64_t q_stride,
                              const void* k_cache, const void* v_cache, const int64_t* tables,
                              int64_t table_stride, const int64_t* lens, const int64_t* starts,
                              int64_t num_seqs, int64_t nh,
                              int64_t nkv, int64_t hd, int64_t block_size, float scale, float softcap,
                              int64_t partition, int nthreads) {
    return tm_paged_attention_rows(dtype, out, out_stride, q, q_stride, k_cache, v_cache, tables, table_stride, lens,
                                   starts, num_seqs, nh, nkv, hd, block_size, scale, softcap, partition, nthreads,
                                   num_seqs, nullptr);
}

}  // extern "C"
