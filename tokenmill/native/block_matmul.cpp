// y = x . W^T for a GGUF matrix W kept in its file's blocks (Q4_0, Q4_1, Q8_0), for a few rows of x at a
// time (decode batches, speculative verification). It quantizes each row of x per 32-block and takes integer
// dot products, as ggml's kernels do, but to 16 bits (scale amax / 32767) where ggml takes 8: the weights are
// the file's, and x's rounding error (~1e-5 relative against ~4e-3 at 8 bits) no longer moves the argmax
// (teacher-forced top-1 against the fp32 dequantized model: ~99.9% instead of ~96%), for ~5% more time at
// one row and ~10% at 2-8 (two 16-bit multiply-adds per 32 elements instead of one 8-bit pair). Unlike
// ggml it unpacks each weight block once and multiplies it into up to 8 rows of x, so M rows cost well
// under M one-row calls (ggml dots each (weight row, x row) pair on its own).
//
// Plain C++ (no torch, no ggml headers), called through ctypes from block_matmul.py.
//
//   tm_block_matmul(type, W, N, K, x, ldx, M, y, ldy, nthreads)
//     W: N rows of K/32 blocks (ggml's layout: Q4_0 {f16 d; u8 qs[16]}, Q4_1 {f16 d; f16 m; u8 qs[16]},
//        Q8_0 {f16 d; i8 qs[32]}; byte j of qs holds element j in its low nibble, element j + 16 in its high)
//     x: (M, K) fp32, rows ldx apart; y: (M, N) fp32, rows ldy apart. K % 32 == 0.
//   tm_block_matmul_grouped: groups of consecutive rows of x, each times its own matrix (a mixture of
//     experts' layer in one call).
//   Both hand Q4_K, Q5_K and Q6_K matrices (K % 256 == 0) to kquant_matmul.cpp, the same scheme for those blocks,
//   and packed ones (Q5_0 / Q5_1 / IQ4_NL only so) to vnni_matmul.cpp.
//
// Invariant: y[m, n] depends only on x[m, :] and W[n, :]: each output is accumulated in one fixed order
// (blocks in order, then the lanes) whatever M, the grouping of rows or the thread count, so a row gives
// the same bits alone or in any batch.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>
#if defined(_OPENMP)
#include <omp.h>
#endif
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && !defined(TM_PORTABLE)
#include <immintrin.h>
#define TM_AVX2 1
#if defined(__AVX512F__) && defined(__AVX512BW__) && !defined(TM_NO_AVX512)
#define TM_Q512 1  // the activation quantizer's 512-bit code (-DTM_NO_AVX512: its AVX2 code; the same bits)
#endif
#endif

// IEEE half -> float; also panel_matmul.cpp's, in the portable build (the same library)
__attribute__((visibility("hidden"))) float tm_half_to_float(uint16_t h) {
#ifdef TM_AVX2
    return _cvtsh_ss(h);
#else
    const uint32_t sign = uint32_t(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else {  // subnormal: normalize
            int e = -1;
            uint32_t m = man;
            do {
                ++e;
                m <<= 1;
            } while (!(m & 0x400));
            u = sign | uint32_t(127 - 15 - e) << 23 | (m & 0x3ff) << 13;
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | man << 13;
    } else {
        u = sign | (exp + 127 - 15) << 23 | man << 13;
    }
    float f;
    std::memcpy(&f, &u, 4);
    return f;
#endif
}

namespace {

enum : int { kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kIQ4_NL = 20, kPacked = 0x100 };  // ggml's type
// numbers; the packed flag (vnni_matmul.cpp; Q5_0 / Q5_1 / IQ4_NL only packed here)

inline float half_to_float(uint16_t h) { return tm_half_to_float(h); }

inline uint16_t load_u16(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
}

template <int TYPE>
constexpr int64_t block_bytes() {
    return TYPE == kQ4_0 ? 18 : TYPE == kQ4_1 ? 20 : 34;
}

// x rows quantized per 32-block: q (M, K) int16, and per (row, block) the scale d and s = d * sum(q)
constexpr float kXMax = 32767.0f;  // x quantized to 16 bits per 32-block

struct QuantX {
    std::vector<int16_t> q;
    std::vector<float> d, s;
};

}  // namespace

// Where element e (0-31) of x's 32-block b lands in its row of q, by layout: 0 in place; 1 per block its 16 even
// elements, then its 16 odd ones; 2 per pair of blocks (2p, 2p + 1): block 2p's even elements, block 2p + 1's
// even ones, then both blocks' odd ones (kquant_matmul.cpp's 256- and 512-bit vectors; its plain C++ code reads
// x through this too). Hidden (not the ABI); inlined in this file.
__attribute__((visibility("hidden"))) int64_t tm_x_slot(int layout, int64_t b, int e) {
    return layout == 0 ? 32 * b + e
         : layout == 1 ? 32 * b + (e & 1) * 16 + e / 2
                       : 64 * (b / 2) + (e & 1) * 32 + (b % 2) * 16 + e / 2;
}

// x (M, K) fp32, rows ldx apart -> q (M, K) int16 (tm_x_slot's layout), one scale per `group` elements of a row (32
// here, 256 for kquant_matmul.cpp; a multiple of 32) mapping the group's amax to qmax (32767 here): per (row,
// group) the scale d, per (row, 32-block) s = d * sum(q) of the block. Each value is x * (qmax / amax) rounded
// to nearest even (the vector code's conversion, std::nearbyint's in the scalar one), so both give the same q.
// Shared by both kernels (hidden: not the ABI).
__attribute__((visibility("hidden"))) void tm_quantize_rows16(const float* x, int64_t ldx, int64_t M, int64_t K,
                                                             int64_t group, float qmax, int layout,
                                                             std::vector<int16_t>& q, std::vector<float>& d,
                                                             std::vector<float>& s) {
    const int64_t nb = K / 32, ng = K / group, per = group / 32;
    q.resize(size_t(M * K));
    d.resize(size_t(M * ng));
    s.resize(size_t(M * nb));
    for (int64_t r = 0; r < M; ++r)
        for (int64_t g = 0; g < ng; ++g) {
            const float* xg = x + r * ldx + group * g;
            int16_t* qr = q.data() + r * K;
#if defined(TM_Q512)
            // (max(|x|, m) keeps m where x is NaN, as std::fmax does)
            const __m512 sign = _mm512_set1_ps(-0.0f);
            __m512 m = _mm512_setzero_ps();
            for (int64_t i = 0; i < group; i += 16) m = _mm512_max_ps(_mm512_andnot_ps(sign, _mm512_loadu_ps(xg + i)), m);
            const float amax = _mm512_reduce_max_ps(m);
#elif defined(TM_AVX2)
            const __m256 sign = _mm256_set1_ps(-0.0f);
            __m256 m = _mm256_setzero_ps();
            for (int64_t i = 0; i < group; i += 8) m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(xg + i)), m);
            __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
#else
            float amax = 0.0f;
            for (int64_t i = 0; i < group; ++i) amax = std::fmax(amax, std::fabs(xg[i]));
#endif
            const float dg = amax / qmax, id = dg > 0.0f ? qmax / amax : 0.0f;
            for (int64_t b = per * g; b < per * (g + 1); ++b) {
                const float* xb = x + r * ldx + 32 * b;
#if defined(TM_Q512)
                const __m512 vid = _mm512_set1_ps(id);
                const __m512i v0 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb), vid));
                const __m512i v1 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb + 16), vid));
                const int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(v0, v1));
                // elements 0-31 as 16-bit lanes (the low 16 bits, as the scalar conversion keeps)
                __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(v0)), _mm512_cvtepi32_epi16(v1), 1);
                if (layout == 0) {
                    _mm512_storeu_si512(qr + 32 * b, w);
                } else {
                    // even elements to lanes 0-15, odd ones to 16-31
                    const __m512i eo = _mm512_set_epi16(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1,
                                                        30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
                    w = _mm512_permutexvar_epi16(eo, w);
                    _mm256_storeu_si256(reinterpret_cast<__m256i*>(qr + tm_x_slot(layout, b, 0)), _mm512_castsi512_si256(w));
                    _mm256_storeu_si256(reinterpret_cast<__m256i*>(qr + tm_x_slot(layout, b, 1)), _mm512_extracti64x4_epi64(w, 1));
                }
#elif defined(TM_AVX2)
                const __m256 vid = _mm256_set1_ps(id);
                // each int32's low 16 bits (as the scalar conversion keeps), in order, into the low 8 bytes of each
                // 128-bit lane, then the two lanes' together: 8 int16 per vector of 8
                const __m256i low16 = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1,
                                                       0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1);
                __m256i tot = _mm256_setzero_si256();
                __m128i h[4];  // elements 8k .. 8k + 7
                for (int k = 0; k < 4; ++k) {
                    const __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + 8 * k), vid));
                    tot = _mm256_add_epi32(tot, v);
                    h[k] = _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_shuffle_epi8(v, low16), 0x08));
                }
                __m128i t4 = _mm_add_epi32(_mm256_castsi256_si128(tot), _mm256_extracti128_si256(tot, 1));
                t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0x4e));
                const int sum = _mm_cvtsi128_si32(_mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0xb1)));
                if (layout == 0) {
                    for (int k = 0; k < 4; ++k) _mm_storeu_si128(reinterpret_cast<__m128i*>(qr + 32 * b + 8 * k), h[k]);
                } else {
                    // per 8 elements: the 4 even ones, then the 4 odd ones; two such make 8 evens and 8 odds
                    const __m128i eo = _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
                    for (int half = 0; half < 2; ++half) {
                        const __m128i a = _mm_shuffle_epi8(h[2 * half], eo), c = _mm_shuffle_epi8(h[2 * half + 1], eo);
                        _mm_storeu_si128(reinterpret_cast<__m128i*>(qr + tm_x_slot(layout, b, 0) + 8 * half), _mm_unpacklo_epi64(a, c));
                        _mm_storeu_si128(reinterpret_cast<__m128i*>(qr + tm_x_slot(layout, b, 1) + 8 * half), _mm_unpackhi_epi64(a, c));
                    }
                }
#else
                int sum = 0;
                for (int i = 0; i < 32; ++i) {
                    const int v = int(std::nearbyint(xb[i] * id));
                    qr[tm_x_slot(layout, b, i)] = int16_t(v);
                    sum += v;
                }
#endif
                s[size_t(r * nb + b)] = dg * float(sum);
            }
            d[size_t(r * ng + g)] = dg;
        }
}

// item(0), ..., item(items - 1) on nthreads OpenMP threads (a static schedule), or on this one: the work loop
// of both kernels (hidden: not the ABI)
__attribute__((visibility("hidden"))) void tm_run_items(int64_t items, int nthreads,
                                                       const std::function<void(int64_t)>& item) {
#if defined(_OPENMP)
    if (nthreads > 1 && items > 1) {
#pragma omp parallel for num_threads(nthreads) schedule(static)
        for (int64_t it = 0; it < items; ++it) item(it);
        return;
    }
#endif
    (void)nthreads;
    for (int64_t it = 0; it < items; ++it) item(it);
}

namespace {

void quantize_rows(const float* x, int64_t ldx, int64_t M, int64_t K, QuantX& out) {
    tm_quantize_rows16(x, ldx, M, K, 32, kXMax, 0, out.q, out.d, out.s);
}

#ifdef TM_AVX2
inline float hsum8(__m256 a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif

// rows [0, R) of the quantized x (row stride K) against weight row `wrow` -> y[r * ldy]. For R > 1 the
// AVX2 path reads the rows' scales from dT, sT (xd, xs block-major, 8 lanes a block: lane r is row r), so
// a block's scale and offset terms for all the rows are one vector multiply and one fma: the same products,
// and the same per-row order of the offset sums, as one scalar per row (so the same bits); one row keeps
// the scalars (the vector forms measured slower there).
template <int TYPE, int R>
inline void dot_rows(const uint8_t* wrow, int64_t nb, const int16_t* xq, const float* xd, const float* xs,
                     const float* dT, const float* sT, int64_t K, float* y, int64_t ldy) {
#ifdef TM_AVX2
    __m256 acc[R];
    __m256 off = _mm256_setzero_ps();  // lane r: row r's offset terms (Q4_1's min, Q4_0's -8), in block order
    float off1 = 0.0f;  // the same, for one row
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = wrow + b * block_bytes<TYPE>();
        const float dw = half_to_float(load_u16(blk));
        __m256i w0, w1;  // elements 0-15 and 16-31 as int16 (Q4: 0..15 unsigned; Q8_0: signed)
        float mw = 0.0f;
        if constexpr (TYPE == kQ8_0) {
            const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
            w0 = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(raw));
            w1 = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(raw, 1));
        } else {
            const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + (TYPE == kQ4_1 ? 4 : 2)));
            const __m128i mask = _mm_set1_epi8(0x0f);
            w0 = _mm256_cvtepu8_epi16(_mm_and_si128(raw, mask));
            w1 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), mask));
            mw = TYPE == kQ4_1 ? half_to_float(load_u16(blk + 2)) : -8.0f * dw;
        }
        // lane r: row r's scale dw * xd. Up to 6 rows it is also stored, so that each row's broadcast is a
        // load rather than a register permute, which competed with the multiply-adds (7-18% at 2-5 rows on a
        // Zen 2, within +-3% on an AVX-512 Xeon, 2026-12-05; at 8 rows the extra loads cost 4% there)
        constexpr bool kStored = R > 1 && R <= 6;
        alignas(32) float stored[8];
        __m256 scales;
        if constexpr (R == 1) {  // one row: scalars, from xd, xs (dT, sT are not made for a one-row call)
            scales = _mm256_set1_ps(dw * xd[b]);
            if constexpr (TYPE != kQ8_0) off1 = std::fma(mw, xs[b], off1);
        } else {
            scales = _mm256_mul_ps(_mm256_set1_ps(dw), _mm256_loadu_ps(dT + 8 * b));
            if constexpr (kStored) _mm256_store_ps(stored, scales);
            if constexpr (TYPE != kQ8_0) off = _mm256_fmadd_ps(_mm256_set1_ps(mw), _mm256_loadu_ps(sT + 8 * b), off);
        }
        for (int r = 0; r < R; ++r) {
            const int16_t* xb = xq + r * K + 32 * b;
            const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb));
            const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + 16));
            // lane l (0-7) of the sum: elements 2l, 2l+1 and 16+2l, 16+2l+1 (exact: |w x| < 2^22)
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
            // the same int32 lanes in one fewer instruction (vpdpwssd adds the pairs' products, exactly)
            const __m256i p = _mm256_dpwssd_epi32(_mm256_madd_epi16(w0, x0), w1, x1);
#else
            const __m256i p = _mm256_add_epi32(_mm256_madd_epi16(w0, x0), _mm256_madd_epi16(w1, x1));
#endif
            const __m256 scale = R == 1    ? scales
                                 : kStored ? _mm256_broadcast_ss(stored + r)
                                           : _mm256_permutevar8x32_ps(scales, _mm256_set1_epi32(r));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), scale, acc[r]);
        }
    }
    if constexpr (R == 1) {
        (void)off;
        y[0] = hsum8(acc[0]) + off1;
    } else {
        alignas(32) float offs[8];
        _mm256_store_ps(offs, off);
        for (int r = 0; r < R; ++r) y[r * ldy] = hsum8(acc[r]) + offs[r];
    }
#else
    (void)dT, (void)sT;
    float acc[R][8], off[R];
    for (int r = 0; r < R; ++r) {
        off[r] = 0.0f;
        for (int l = 0; l < 8; ++l) acc[r][l] = 0.0f;
    }
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = wrow + b * block_bytes<TYPE>();
        const float dw = half_to_float(load_u16(blk));
        int wv[32];
        float mw = 0.0f;
        for (int e = 0; e < 32; ++e) {
            if constexpr (TYPE == kQ8_0) {
                wv[e] = int8_t(blk[2 + e]);
            } else {
                const uint8_t byte = blk[(TYPE == kQ4_1 ? 4 : 2) + (e & 15)];
                wv[e] = e < 16 ? (byte & 0x0f) : (byte >> 4);
            }
        }
        if constexpr (TYPE != kQ8_0) mw = TYPE == kQ4_1 ? half_to_float(load_u16(blk + 2)) : -8.0f * dw;
        for (int r = 0; r < R; ++r) {
            const int16_t* xb = xq + r * K + 32 * b;
            const float scale = dw * xd[r * nb + b];
            for (int l = 0; l < 8; ++l) {  // lane l: elements 2l, 2l + 1, 16 + 2l, 17 + 2l, as AVX2 pairs them
                const int p = wv[2 * l] * xb[2 * l] + wv[2 * l + 1] * xb[2 * l + 1] + wv[16 + 2 * l] * xb[16 + 2 * l] +
                              wv[17 + 2 * l] * xb[17 + 2 * l];
                acc[r][l] = std::fma(float(p), scale, acc[r][l]);
            }
            if constexpr (TYPE != kQ8_0) off[r] = std::fma(mw, xs[r * nb + b], off[r]);
        }
    }
    for (int r = 0; r < R; ++r) {  // the AVX2 order: halves, then pairs, then the last two
        float s[4];
        for (int i = 0; i < 4; ++i) s[i] = acc[r][i] + acc[r][i + 4];
        y[r * ldy] = ((s[0] + s[2]) + (s[1] + s[3])) + off[r];
    }
#endif
}

constexpr int64_t kPrefetchAhead = 2048;  // bytes; see rows_block

// weight rows [n0, n1) of W against the M quantized rows of x -> y[:, n] (rows ldy apart)
// tr: the M rows' scales as dot_rows reads them, per 8 rows (8 lanes a block: d for nb blocks, then s)
template <int TYPE>
void rows_block(const uint8_t* W, int64_t n0, int64_t n1, int64_t K, const int16_t* xq, const float* xd,
                const float* xs, const float* tr, int64_t M, float* y, int64_t ldy) {
    const int64_t nb = K / 32, row_bytes = nb * block_bytes<TYPE>();
    for (int64_t n = n0; n < n1; ++n) {
        const uint8_t* wrow = W + n * row_bytes;
        // The weight rows are read once, in order, so the kernel waits on memory unless the bytes are asked
        // for ahead: the hardware prefetchers stop at each 4 KiB page and restart slowly, and the matrices
        // are small (0.3-1.1 MB for SmolLM2). So each row asks for the bytes kPrefetchAhead further on, line
        // by line (a prefetch never faults, past the end of the matrix included). The default model's 120
        // layer matrices, 2 threads, AMX Xeon, 2026-12-05: 12.2 -> 6.0 ms at one row, 14.6 -> 5.8 at two,
        // 15.4 -> 8.3 at four, 18.4 -> 13.3 at eight; 1024-8192 bytes ahead measured alike.
        for (int64_t o = 0; o < row_bytes; o += 64) __builtin_prefetch(wrow + kPrefetchAhead + o, 0, 3);
        for (int64_t r = 0; r < M; r += 8) {
            const int16_t* xr = xq + r * K;
            const float *dr = xd + r * nb, *sr = xs + r * nb;
            const float* dT = tr + (r / 8) * 16 * nb;
            const float* sT = dT + 8 * nb;
            float* yr = y + r * ldy + n;
            switch (M - r < 8 ? M - r : 8) {
                case 8: dot_rows<TYPE, 8>(wrow, nb, xr, dr, sr, dT, sT, K, yr, ldy); break;
                case 7: dot_rows<TYPE, 7>(wrow, nb, xr, dr, sr, dT, sT, K, yr, ldy); break;
                case 6: dot_rows<TYPE, 6>(wrow, nb, xr, dr, sr, dT, sT, K, yr, ldy); break;
                case 5: dot_rows<TYPE, 5>(wrow, nb, xr, dr, sr, dT, sT, K, yr, ldy); break;
                case 4: dot_rows<TYPE, 4>(wrow, nb, xr, dr, sr, dT, sT, K, yr, ldy); break;
                case 3: dot_rows<TYPE, 3>(wrow, nb, xr, dr, sr, dT, sT, K, yr, ldy); break;
                case 2: dot_rows<TYPE, 2>(wrow, nb, xr, dr, sr, dT, sT, K, yr, ldy); break;
                default: dot_rows<TYPE, 1>(wrow, nb, xr, dr, sr, dT, sT, K, yr, ldy); break;
            }
        }
    }
}

// Groups g of rows [starts[g], starts[g] + counts[g]) of x, each times its own (N, K) matrix W[g] (one
// group: a plain matmul). Work items are (group, 16 weight rows): a chunk's weight rows share the group's
// x rows in L1, and the items spread over threads.
template <int TYPE>
void block_matmul(const uint8_t* const* W, int64_t groups, const int64_t* starts, const int64_t* counts,
                  int64_t N, int64_t K, const float* x, int64_t ldx, int64_t M, float* y, int64_t ldy,
                  int nthreads) {
    const int64_t nb = K / 32;
    thread_local QuantX qx;
    quantize_rows(x, ldx, M, K, qx);
    const int16_t* xq = qx.q.data();
    const float *xd = qx.d.data(), *xs = qx.s.data();
    // each group's rows' scales, 8 rows at a time, block-major (rows_block's `tr`); only the AVX2 dot_rows
    // reads it, and none for a one-row call (dot_rows<1> reads xd, xs)
#ifdef TM_AVX2
    const bool vector_scales = M > 1;
#else
    const bool vector_scales = false;
#endif
    thread_local std::vector<float> tr;
    thread_local std::vector<int64_t> toff;
    toff.assign(size_t(groups + 1), 0);
    for (int64_t g = 0; g < groups; ++g)
        toff[g + 1] = toff[g] + (vector_scales ? (std::max<int64_t>(counts[g], 0) + 7) / 8 * 16 * nb : 0);
    tr.assign(size_t(toff[groups]), 0.0f);
    for (int64_t g = 0; g < groups && vector_scales; ++g)
        for (int64_t i = 0; i < counts[g]; ++i) {
            float* dT = tr.data() + toff[g] + (i / 8) * 16 * nb;
            const int64_t row = starts[g] + i;
            for (int64_t b = 0; b < nb; ++b) {
                dT[8 * b + i % 8] = xd[row * nb + b];
                dT[8 * nb + 8 * b + i % 8] = xs[row * nb + b];
            }
        }
    // plain pointers for the threads (a thread_local named in the lambda would be each thread's own)
    const float* trp = tr.data();
    const int64_t* toffp = toff.data();
    const int64_t chunks = (N + 15) / 16, items = groups * chunks;
    auto item = [&](int64_t it) {
        const int64_t g = it / chunks, c = it % chunks, r0 = starts[g], m = counts[g];
        if (m <= 0) return;
        rows_block<TYPE>(W[g], 16 * c, std::min<int64_t>(N, 16 * c + 16), K, xq + r0 * K, xd + r0 * nb,
                         xs + r0 * nb, trp + toffp[g], m, y + r0 * ldy, ldy);
    };
    tm_run_items(items, nthreads, item);
}

}  // namespace

int tm_kquant_matmul(int type, const uint8_t* const* W, int64_t groups, const int64_t* starts, const int64_t* counts,
                     int64_t N, int64_t K, const float* x, int64_t ldx, int64_t M, float* y, int64_t ldy,
                     int nthreads);  // kquant_matmul.cpp: Q4_K, Q5_K, Q6_K
bool tm_kquant_supports(int type);

namespace {

template <typename... A>
int dispatch(int type, A... args) {
    if (tm_kquant_supports(type)) return tm_kquant_matmul(type, args...);
    switch (type) {
        case kQ4_0: block_matmul<kQ4_0>(args...); return 0;
        case kQ4_1: block_matmul<kQ4_1>(args...); return 0;
        case kQ8_0: block_matmul<kQ8_0>(args...); return 0;
        default: return -1;
    }
}

}  // namespace

extern "C" {

int tm_block_matmul_abi() { return 5; }

int tm_vnni16_matmul(int type, const void* W, int64_t N, int64_t K, const float* x, int64_t ldx, int64_t M,
                     float* y, int64_t ldy, int nthreads);  // vnni_matmul.cpp
int tm_vnni_available();                                           // vnni_matmul.cpp

// 1 when `type` is one this library multiplies: a ggml type, or TM_PACKED | Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 /
// IQ4_NL for a matrix in vnni_matmul.cpp's packed layout (tm_vnni_pack), where that kernel is built
int tm_block_matmul_supports(int type) {
    if (type & kPacked) {
        const int t = type & ~kPacked;
        return tm_vnni_available() && (t == kQ4_0 || t == kQ4_1 || t == kQ5_0 || t == kQ5_1 || t == kQ8_0 ||
                                       t == kIQ4_NL);
    }
    return type == kQ4_0 || type == kQ4_1 || type == kQ8_0 || tm_kquant_supports(type);
}

// See the header. Returns 0; -1 for a type it does not take; -2 when K % 32 != 0. A packed matrix (type
// TM_PACKED | its ggml type) is multiplied by vnni_matmul.cpp's 16-bit kernel: x rounded as here, to 16 bits
// per 32-block (the same rounding, a different order of sums: not the same bits as the plain blocks).
int tm_block_matmul(int type, const void* W, int64_t N, int64_t K, const float* x, int64_t ldx, int64_t M,
                    float* y, int64_t ldy, int nthreads) {
    if (type & kPacked) return tm_vnni16_matmul(type, W, N, K, x, ldx, M, y, ldy, nthreads);
    if (K % 32) return -2;
    const auto* w = static_cast<const uint8_t*>(W);
    const int64_t zero = 0;
    return dispatch(type, &w, int64_t(1), &zero, &M, N, K, x, ldx, M, y, ldy, nthreads);
}

// A mixture of experts: rows [starts[g], starts[g] + counts[g]) of x (M, K) times W[g] (N, K), all of one
// type, into the same rows of y (M, N). Each group computes exactly what tm_block_matmul on its rows does.
int tm_block_matmul_grouped(int type, const void* const* W, int64_t groups, const int64_t* starts,
                            const int64_t* counts, int64_t N, int64_t K, const float* x, int64_t M, float* y,
                            int nthreads) {
    if (type & kPacked) {  // group by group, as tm_block_matmul on its rows
        for (int64_t g = 0; g < groups; ++g) {
            if (!counts[g]) continue;
            const int rc = tm_block_matmul(type, W[g], N, K, x + starts[g] * K, K, counts[g], y + starts[g] * N, N,
                                           nthreads);
            if (rc) return rc;
        }
        return 0;
    }
    if (K % 32) return -2;
    return dispatch(type, reinterpret_cast<const uint8_t* const*>(W), groups, starts, counts, N, K, x, K, M, y, N,
                    nthreads);
}

}  // extern "C"
