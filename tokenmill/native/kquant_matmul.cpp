// y = x . W^T for a GGUF matrix W kept in its file's K-quant blocks (Q4_K, Q5_K, Q6_K: a Q4_K_M or Q5_K_M file's),
// for a few rows of x at a time (one-stream decode of a 7B-class file, speculative verification). The scheme
// of block_matmul.cpp's kernel for the 32-element types: x quantized to 15-16 bits (kXMax, kXGroup: the result
// is the weights' own to ~2e-5 - 6e-5), integer dot products, each weight block unpacked once for up to 8 rows
// of x, each weight row asked for ahead of use.
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
void tm_quantize_rows16(const float* x, int64_t ldx, int64_t M, int64_t K, int64_t group, float qmax, int layout,
                        std::vector<int16_t>& q, std::vector<float>& d, std::vector<float>& s);  // block_matmul.cpp
void tm_run_items(int64_t items, int nthreads, const std::function<void(int64_t)>& item);  // block_matmul.cpp
int64_t tm_x_slot(int layout, int64_t b, int e);  // block_matmul.cpp: where x's element e of 32-block b lands

namespace {

enum : int { kQ4_K = 12, kQ5_K = 13, kQ6_K = 14 };  // ggml's type numbers
constexpr bool has_mins(int type) { return type == kQ4_K || type == kQ5_K; }  // value = d * sc * q - dmin * m

template <int TYPE>
constexpr int64_t super_bytes() {
    return TYPE == kQ4_K ? 144 : TYPE == kQ5_K ? 176 : 210;
}

// inline (F16C) where there is AVX2: a call to block_matmul.cpp's converter, twice a Q4_K super-block, spilled
// the loop's vector registers (the ABI saves none across a call): 2-3% of a 7B decode step's samples
inline float f16_at(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
#ifdef TM_AVX2
    return _cvtsh_ss(v);
#else
    return tm_half_to_float(v);
#endif
}

// How block_matmul.cpp's quantizer lays x out for these vectors (tm_x_slot says where each element lands):
// 256-bit vectors take a block's 16 even elements, then its 16 odd ones (layout 1); 512-bit vectors two blocks
// at once, so each pair of blocks (2q, 2q + 1) is laid out as block 2q's even elements, block 2q + 1's even
// ones, then both blocks' odd ones (layout 2)
#ifdef TM_AVX512
constexpr int kXLayout = 2;
#else
constexpr int kXLayout = 1;
#endif

// x's quantization. Q5_K and Q6_K: one scale per super-block of 256 values, so that a super-block's products
// are summed in integers, the sub-blocks' scales applied to the weights (sc * q as 16-bit lanes), and converted
// to float once per row instead of once per sub-block: at 2-16 rows 1.1-1.4x the per-sub-block kernel over 7B
// shapes (benchmarks/experiments/kquant_ab.py), the same at one row. The largest |q| keeps every int32 lane
// exact: a super-block puts 32 products into each AVX2 lane (16 into each 512-bit one), |sc * q| <= 63 * 31
// (Q5_K) or 128 * 32 (Q6_K), and 32 * 63 * 31 * 32767 and 32 * 128 * 32 * 16383 stay under 2^31. x's rounding
// error is then ~3e-5 / ~6e-5 of a dot product (ggml's 8-bit activations per 256: ~5e-3). Q4_K keeps a scale
// per 32 values (~2e-5) and its sums per sub-block in fp32: the integer form cost 5-10% at one row there (its
// 144-byte super-blocks leave the least time per byte), and one row is a 7B file's decode.
template <int TYPE>
constexpr float kXMax = TYPE == kQ6_K ? 16383.0f : 32767.0f;
template <int TYPE>
constexpr int64_t kXGroup = TYPE == kQ4_K ? 32 : 256;

// x (M, K) -> q (M, K) int16 in tm_x_slot's order (block_matmul.cpp's quantizer); per (row, kXGroup values) the
// scale d, per (row, 32-block) s = d * sum(q) (the mins' term)
struct QuantX {
    std::vector<int16_t> q;
    std::vector<float> d, s;
};

template <int TYPE>
void quantize_rows(const float* x, int64_t ldx, int64_t M, int64_t K, QuantX& out) {
    tm_quantize_rows16(x, ldx, M, K, kXGroup<TYPE>, kXMax<TYPE>, kXLayout, out.q, out.d, out.s);
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

// Q4_K / Q5_K: the 8 mins times dmin, lane j: sub-block j's (the offset terms: value = d * sc_j * q - dmin * m_j)
inline __m256 k4_weight_mins(const uint8_t* blk, const uint32_t w[4]) {
    return _mm256_mul_ps(_mm256_set1_ps(f16_at(blk + 2)),
                         _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_setr_epi32(int(w[2]), int(w[3]), 0, 0))));
}

// Q4_K: sub-block j's weight scale d * sc_j (wsc) and min dmin * m_j (wmn) as 8 lanes each
inline void k4_weight_scales(const uint8_t* blk, const uint32_t w[4], __m256& wsc, __m256& wmn) {
    wsc = _mm256_mul_ps(_mm256_set1_ps(f16_at(blk)),
                        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_setr_epi32(int(w[0]), int(w[1]), 0, 0))));
    wmn = k4_weight_mins(blk, w);
}

// Q6_K's scale picks, byte-shuffle indices: 128-bit lane k takes scale k into each 16-bit lane's low byte
// (kPickEven) or high byte (kPickOdd), zero in the other (an index with its top bit set picks zero; adding the
// sub-block's first scale keeps that bit). The 256-bit loop reads lanes 0-1, the 512-bit one all four.
alignas(64) constexpr int8_t kPickEven[64] = {
    0, -128, 0, -128, 0, -128, 0, -128, 0, -128, 0, -128, 0, -128, 0, -128,
    1, -127, 1, -127, 1, -127, 1, -127, 1, -127, 1, -127, 1, -127, 1, -127,
    2, -126, 2, -126, 2, -126, 2, -126, 2, -126, 2, -126, 2, -126, 2, -126,
    3, -125, 3, -125, 3, -125, 3, -125, 3, -125, 3, -125, 3, -125, 3, -125,
};
alignas(64) constexpr int8_t kPickOdd[64] = {
    -128, 0, -128, 0, -128, 0, -128, 0, -128, 0, -128, 0, -128, 0, -128, 0,
    -127, 1, -127, 1, -127, 1, -127, 1, -127, 1, -127, 1, -127, 1, -127, 1,
    -126, 2, -126, 2, -126, 2, -126, 2, -126, 2, -126, 2, -126, 2, -126, 2,
    -125, 3, -125, 3, -125, 3, -125, 3, -125, 3, -125, 3, -125, 3, -125, 3,
};

// acc + the 8 int32 lanes of a 32-element group's dot: w even / odd elements (16 int16 each) against x's
inline __m256i dot32(__m256i acc, __m256i we, __m256i wo, const int16_t* xb) {
    const __m256i xe = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb));
    const __m256i xo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + 16));
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpwssd_epi32(_mm256_dpwssd_epi32(acc, we, xe), wo, xo);
#else
    return _mm256_add_epi32(acc, _mm256_add_epi32(_mm256_madd_epi16(we, xe), _mm256_madd_epi16(wo, xo)));
#endif
}
#endif

#ifdef TM_AVX512
// acc + the 16 int32 lanes of two 32-element groups' dots: w's even elements (32 int16: group a's 16, group b's
// 16) and odd ones against x's pair of blocks (tm_x_slot's order)
inline __m512i dot64(__m512i acc, __m512i we, __m512i wo, const int16_t* xp) {
    const __m512i xe = _mm512_loadu_si512(xp), xo = _mm512_loadu_si512(xp + 32);
#if defined(__AVX512VNNI__)
    return _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(acc, we, xe), wo, xo);
#else
    return _mm512_add_epi32(acc, _mm512_add_epi32(_mm512_madd_epi16(we, xe), _mm512_madd_epi16(wo, xo)));
#endif
}

inline __m512i lanes16(int a, int b) {  // 16-bit lanes 0-15 = a, 16-31 = b (shift counts, table indices)
    return _mm512_inserti64x4(_mm512_set1_epi16(short(a)), _mm256_set1_epi16(short(b)), 1);
}

// dot_rows on 512-bit vectors: the same integer sums per super-block as the AVX2 code, in other lanes
template <int TYPE, int R>
inline void dot_rows_512(const uint8_t* wrow, int64_t nsb, const int16_t* xq, const float* xd, const float* xs,
                         int64_t K, float* y, int64_t ldy) {
    const int64_t nb = K / 32, nx = K / kXGroup<TYPE>;
    __m512 acc[R];
    __m256 off[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps(), off[r] = _mm256_setzero_ps();
    const __m512i lo4 = _mm512_set1_epi16(0x000f);
    for (int64_t i = 0; i < nsb; ++i) {
        const uint8_t* blk = wrow + i * super_bytes<TYPE>();
        prefetch_ahead<TYPE>(blk);
        __m512i isum[R];  // row r: the super-block's sum of sc * q * x (int32 lanes, exact; see kXMax)
        for (int r = 0; r < R; ++r) isum[r] = _mm512_setzero_si512();
        float d = 0.0f;
        if constexpr (TYPE == kQ4_K) {  // x's scale per 32 values: each sub-block's sum scaled in fp32
            uint32_t w[4];
            k4_scale_words(blk + 4, w);
            __m256 wsc, wmn;
            k4_weight_scales(blk, w, wsc, wmn);
            __m512 scale[R];  // lanes 0-7: row r's d * sc_j * x's scale for sub-block j (8-15 unused)
            for (int r = 0; r < R; ++r) {
                scale[r] = _mm512_castps256_ps512(_mm256_mul_ps(wsc, _mm256_loadu_ps(xd + r * nx + 8 * i)));
                off[r] = _mm256_fmadd_ps(wmn, _mm256_loadu_ps(xs + r * nb + 8 * i), off[r]);
            }
            for (int p = 0; p < 4; ++p) {
                // the pair's 32 bytes in both halves; lanes 0-15 take the low nibbles (sub-block 2p), 16-31 the
                // high ones (sub-block 2p + 1): even elements from each lane's low byte, odd from its high byte
                const __m512i raw = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 + 32 * p)));
                const __m512i we = _mm512_and_si512(_mm512_srlv_epi16(raw, lanes16(0, 4)), lo4);
                const __m512i wo = _mm512_and_si512(_mm512_srlv_epi16(raw, lanes16(8, 12)), lo4);
                const __m512i sel = _mm512_setr_epi32(2 * p, 2 * p, 2 * p, 2 * p, 2 * p, 2 * p, 2 * p, 2 * p,
                                                      2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1,
                                                      2 * p + 1, 2 * p + 1);
                for (int r = 0; r < R; ++r)
                    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot64(_mm512_setzero_si512(), we, wo, xq + r * K + 256 * i + 64 * p)),
                                             _mm512_permutexvar_ps(sel, scale[r]), acc[r]);
            }
        } else if constexpr (has_mins(TYPE)) {  // Q5_K
            d = f16_at(blk);
            uint32_t w[4];
            k4_scale_words(blk + 4, w);
            const __m256 wmn = k4_weight_mins(blk, w);
            for (int r = 0; r < R; ++r) off[r] = _mm256_fmadd_ps(wmn, _mm256_loadu_ps(xs + r * nb + 8 * i), off[r]);
            // the 8 scales as 16-bit lanes 0-7, i.e. bytes (sc_j, 0), and as bytes (0, sc_j): the tables each pair's
            // multipliers are picked from
            const __m512i sc16 = _mm512_zextsi128_si512(_mm_cvtepu8_epi16(_mm_setr_epi32(int(w[0]), int(w[1]), 0, 0)));
            const __m512i sc16h = _mm512_slli_epi16(sc16, 8);
            // the fifth bits: qh's 32 bytes (before the quants) in both halves, shifted right by 2p for pair p (bits
            // 2p, 2p + 1 of each byte: sub-blocks 2p, 2p + 1)
            __m512i hcur = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16)));
            const __m512i nib = _mm512_set1_epi16(0x0f0f), bit4 = _mm512_set1_epi16(0x1010);
            for (int p = 0; p < 4; ++p) {
                // the pair's 32 bytes in both halves; lanes 0-15 take the low nibbles (sub-block 2p), 16-31 the
                // high ones (sub-block 2p + 1), each byte its own element's (even elements in the low bytes)
                const __m512i raw = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 48 + 32 * p)));
                // + 16 where the element's bit is set (bit 0 / 1 of its qh byte)
                const __m512i q = _mm512_or_si512(_mm512_and_si512(_mm512_srlv_epi16(raw, lanes16(0, 4)), nib),
                                                  _mm512_and_si512(_mm512_sllv_epi16(hcur, lanes16(4, 3)), bit4));
                hcur = _mm512_srli_epi16(hcur, 2);
                // the even and the odd elements times their sub-block's 6-bit scale, as 16-bit lanes (an unsigned
                // times a signed byte pair, one byte of the pair zero: q * sc <= 31 * 63)
                const __m512i idx = lanes16(2 * p, 2 * p + 1);
                const __m512i we = _mm512_maddubs_epi16(q, _mm512_permutexvar_epi16(idx, sc16));
                const __m512i wo = _mm512_maddubs_epi16(q, _mm512_permutexvar_epi16(idx, sc16h));
                for (int r = 0; r < R; ++r) isum[r] = dot64(isum[r], we, wo, xq + r * K + 256 * i + 64 * p);
            }
        } else {  // Q6_K
            const uint8_t *ql = blk, *qh = blk + 128;
            d = f16_at(blk + 208);
            // the 16 signed scales in each 128-bit lane (a byte shuffle picks within its lane)
            const __m512i sc8 = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192)));
            const __m512i nib = _mm512_set1_epi8(0x0f), top2 = _mm512_set1_epi8(0x30), b32 = _mm512_set1_epi8(32);
            const __m512i pe = _mm512_load_si512(kPickEven), po = _mm512_load_si512(kPickOdd);
            for (int h = 0; h < 2; ++h) {
                // bytes 0-31: ql bytes 0-31 of the half (groups 0 and 2), 32-63: bytes 32-63 (groups 1 and 3); qh's 32
                // bytes in both halves, shifted per half to bring group g's two bits to bits 4-5
                const __m512i l = _mm512_loadu_si512(ql + 64 * h);
                const __m512i hb = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh + 32 * h)));
                // groups 0 | 1 and 2 | 3 as bytes in element order, 6 bits (0-63); the 16-bit shifts' spill into the
                // next byte is masked
                const __m512i q01 = _mm512_or_si512(_mm512_and_si512(l, nib),
                                                    _mm512_and_si512(_mm512_sllv_epi16(hb, lanes16(4, 2)), top2));
                const __m512i q23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), nib),
                                                    _mm512_and_si512(_mm512_srlv_epi16(hb, lanes16(0, 2)), top2));
                // groups 0, 1 are sub-blocks 8h .. 8h + 3 (8 lanes each), groups 2, 3 the next 4: each scale as the
                // byte pair (sc, 0) / (0, sc); an unsigned quant times it gives q * sc (|.| <= 63 * 128, no
                // saturation), and 32 * sc taken off gives (q - 32) * sc, |.| <= 32 * 128 (the integers a multiply gives)
                const __m512i s01 = _mm512_set1_epi8(char(8 * h)), s23 = _mm512_set1_epi8(char(8 * h + 4));
                const __m512i ce01 = _mm512_shuffle_epi8(sc8, _mm512_add_epi8(pe, s01));
                const __m512i co01 = _mm512_shuffle_epi8(sc8, _mm512_add_epi8(po, s01));
                const __m512i ce23 = _mm512_shuffle_epi8(sc8, _mm512_add_epi8(pe, s23));
                const __m512i co23 = _mm512_shuffle_epi8(sc8, _mm512_add_epi8(po, s23));
                const __m512i off01 = _mm512_maddubs_epi16(b32, ce01), off23 = _mm512_maddubs_epi16(b32, ce23);
                const __m512i e01 = _mm512_sub_epi16(_mm512_maddubs_epi16(q01, ce01), off01);
                const __m512i o01 = _mm512_sub_epi16(_mm512_maddubs_epi16(q01, co01), off01);
                const __m512i e23 = _mm512_sub_epi16(_mm512_maddubs_epi16(q23, ce23), off23);
                const __m512i o23 = _mm512_sub_epi16(_mm512_maddubs_epi16(q23, co23), off23);
                for (int r = 0; r < R; ++r) {
                    const int16_t* xp = xq + r * K + 256 * i + 128 * h;
                    isum[r] = dot64(dot64(isum[r], e01, o01, xp), e23, o23, xp + 64);
                }
            }
        }
        // the super-block's weight scale d times x's scale for its 256 values
        if constexpr (TYPE != kQ4_K)
            for (int r = 0; r < R; ++r)
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r]), _mm512_set1_ps(d * xd[r * nx + i]), acc[r]);
    }
    for (int r = 0; r < R; ++r) {
        const __m512 a = acc[r];
        y[r * ldy] = hsum8(_mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1))) - hsum8(off[r]);
    }
}
#endif

// rows [0, R) of the quantized x (row stride K; scales xd, row stride K / kXGroup; offsets xs per 32-block,
// row stride K / 32) against weight row wrow -> y[r * ldy]
template <int TYPE, int R>
inline void dot_rows(const uint8_t* wrow, int64_t nsb, const int16_t* xq, const float* xd, const float* xs,
                     int64_t K, float* y, int64_t ldy) {
    const int64_t nb = K / 32, nx = K / kXGroup<TYPE>;
#if defined(TM_AVX512)
    (void)nb, (void)nx;
    dot_rows_512<TYPE, R>(wrow, nsb, xq, xd, xs, K, y, ldy);
#elif defined(TM_AVX2)
    __m256 acc[R], off[R];
    for (int r = 0; r < R; ++r) acc[r] = off[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nsb; ++i) {
        const uint8_t* blk = wrow + i * super_bytes<TYPE>();
        prefetch_ahead<TYPE>(blk);
        __m256i isum[R];  // row r: the super-block's sum of sc * q * x (int32 lanes, exact; see kXMax)
        for (int r = 0; r < R; ++r) isum[r] = _mm256_setzero_si256();
        float d = 0.0f;
        if constexpr (TYPE == kQ4_K) {  // x's scale per 32 values: each sub-block's sum scaled in fp32
            uint32_t w[4];
            k4_scale_words(blk + 4, w);
            __m256 wsc, wmn;
            k4_weight_scales(blk, w, wsc, wmn);
            alignas(32) float scale[R][8];  // row r, sub-block j: d * sc_j * x's scale of that block
            for (int r = 0; r < R; ++r) {
                _mm256_store_ps(scale[r], _mm256_mul_ps(wsc, _mm256_loadu_ps(xd + r * nx + 8 * i)));
                off[r] = _mm256_fmadd_ps(wmn, _mm256_loadu_ps(xs + r * nb + 8 * i), off[r]);
            }
            const __m256i lo4 = _mm256_set1_epi16(0x000f), zero = _mm256_setzero_si256();
            for (int p = 0; p < 4; ++p) {
                const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 + 32 * p));
                // lane i holds bytes 2i, 2i + 1: their low nibbles are sub-block 2p's elements 2i, 2i + 1,
                // their high nibbles sub-block 2p + 1's
                const __m256i a = _mm256_and_si256(raw, lo4), b = _mm256_and_si256(_mm256_srli_epi16(raw, 8), lo4);
                const __m256i c = _mm256_and_si256(_mm256_srli_epi16(raw, 4), lo4), e = _mm256_srli_epi16(raw, 12);
                for (int r = 0; r < R; ++r) {
                    const int16_t* xb = xq + r * K + 256 * i + 64 * p;
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot32(zero, a, b, xb)),
                                             _mm256_broadcast_ss(&scale[r][2 * p]), acc[r]);
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot32(zero, c, e, xb + 32)),
                                             _mm256_broadcast_ss(&scale[r][2 * p + 1]), acc[r]);
                }
            }
        } else if constexpr (has_mins(TYPE)) {  // Q5_K
            d = f16_at(blk);
            uint32_t w[4];
            k4_scale_words(blk + 4, w);
            const __m256 wmn = k4_weight_mins(blk, w);
            for (int r = 0; r < R; ++r) off[r] = _mm256_fmadd_ps(wmn, _mm256_loadu_ps(xs + r * nb + 8 * i), off[r]);
            uint8_t sc[8];
            std::memcpy(sc, w, 8);
            const __m256i lo4 = _mm256_set1_epi16(0x000f), bit4 = _mm256_set1_epi16(0x0010);
            // the fifth bits (qh, before the quants: byte l, bit 2p / 2p + 1 is element l of sub-block 2p / 2p + 1),
            // shifted right by 2p for pair p
            __m256i hcur = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16));
            for (int p = 0; p < 4; ++p) {
                const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 48 + 32 * p));
                // lane i holds bytes 2i, 2i + 1: their low nibbles are sub-block 2p's elements 2i, 2i + 1,
                // their high nibbles sub-block 2p + 1's
                __m256i a = _mm256_and_si256(raw, lo4), b = _mm256_and_si256(_mm256_srli_epi16(raw, 8), lo4);
                __m256i c = _mm256_and_si256(_mm256_srli_epi16(raw, 4), lo4), e = _mm256_srli_epi16(raw, 12);
                // + 16 where the element's bit is set
                a = _mm256_or_si256(a, _mm256_and_si256(_mm256_slli_epi16(hcur, 4), bit4));
                b = _mm256_or_si256(b, _mm256_and_si256(_mm256_srli_epi16(hcur, 4), bit4));
                c = _mm256_or_si256(c, _mm256_and_si256(_mm256_slli_epi16(hcur, 3), bit4));
                e = _mm256_or_si256(e, _mm256_and_si256(_mm256_srli_epi16(hcur, 5), bit4));
                hcur = _mm256_srli_epi16(hcur, 2);
                const __m256i s0 = _mm256_set1_epi16(short(sc[2 * p])), s1 = _mm256_set1_epi16(short(sc[2 * p + 1]));
                a = _mm256_mullo_epi16(a, s0), b = _mm256_mullo_epi16(b, s0);
                c = _mm256_mullo_epi16(c, s1), e = _mm256_mullo_epi16(e, s1);
                for (int r = 0; r < R; ++r) {
                    const int16_t* xb = xq + r * K + 256 * i + 64 * p;
                    isum[r] = dot32(dot32(isum[r], a, b, xb), c, e, xb + 32);
                }
            }
        } else {  // Q6_K
            const uint8_t *ql = blk, *qh = blk + 128;
            d = f16_at(blk + 208);
            // the 16 signed scales in both 128-bit halves (a byte shuffle picks within its half)
            const __m256i sc8 = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192)));
            const __m256i nib = _mm256_set1_epi8(0x0f), top2 = _mm256_set1_epi8(0x30), b32 = _mm256_set1_epi8(32);
            // 16-bit lanes 0-7 take the sub-block pair's first scale, 8-15 its second (kPickEven / kPickOdd's lanes 0-1)
            const __m256i pe = _mm256_load_si256(reinterpret_cast<const __m256i*>(kPickEven));
            const __m256i po = _mm256_load_si256(reinterpret_cast<const __m256i*>(kPickOdd));
            for (int h = 0; h < 2; ++h) {
                const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 64 * h));
                const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 64 * h + 32));
                const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh + 32 * h));
                // group g's 32 quants (6 bits, 0-63) as bytes in element order: byte l is the half's element 32g + l
                // (its low 4 bits from ql, its top 2 from qh; the 16-bit shifts' spill into the next byte is masked)
                __m256i q[4];
                q[0] = _mm256_or_si256(_mm256_and_si256(l0, nib), _mm256_and_si256(_mm256_slli_epi16(hb, 4), top2));
                q[1] = _mm256_or_si256(_mm256_and_si256(l1, nib), _mm256_and_si256(_mm256_slli_epi16(hb, 2), top2));
                q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), nib), _mm256_and_si256(hb, top2));
                q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), nib),
                                       _mm256_and_si256(_mm256_srli_epi16(hb, 2), top2));
                __m256i we[4], wo[4];
                for (int g = 0; g < 4; ++g) {
                    // lanes 0-7 are sub-block s's elements, 8-15 sub-block s + 1's: its signed scale as the byte pair
                    // (sc, 0) / (0, sc); an unsigned quant times it gives q * sc (|.| <= 63 * 128, no saturation),
                    // and 32 * sc taken off gives (q - 32) * sc, |.| <= 32 * 128 (the same integers as a multiply)
                    const __m256i s = _mm256_set1_epi8(char(8 * h + 2 * g));
                    const __m256i sce = _mm256_shuffle_epi8(sc8, _mm256_add_epi8(pe, s));
                    const __m256i sco = _mm256_shuffle_epi8(sc8, _mm256_add_epi8(po, s));
                    const __m256i off = _mm256_maddubs_epi16(b32, sce);
                    we[g] = _mm256_sub_epi16(_mm256_maddubs_epi16(q[g], sce), off);
                    wo[g] = _mm256_sub_epi16(_mm256_maddubs_epi16(q[g], sco), off);
                }
                for (int r = 0; r < R; ++r) {
                    const int16_t* xb = xq + r * K + 256 * i + 128 * h;
                    for (int g = 0; g < 4; ++g) isum[r] = dot32(isum[r], we[g], wo[g], xb + 32 * g);
                }
            }
        }
        if constexpr (TYPE != kQ4_K)
            for (int r = 0; r < R; ++r)
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_set1_ps(d * xd[r * nx + i]), acc[r]);
    }
    for (int r = 0; r < R; ++r) y[r * ldy] = hsum8(acc[r]) - (has_mins(TYPE) ? hsum8(off[r]) : 0.0f);
#else
    for (int r = 0; r < R; ++r) {
        float acc = 0.0f, off = 0.0f;
        const int16_t* xr = xq + r * K;
        for (int64_t i = 0; i < nsb; ++i) {
            const uint8_t* blk = wrow + i * super_bytes<TYPE>();
            int q[256];  // the block's quants in element order, times their sub-block's scale
            float d;
            if constexpr (TYPE == kQ4_K) {  // per sub-block: its two halves' sums scaled in fp32, as the AVX2 code
                const float dd = f16_at(blk), dmin = f16_at(blk + 2);
                uint32_t words[4];
                k4_scale_words(blk + 4, words);
                uint8_t sc[8], mn[8];
                std::memcpy(sc, words, 8);
                std::memcpy(mn, words + 2, 8);
                for (int j = 0; j < 8; ++j) {
                    int sum0 = 0, sum1 = 0;  // elements 0-15 and 16-31
                    for (int e = 0; e < 32; ++e) {
                        const int v = ((blk[16 + 32 * (j / 2) + e] >> (4 * (j & 1))) & 0x0f) * xr[tm_x_slot(kXLayout, 8 * i + j, e)];
                        (e < 16 ? sum0 : sum1) += v;
                    }
                    const float ws = dd * float(sc[j]);
                    acc += (ws * float(sum0) + ws * float(sum1)) * xd[r * nx + 8 * i + j];
                    off += dmin * float(mn[j]) * xs[r * nb + 8 * i + j];
                }
                continue;
            } else if constexpr (has_mins(TYPE)) {  // Q5_K
                d = f16_at(blk);
                const float dmin = f16_at(blk + 2);
                uint32_t words[4];
                k4_scale_words(blk + 4, words);
                uint8_t sc[8], mn[8];
                std::memcpy(sc, words, 8);
                std::memcpy(mn, words + 2, 8);
                const uint8_t* qs = blk + 48;
                for (int p = 0; p < 4; ++p)
                    for (int e = 0; e < 32; ++e) {
                        const int h = blk[16 + e] >> (2 * p);  // qh bits 2p, 2p + 1
                        q[64 * p + e] = ((qs[32 * p + e] & 0x0f) | ((h & 1) << 4)) * sc[2 * p];
                        q[64 * p + 32 + e] = ((qs[32 * p + e] >> 4) | ((h & 2) << 3)) * sc[2 * p + 1];
                    }
                for (int j = 0; j < 8; ++j) off += dmin * float(mn[j]) * xs[r * nb + 8 * i + j];
            } else {
                const uint8_t *ql = blk, *qh = blk + 128;
                d = f16_at(blk + 208);
                for (int h = 0; h < 2; ++h)
                    for (int l = 0; l < 32; ++l) {
                        const uint8_t a = ql[64 * h + l], b = ql[64 * h + 32 + l], hb = qh[32 * h + l];
                        q[128 * h + l] = ((a & 0x0f) | ((hb & 3) << 4)) - 32;
                        q[128 * h + 32 + l] = ((b & 0x0f) | (((hb >> 2) & 3) << 4)) - 32;
                        q[128 * h + 64 + l] = ((a >> 4) | (((hb >> 4) & 3) << 4)) - 32;
                        q[128 * h + 96 + l] = ((b >> 4) | (((hb >> 6) & 3) << 4)) - 32;
                    }
                for (int e = 0; e < 256; ++e) q[e] *= int8_t(blk[192 + e / 16]);
            }
            int64_t isum = 0;  // exact (the vector code's int32 lanes add up to the same)
            for (int e = 0; e < 256; ++e) isum += int64_t(q[e]) * xr[tm_x_slot(kXLayout, 8 * i + e / 32, e % 32)];
            acc += float(isum) * (d * xd[r * nx + i]);
        }
        y[r * ldy] = acc - off;
    }
#endif
}

template <int TYPE>
void rows_block(const uint8_t* W, int64_t n0, int64_t n1, int64_t K, const int16_t* xq, const float* xd,
                const float* xs, int64_t M, float* y, int64_t ldy) {
    const int64_t nsb = K / 256, nb = K / 32, nx = K / kXGroup<TYPE>, row_bytes = nsb * super_bytes<TYPE>();
    for (int64_t n = n0; n < n1; ++n) {
        const uint8_t* wrow = W + n * row_bytes;
        for (int64_t r = 0; r < M; r += 8) {
            const int16_t* xr = xq + r * K;
            const float *dr = xd + r * nx, *sr = xs + r * nb;
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
    const int64_t nb = K / 32, nx = K / kXGroup<TYPE>;
    thread_local QuantX qx;
    quantize_rows<TYPE>(x, ldx, M, K, qx);
    const int16_t* xq = qx.q.data();
    const float *xd = qx.d.data(), *xs = qx.s.data();
    const int64_t chunks = (N + 15) / 16, items = groups * chunks;
    auto item = [&](int64_t it) {
        const int64_t g = it / chunks, c = it % chunks, r0 = starts[g], m = counts[g];
        if (m <= 0) return;
        rows_block<TYPE>(W[g], 16 * c, std::min<int64_t>(N, 16 * c + 16), K, xq + r0 * K, xd + r0 * nx,
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
