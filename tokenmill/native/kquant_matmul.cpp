// y = x . W^T for a GGUF matrix W kept in its file's K-quant blocks (Q4_K, Q5_K, Q6_K: a Q4_K_M or Q5_K_M file's),
// for a few rows of x at a time (one-stream decode of a 7B-class file, speculative verification). The same
// scheme as block_matmul.cpp's kernel for the 32-element types: x quantized to 16 bits per 32-block (scale
// amax / 32767, so the result is the weights' own to ~1e-5), integer dot products per sub-block, each weight
// block unpacked once for up to 8 rows, each weight row asked for ahead of use.
//
// Where ggml unpacks a block's nibbles into bytes in element order, this kernel leaves them where they lie:
// it reads 32 bytes of quants as 16 16-bit lanes and masks and shifts whole lanes, so each vector holds the
// even or the odd elements of a group of 32 (lane i: element 2i, or 2i + 1). x is quantized in that order
// (per 32-block: its 16 even elements, then its 16 odd ones), and an integer dot product does not care in
// which order it adds: the per-sub-block sums are exact, as if the elements were in place.
//
// Plain C++ (no torch, no ggml headers), built into block_matmul.py's library; block_matmul.cpp's
// tm_block_matmul and tm_block_matmul_grouped hand these types here.
//
// Blocks (ggml's layout, 256 elements each):
//   Q4_K (144 bytes): {f16 d; f16 dmin; u8 scales[12]; u8 qs[128]}. Sub-block j (32 elements) has a 6-bit
//     scale sc_j and min m_j packed in `scales`; element e of sub-block 2p (2p + 1) is the low (high) nibble
//     of qs[32p + e]; value = d * sc_j * q - dmin * m_j.
//   Q5_K (176 bytes): {f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}: Q4_K's, each quant 16 more
//     where bit 2p (low nibble) or 2p + 1 (high nibble) of qh[e] is set.
//   Q6_K (210 bytes): {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}. Half h (128 elements) reads ql[64h..],
//     qh[32h..]; its element 32g + l (g = 0..3, l = 0..31) is 4 bits of ql (byte l for g even, l + 32 for g
//     odd; low nibble for g < 2) and 2 bits of qh[l] (bits 2g, 2g + 1), minus 32; sub-block of 16 elements
//     s = 8h + 2g + l / 16 has the signed scale scales[s]; value = d * scales[s] * q.
//
// Invariant: y[m, n] depends only on x[m, :] and W[n, :] (each row's sums in one fixed order whatever M, the
// grouping of rows or the thread count), so a row gives the same bits alone or in any batch.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && !defined(TM_PORTABLE)
#include <immintrin.h>
#define TM_AVX2 1
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && !defined(TM_NO_AVX512)
#define TM_AVX512 1  // -DTM_NO_AVX512: the AVX2 code on an AVX-512 CPU (tests compare the two)
#endif
#endif

float tm_half_to_float(uint16_t h);  // block_matmul.cpp
void tm_quantize_rows16(const float* x, int64_t ldx, int64_t M, int64_t K, int64_t (*slot)(int64_t, int),
                        std::vector<int16_t>& q, std::vector<float>& d, std::vector<float>& s);  // block_matmul.cpp
void tm_run_items(int64_t items, int nthreads, const std::function<void(int64_t)>& item);  // block_matmul.cpp

namespace {

enum : int { kQ4_K = 12, kQ5_K = 13, kQ6_K = 14 };  // ggml's type numbers
constexpr bool has_mins(int type) { return type == kQ4_K || type == kQ5_K; }  // value = d * sc * q - dmin * m

template <int TYPE>
constexpr int64_t super_bytes() {
    return TYPE == kQ4_K ? 144 : TYPE == kQ5_K ? 176 : 210;
}

inline float f16_at(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return tm_half_to_float(v);
}

// Where element e (0-31) of x's 32-block j lands in the quantized row. 256-bit vectors take a block's 16 even
// elements, then its 16 odd ones; 512-bit vectors two blocks at once, so each pair of blocks (2q, 2q + 1)
// is laid out as block 2q's even elements, block 2q + 1's even ones, then both blocks' odd ones.
int64_t x_slot(int64_t j, int e) {
#ifdef TM_AVX512
    return 64 * (j / 2) + (e & 1) * 32 + (j % 2) * 16 + e / 2;
#else
    return 32 * j + (e & 1) * 16 + e / 2;
#endif
}

// x (M, K) -> q (M, K) int16 in x_slot's order (block_matmul.cpp's quantizer, 16 bits per 32-block); per (row,
// block) the scale d and s = d * sum(q) (the mins' term)
struct QuantX {
    std::vector<int16_t> q;
    std::vector<float> d, s;
};

void quantize_rows(const float* x, int64_t ldx, int64_t M, int64_t K, QuantX& out) {
    tm_quantize_rows16(x, ldx, M, K, x_slot, out.q, out.d, out.s);
}

// Q4_K / Q5_K's 8 scales and 8 mins (6 bits each) out of their 12 bytes, as four words of bytes: w[0..1] sc 0-7,
// w[2..3] m 0-7. Word operations: bytes 0-3 hold sc 0-3 in their low 6 bits and the top 2 bits of sc 4-7
// above; bytes 4-7 the same for the mins; bytes 8-11 the low 4 bits of sc 4-7 in their low nibbles, of m 4-7
// in the high ones.
inline void k4_scale_words(const uint8_t* p, uint32_t w[4]) {
    uint32_t u[3];
    std::memcpy(u, p, 12);
    const uint32_t b6 = 0x3f3f3f3fu, b4 = 0x0f0f0f0fu, b2 = 0x03030303u;
    w[0] = u[0] & b6;
    w[1] = (u[2] & b4) | (((u[0] >> 6) & b2) << 4);
    w[2] = u[1] & b6;
    w[3] = ((u[2] >> 4) & b4) | (((u[1] >> 6) & b2) << 4);
}

// The weights are read once, in order; each block asks for the lines kPrefetchAhead bytes further on (into
// the next rows at a row's end; a prefetch never faults, past the matrix included). Per block rather than
// per row (block_matmul.cpp's way), as a 7B model's rows are up to 15.5 KB: 7B shapes of random blocks
// (benchmarks/experiments/kquant_vs_ggml.py), 2 threads, AMX Xeon, one row: 17.3 GB/s asking per row 2 KiB
// ahead, 19.7-22.3 per block from 512 to 4096 bytes ahead (noisy: 1024-3072 alike).
constexpr int kPrefetchAhead = 2048;

template <int TYPE>
inline void prefetch_ahead(const uint8_t* blk) {
    for (int o = 0; o < super_bytes<TYPE>(); o += 64) __builtin_prefetch(blk + kPrefetchAhead + o, 0, 3);
}

#ifdef TM_AVX2
// block_matmul.cpp's lane sum, kept inline here: called across files it cost ~40% at one row (the call
// spills every vector register)
inline float hsum8(__m256 a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// Q4_K / Q5_K: sub-block j's weight scale d * sc_j (wsc) and min dmin * m_j (wmn) as 8 lanes each
inline void k4_weight_scales(const uint8_t* blk, __m256& wsc, __m256& wmn) {
    uint32_t w[4];
    k4_scale_words(blk + 4, w);
    wsc = _mm256_mul_ps(_mm256_set1_ps(f16_at(blk)),
                        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_setr_epi32(int(w[0]), int(w[1]), 0, 0))));
    wmn = _mm256_mul_ps(_mm256_set1_ps(f16_at(blk + 2)),
                        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_setr_epi32(int(w[2]), int(w[3]), 0, 0))));
}

// the 8 int32 lanes of a 32-element group's dot: w even / odd elements (16 int16 each) against x's
inline __m256i dot32(__m256i we, __m256i wo, const int16_t* xb) {
    const __m256i xe = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb));
    const __m256i xo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + 16));
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpwssd_epi32(_mm256_madd_epi16(we, xe), wo, xo);
#else
    return _mm256_add_epi32(_mm256_madd_epi16(we, xe), _mm256_madd_epi16(wo, xo));
#endif
}
#endif


#ifdef TM_AVX512
// the 16 int32 lanes of two 32-element groups' dots: w's even elements (32 int16: group a's 16, group b's 16)
// and odd ones against x's pair of blocks (x_slot's order)
inline __m512i dot64(__m512i we, __m512i wo, const int16_t* xp) {
    const __m512i xe = _mm512_loadu_si512(xp), xo = _mm512_loadu_si512(xp + 32);
#if defined(__AVX512VNNI__)
    return _mm512_dpwssd_epi32(_mm512_madd_epi16(we, xe), wo, xo);
#else
    return _mm512_add_epi32(_mm512_madd_epi16(we, xe), _mm512_madd_epi16(wo, xo));
#endif
}

inline __m512i lanes16(int a, int b) {  // 16-bit lanes 0-15 = a, 16-31 = b (shift counts per 256-bit half)
    return _mm512_inserti64x4(_mm512_set1_epi16(short(a)), _mm256_set1_epi16(short(b)), 1);
}

inline __m512i idx4(int a, int b, int c, int d) {  // 32-bit lanes: a x4, b x4, c x4, d x4
    return _mm512_setr_epi32(a, a, a, a, b, b, b, b, c, c, c, c, d, d, d, d);
}

// dot_rows on 512-bit vectors: the same sums per sub-block as the AVX2 code, in other lanes
template <int TYPE, int R>
inline void dot_rows_512(const uint8_t* wrow, int64_t nsb, const int16_t* xq, const float* xd, const float* xs,
                         int64_t K, float* y, int64_t ldy) {
    const int64_t nb = K / 32;
    __m512 acc[R];
    __m256 off[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps(), off[r] = _mm256_setzero_ps();
    const __m512i lo4 = _mm512_set1_epi16(0x000f), hi2 = _mm512_set1_epi16(0x0030), m32 = _mm512_set1_epi16(32);
    for (int64_t i = 0; i < nsb; ++i) {
        const uint8_t* blk = wrow + i * super_bytes<TYPE>();
        prefetch_ahead<TYPE>(blk);
        if constexpr (has_mins(TYPE)) {
            __m256 wsc, wmn;
            k4_weight_scales(blk, wsc, wmn);
            __m512 scale[R];  // lanes 0-7: row r's d * sc_j * x's scale for sub-block j (8-15 unused)
            for (int r = 0; r < R; ++r) {
                scale[r] = _mm512_castps256_ps512(_mm256_mul_ps(wsc, _mm256_loadu_ps(xd + r * nb + 8 * i)));
                off[r] = _mm256_fmadd_ps(wmn, _mm256_loadu_ps(xs + r * nb + 8 * i), off[r]);
            }
            constexpr int kQs = TYPE == kQ5_K ? 48 : 16;  // Q5_K: qh[32] before the quants
            // Q5_K's fifth bits: qh's 32 bytes in both halves, shifted right by 2p for pair p (bits 2p, 2p + 1
            // of each byte: sub-blocks 2p, 2p + 1)
            __m512i hcur = TYPE == kQ5_K ? _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16)))
                                         : _mm512_setzero_si512();
            const __m512i bit4 = _mm512_set1_epi16(0x0010);
            for (int p = 0; p < 4; ++p) {
                // the pair's 32 bytes in both halves; lanes 0-15 take the low nibbles (sub-block 2p), 16-31 the
                // high ones (sub-block 2p + 1): even elements from each lane's low byte, odd from its high byte
                const __m512i raw = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + kQs + 32 * p)));
                __m512i we = _mm512_and_si512(_mm512_srlv_epi16(raw, lanes16(0, 4)), lo4);
                __m512i wo = _mm512_and_si512(_mm512_srlv_epi16(raw, lanes16(8, 12)), lo4);
                if constexpr (TYPE == kQ5_K) {  // + 16 where the element's bit is set: low byte bit 0 / 1, high byte's
                    we = _mm512_or_si512(we, _mm512_and_si512(_mm512_sllv_epi16(hcur, lanes16(4, 3)), bit4));
                    wo = _mm512_or_si512(wo, _mm512_and_si512(_mm512_srlv_epi16(hcur, lanes16(4, 5)), bit4));
                    hcur = _mm512_srli_epi16(hcur, 2);
                }
                const __m512i sel = _mm512_setr_epi32(2 * p, 2 * p, 2 * p, 2 * p, 2 * p, 2 * p, 2 * p, 2 * p,
                                                      2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1,
                                                      2 * p + 1, 2 * p + 1);
                for (int r = 0; r < R; ++r)
                    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot64(we, wo, xq + r * K + 256 * i + 64 * p)),
                                             _mm512_permutexvar_ps(sel, scale[r]), acc[r]);
            }
        } else {  // Q6_K
            const uint8_t *ql = blk, *qh = blk + 128;
            const float d = f16_at(blk + 208);
            // d times the 16 signed scales, lane s: sub-block s (16 elements, in x's 32-block s / 2)
            const __m512 ws = _mm512_mul_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                                                   _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192)))));
            __m512 scale[R];  // row r: ws times x's scale of each sub-block's 32-block
            const __m512i half = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
            for (int r = 0; r < R; ++r)
                scale[r] = _mm512_mul_ps(ws, _mm512_permutexvar_ps(half, _mm512_castps256_ps512(
                                                                            _mm256_loadu_ps(xd + r * nb + 8 * i))));
            for (int h = 0; h < 2; ++h) {
                // lanes 0-15: ql bytes 0-31 of the half (groups 0 and 2), 16-31: bytes 32-63 (groups 1 and 3);
                // qh's 32 bytes in both halves, shifted per half to bring group g's two bits to bits 4-5
                const __m512i l = _mm512_loadu_si512(ql + 64 * h);
                const __m512i hb = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh + 32 * h)));
                const __m512i e01 = _mm512_sub_epi16(_mm512_or_si512(_mm512_and_si512(l, lo4),
                    _mm512_and_si512(_mm512_sllv_epi16(hb, lanes16(4, 2)), hi2)), m32);
                const __m512i o01 = _mm512_sub_epi16(_mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 8), lo4),
                    _mm512_and_si512(_mm512_srlv_epi16(hb, lanes16(4, 6)), hi2)), m32);
                const __m512i e23 = _mm512_sub_epi16(_mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), lo4),
                    _mm512_and_si512(_mm512_srlv_epi16(hb, lanes16(0, 2)), hi2)), m32);
                const __m512i o23 = _mm512_sub_epi16(_mm512_or_si512(_mm512_srli_epi16(l, 12),
                    _mm512_and_si512(_mm512_srlv_epi16(hb, lanes16(8, 10)), hi2)), m32);
                // int32 lanes 0-3, 4-7: group g's two sub-blocks, 8-15: group g + 1's (g = 0, then 2)
                const int s0 = 8 * h;
                for (int r = 0; r < R; ++r) {
                    const int16_t* xp = xq + r * K + 256 * i + 128 * h;
                    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot64(e01, o01, xp)),
                                             _mm512_permutexvar_ps(idx4(s0, s0 + 1, s0 + 2, s0 + 3), scale[r]), acc[r]);
                    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot64(e23, o23, xp + 64)),
                                             _mm512_permutexvar_ps(idx4(s0 + 4, s0 + 5, s0 + 6, s0 + 7), scale[r]), acc[r]);
                }
            }
        }
    }
    for (int r = 0; r < R; ++r) {
        const __m512 a = acc[r];
        const float v = hsum8(_mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1)));
        y[r * ldy] = v - (has_mins(TYPE) ? hsum8(off[r]) : 0.0f);
    }
}
#endif

// rows [0, R) of the quantized x (row stride K; scales xd, xs with row stride nb) against weight row wrow
// -> y[r * ldy]
template <int TYPE, int R>
inline void dot_rows(const uint8_t* wrow, int64_t nsb, const int16_t* xq, const float* xd, const float* xs,
                     int64_t K, float* y, int64_t ldy) {
    const int64_t nb = K / 32;
#if defined(TM_AVX512)
    (void)nb;
    dot_rows_512<TYPE, R>(wrow, nsb, xq, xd, xs, K, y, ldy);
#elif defined(TM_AVX2)
    __m256 acc[R], off[R];
    for (int r = 0; r < R; ++r) acc[r] = off[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nsb; ++i) {
        const uint8_t* blk = wrow + i * super_bytes<TYPE>();
        prefetch_ahead<TYPE>(blk);
        if constexpr (has_mins(TYPE)) {
            __m256 wsc, wmn;
            k4_weight_scales(blk, wsc, wmn);
            alignas(32) float scale[R][8];  // row r, sub-block j: d * sc_j * x's scale of that block
            for (int r = 0; r < R; ++r) {
                const float* xdr = xd + r * nb + 8 * i;
                _mm256_store_ps(scale[r], _mm256_mul_ps(wsc, _mm256_loadu_ps(xdr)));
                off[r] = _mm256_fmadd_ps(wmn, _mm256_loadu_ps(xs + r * nb + 8 * i), off[r]);
            }
            const __m256i lo4 = _mm256_set1_epi16(0x000f), bit4 = _mm256_set1_epi16(0x0010);
            constexpr int kQs = TYPE == kQ5_K ? 48 : 16;  // Q5_K: qh[32] before the quants
            // Q5_K's fifth bits (qh byte l, bit 2p / 2p + 1: element l of sub-block 2p / 2p + 1), shifted right
            // by 2p for pair p
            __m256i hcur = TYPE == kQ5_K ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16))
                                         : _mm256_setzero_si256();
            for (int p = 0; p < 4; ++p) {
                const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + kQs + 32 * p));
                // lane i holds bytes 2i, 2i + 1: their low nibbles are sub-block 2p's elements 2i, 2i + 1,
                // their high nibbles sub-block 2p + 1's
                __m256i a = _mm256_and_si256(raw, lo4), b = _mm256_and_si256(_mm256_srli_epi16(raw, 8), lo4);
                __m256i c = _mm256_and_si256(_mm256_srli_epi16(raw, 4), lo4), e = _mm256_srli_epi16(raw, 12);
                if constexpr (TYPE == kQ5_K) {  // + 16 where the element's bit is set
                    a = _mm256_or_si256(a, _mm256_and_si256(_mm256_slli_epi16(hcur, 4), bit4));
                    b = _mm256_or_si256(b, _mm256_and_si256(_mm256_srli_epi16(hcur, 4), bit4));
                    c = _mm256_or_si256(c, _mm256_and_si256(_mm256_slli_epi16(hcur, 3), bit4));
                    e = _mm256_or_si256(e, _mm256_and_si256(_mm256_srli_epi16(hcur, 5), bit4));
                    hcur = _mm256_srli_epi16(hcur, 2);
                }
                for (int r = 0; r < R; ++r) {
                    const int16_t* xb = xq + r * K + 256 * i + 64 * p;
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot32(a, b, xb)),
                                             _mm256_broadcast_ss(&scale[r][2 * p]), acc[r]);
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot32(c, e, xb + 32)),
                                             _mm256_broadcast_ss(&scale[r][2 * p + 1]), acc[r]);
                }
            }
        } else {  // Q6_K
            const uint8_t *ql = blk, *qh = blk + 128;
            const float d = f16_at(blk + 208);
            // the 16 signed scales as floats times d: lanes 0-7 (sub-blocks 0-7), 8-15
            const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192));
            const __m256 ws0 = _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc8)));
            const __m256 ws1 = _mm256_mul_ps(_mm256_set1_ps(d),
                                             _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc8, 8))));
            const __m256i lo4 = _mm256_set1_epi16(0x000f), hi2 = _mm256_set1_epi16(0x0030),
                          m32 = _mm256_set1_epi16(32);
            for (int h = 0; h < 2; ++h) {
                const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 64 * h));
                const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 64 * h + 32));
                const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh + 32 * h));
                // group g: the even elements (lane i: element 2i) and the odd ones, 6 bits, minus 32
                __m256i we[4], wo[4];
                we[0] = _mm256_or_si256(_mm256_and_si256(l0, lo4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), hi2));
                wo[0] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 8), lo4),
                                        _mm256_and_si256(_mm256_srli_epi16(hb, 4), hi2));
                we[1] = _mm256_or_si256(_mm256_and_si256(l1, lo4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), hi2));
                wo[1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 8), lo4),
                                        _mm256_and_si256(_mm256_srli_epi16(hb, 6), hi2));
                we[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), lo4), _mm256_and_si256(hb, hi2));
                wo[2] = _mm256_or_si256(_mm256_srli_epi16(l0, 12), _mm256_and_si256(_mm256_srli_epi16(hb, 8), hi2));
                we[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), lo4),
                                        _mm256_and_si256(_mm256_srli_epi16(hb, 2), hi2));
                wo[3] = _mm256_or_si256(_mm256_srli_epi16(l1, 12), _mm256_and_si256(_mm256_srli_epi16(hb, 10), hi2));
                const __m256 ws = h == 0 ? ws0 : ws1;
                for (int g = 0; g < 4; ++g) {
                    we[g] = _mm256_sub_epi16(we[g], m32);
                    wo[g] = _mm256_sub_epi16(wo[g], m32);
                    // int32 lanes 0-3 are sub-block 2g's (elements 0-15), 4-7 sub-block 2g + 1's
                    const __m256 wsg = _mm256_permutevar8x32_ps(
                        ws, _mm256_setr_epi32(2 * g, 2 * g, 2 * g, 2 * g, 2 * g + 1, 2 * g + 1, 2 * g + 1, 2 * g + 1));
                    for (int r = 0; r < R; ++r) {
                        const int64_t xb = 8 * i + 4 * h + g;  // x's 32-block
                        const __m256 s = _mm256_mul_ps(wsg, _mm256_broadcast_ss(xd + r * nb + xb));
                        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot32(we[g], wo[g], xq + r * K + 32 * xb)), s,
                                                 acc[r]);
                    }
                }
            }
        }
    }
    for (int r = 0; r < R; ++r) y[r * ldy] = hsum8(acc[r]) - (has_mins(TYPE) ? hsum8(off[r]) : 0.0f);
#else
    for (int r = 0; r < R; ++r) {
        float acc = 0.0f, off = 0.0f;
        const int16_t* xr = xq + r * K;
        for (int64_t i = 0; i < nsb; ++i) {
            const uint8_t* blk = wrow + i * super_bytes<TYPE>();
            int q[256];  // the block's quants in element order
            float ws[16];  // per 16 elements: the weight scale
            float mins[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            if constexpr (has_mins(TYPE)) {
                const float d = f16_at(blk), dmin = f16_at(blk + 2);
                uint32_t words[4];
                k4_scale_words(blk + 4, words);
                uint8_t sc[8], mn[8];
                std::memcpy(sc, words, 8);
                std::memcpy(mn, words + 2, 8);
                const uint8_t* qs = blk + (TYPE == kQ5_K ? 48 : 16);
                for (int p = 0; p < 4; ++p)
                    for (int e = 0; e < 32; ++e) {
                        const int h = TYPE == kQ5_K ? blk[16 + e] >> (2 * p) : 0;  // Q5_K: qh bits 2p, 2p + 1
                        q[64 * p + e] = (qs[32 * p + e] & 0x0f) | ((h & 1) << 4);
                        q[64 * p + 32 + e] = (qs[32 * p + e] >> 4) | ((h & 2) << 3);
                    }
                for (int j = 0; j < 8; ++j) {
                    ws[2 * j] = ws[2 * j + 1] = d * float(sc[j]);
                    mins[j] = dmin * float(mn[j]);
                }
            } else {
                const uint8_t *ql = blk, *qh = blk + 128;
                const float d = f16_at(blk + 208);
                for (int h = 0; h < 2; ++h)
                    for (int l = 0; l < 32; ++l) {
                        const uint8_t a = ql[64 * h + l], b = ql[64 * h + 32 + l], hb = qh[32 * h + l];
                        q[128 * h + l] = ((a & 0x0f) | ((hb & 3) << 4)) - 32;
                        q[128 * h + 32 + l] = ((b & 0x0f) | (((hb >> 2) & 3) << 4)) - 32;
                        q[128 * h + 64 + l] = ((a >> 4) | (((hb >> 4) & 3) << 4)) - 32;
                        q[128 * h + 96 + l] = ((b >> 4) | (((hb >> 6) & 3) << 4)) - 32;
                    }
                for (int s = 0; s < 16; ++s) ws[s] = d * float(int8_t(blk[192 + s]));
            }
            for (int j = 0; j < 8; ++j) {  // x's 32-block 8i + j
                int sum0 = 0, sum1 = 0;  // elements 0-15 and 16-31
                for (int e = 0; e < 32; ++e) {
                    const int v = q[32 * j + e] * xr[x_slot(8 * i + j, e)];
                    (e < 16 ? sum0 : sum1) += v;
                }
                const float xs_d = xd[r * nb + 8 * i + j];
                acc += (ws[2 * j] * float(sum0) + ws[2 * j + 1] * float(sum1)) * xs_d;
                if constexpr (has_mins(TYPE)) off += mins[j] * xs[r * nb + 8 * i + j];
            }
        }
        y[r * ldy] = acc - off;
    }
#endif
}

template <int TYPE>
void rows_block(const uint8_t* W, int64_t n0, int64_t n1, int64_t K, const int16_t* xq, const float* xd,
                const float* xs, int64_t M, float* y, int64_t ldy) {
    const int64_t nsb = K / 256, nb = K / 32, row_bytes = nsb * super_bytes<TYPE>();
    for (int64_t n = n0; n < n1; ++n) {
        const uint8_t* wrow = W + n * row_bytes;
        for (int64_t r = 0; r < M; r += 8) {
            const int16_t* xr = xq + r * K;
            const float *dr = xd + r * nb, *sr = xs + r * nb;
            float* yr = y + r * ldy + n;
            switch (M - r < 8 ? M - r : 8) {
                case 8: dot_rows<TYPE, 8>(wrow, nsb, xr, dr, sr, K, yr, ldy); break;
                case 7: dot_rows<TYPE, 7>(wrow, nsb, xr, dr, sr, K, yr, ldy); break;
                case 6: dot_rows<TYPE, 6>(wrow, nsb, xr, dr, sr, K, yr, ldy); break;
                case 5: dot_rows<TYPE, 5>(wrow, nsb, xr, dr, sr, K, yr, ldy); break;
                case 4: dot_rows<TYPE, 4>(wrow, nsb, xr, dr, sr, K, yr, ldy); break;
                case 3: dot_rows<TYPE, 3>(wrow, nsb, xr, dr, sr, K, yr, ldy); break;
                case 2: dot_rows<TYPE, 2>(wrow, nsb, xr, dr, sr, K, yr, ldy); break;
                default: dot_rows<TYPE, 1>(wrow, nsb, xr, dr, sr, K, yr, ldy); break;
            }
        }
    }
}

template <int TYPE>
void kquant_matmul(const uint8_t* const* W, int64_t groups, const int64_t* starts, const int64_t* counts, int64_t N,
                   int64_t K, const float* x, int64_t ldx, int64_t M, float* y, int64_t ldy, int nthreads) {
    const int64_t nb = K / 32;
    thread_local QuantX qx;
    quantize_rows(x, ldx, M, K, qx);
    const int16_t* xq = qx.q.data();
    const float *xd = qx.d.data(), *xs = qx.s.data();
    const int64_t chunks = (N + 15) / 16, items = groups * chunks;
    auto item = [&](int64_t it) {
        const int64_t g = it / chunks, c = it % chunks, r0 = starts[g], m = counts[g];
        if (m <= 0) return;
        rows_block<TYPE>(W[g], 16 * c, std::min<int64_t>(N, 16 * c + 16), K, xq + r0 * K, xd + r0 * nb,
                         xs + r0 * nb, m, y + r0 * ldy, ldy);
    };
    tm_run_items(items, nthreads, item);
}

}  // namespace

// block_matmul.cpp's entry for the K-quants (hidden: not part of the library's ABI). Returns 0; -1 for a type
// it does not take; -2 when K % 256 != 0.
__attribute__((visibility("hidden"))) int tm_kquant_matmul(int type, const uint8_t* const* W, int64_t groups,
                                                           const int64_t* starts, const int64_t* counts, int64_t N,
                                                           int64_t K, const float* x, int64_t ldx, int64_t M,
                                                           float* y, int64_t ldy, int nthreads) {
    if (K % 256) return -2;
    switch (type) {
        case kQ4_K: kquant_matmul<kQ4_K>(W, groups, starts, counts, N, K, x, ldx, M, y, ldy, nthreads); return 0;
        case kQ5_K: kquant_matmul<kQ5_K>(W, groups, starts, counts, N, K, x, ldx, M, y, ldy, nthreads); return 0;
        case kQ6_K: kquant_matmul<kQ6_K>(W, groups, starts, counts, N, K, x, ldx, M, y, ldy, nthreads); return 0;
        default: return -1;
    }
}

__attribute__((visibility("hidden"))) bool tm_kquant_supports(int type) {
    return type == kQ4_K || type == kQ5_K || type == kQ6_K;
}
