// y = x . W^T for a GGUF matrix W kept in its file's blocks (Q4_0, Q4_1, Q8_0; Q5_0, Q5_1, IQ4_NL in the packed
// layout only), for batches of rows, in integer arithmetic on AVX512-VNNI: the panel kernels of CPUs that have VNNI and
// no AMX (Zen 4, Intel before Sapphire Rapids), where oneDNN's bf16 or fp32 matmul on a dense copy is otherwise
// what runs past the block kernels' crossover. Two precisions of x, one code (the template's BITS):
//   8 bits  (tm_vnni_matmul): llama.cpp's, `vpdpbusd`, 64 byte products a 512-bit instruction (twice bf16's
//           `vdpbf16ps`); ~5e-3 relative to the fp32 product.
//   16 bits (tm_vnni16_matmul): the block kernel's (block_matmul.cpp), `vpdpwssd`, 32 int16 products an
//           instruction (bf16's rate); ~2e-5 relative, where a dense bf16 copy's rounding of the weights
//           gives ~2e-3.
//
// Per call: x is quantized row by row per 32-block (d = max|x| / (2^(BITS-1) - 1), q = round(x / d), s =
// d * sum q: llama.cpp's Q8_1 at 8 bits). Per work item, 16 weight rows are unpacked from their blocks into a
// panel that stays in L1/L2: per 32-block, BITS 512-bit vectors whose lane j holds consecutive weights of row
// j (8 bits: 4 as unsigned bytes; 16 bits: 2 as int16), u = q for Q4_1's nibbles, q for Q4_0's (its -8
// moved into m), Q5's nibble with its fifth bit, IQ4_NL's table value (+ 128 at 8 bits), and Q8_0's q + 128 at
// 8 bits (unsigned) or q at 16; and the rows' d and m as fp32 (w = d * u + m: Q4_1's and Q5_1's m; -8 d for
// Q4_0, -16 d for Q5_0; -128 d or 0 for Q8_0 and IQ4_NL). Each tile of x rows then runs over the panel: per
// block, BITS dot-product instructions per row (a weight vector times 4 broadcast bytes of x) give the 16
// rows' integer dot products, and y += (isum * dw) * dx + mw * sx in fp32.
// The weights are read from their blocks once per 256-row chunk of x (4.5-8.5 bits a weight), the unpacking
// is paid once per chunk rather than per row. Up to DIRECT_ROWS rows of a packed matrix skip the panel: each
// block's weights are widened in registers and multiplied into 8 rows at a time (direct16).
//
// Plain C++ (no torch, no ggml headers), in block_matmul.py's library, called through ctypes and from the native
// decode step (decode_step.cpp's kernel table, as the panel kernel).
//
//   tm_vnni_matmul / tm_vnni16_matmul(type, W, N, K, x, ldx, M, y, ldy, nthreads): tm_block_matmul's
//   arguments and layouts.
//   tm_vnni_pack(type, W, N, K, out): the packed layout (tm_vnni_packed_bytes): per 16 rows and 32-block the
//   vectors the gathers would build (the file's bytes reordered), read with plain loads instead (Zen 4's
//   gathers are slow: with the direct path, 1.4-2.7x the block kernel at any rows there). A type code with
//   the 0x100 flag names a packed matrix: these entries, and block_matmul.cpp's and panel_matmul.cpp's, take
//   it (the latter two on the 16-bit kernel).
//   tm_vnni_unpack_rows(type, packed, N, K, ids, count, out): rows of a packed matrix back as the file's blocks
//   (a tied embedding's gather from the packed output layer).
//
// Numerics: the weights exact, x rounded to BITS per 32-block (above).
// Invariant: y[m, n] is the same integer sums per block (exact in any order) and the same fp32 steps in the same
// order whatever M, the row's place in the batch, the thread count, the layout (plain or packed) or the path
// (panel or direct): a row gives the same bits alone or in any batch.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <type_traits>
#include <vector>
#if defined(_OPENMP)
#include <omp.h>
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__F16C__) && \
    !defined(TM_PORTABLE)
#include <immintrin.h>
#define TM_VNNI 1
#endif

void tm_run_items(int64_t items, int nthreads, const std::function<void(int64_t)>& item);  // block_matmul.cpp

constexpr int kPackedBit = 0x100;  // a type code's flag: the matrix is in the packed layout (tm_vnni_pack)

// panel_matmul.cpp, the same library (hidden: not the ABI)
__attribute__((visibility("hidden"))) void* tm_scratch(std::vector<uint8_t>& v, size_t bytes);
__attribute__((visibility("hidden"))) void tm_prefetch_share(const char* next, int64_t bytes, int64_t parts,
                                                             int64_t part);

namespace {

#ifdef TM_VNNI
enum : int { kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kIQ4_NL = 20 };  // ggml's type numbers
constexpr int NR = 16;                           // weight rows (output columns) a panel: the 16 lanes
constexpr int MR = 8;                            // rows of x a tile
constexpr int64_t CHUNK = 256;                   // rows of x a panel is unpacked for

// a panel's bytes a 32-block: BITS vectors of weights (8-bit: 8 of u8 quads; 16-bit: 16 of int16 pairs), dw[16],
// mw[16]
template <int BITS>
constexpr int64_t piece() {
    return BITS * 64 + 2 * 64;
}

template <int TYPE>
constexpr int64_t block_bytes() {
    return TYPE == kQ4_0 || TYPE == kIQ4_NL ? 18 : TYPE == kQ4_1 ? 20 : TYPE == kQ5_0 ? 22 : TYPE == kQ5_1 ? 24 : 34;
}

// Q5_0 {f16 d; u8 qh[4]; u8 qs[16]} and Q5_1 {f16 d; f16 m; u8 qh[4]; u8 qs[16]}: Q4's nibbles, each with a fifth
// bit from qh (bit e for element e: elements 0..15 in the low nibbles, 16..31 in the high ones)
template <int TYPE>
constexpr bool five_bit() {
    return TYPE == kQ5_0 || TYPE == kQ5_1;
}

// IQ4_NL {f16 d; u8 qs[16]}: Q4_0's layout, each nibble an index into a table of 16 int8 values (ggml's
// kvalues_iq4nl), w = d * value
template <int TYPE>
constexpr bool looked_up() {
    return TYPE == kIQ4_NL;
}

// A 4-bit type's quants: their first byte in a block, their first vector in a packed piece (after the rows' first
// 4 bytes, and Q5's qh)
template <int TYPE>
constexpr int quants_at() {
    return TYPE == kQ4_0 || TYPE == kIQ4_NL ? 2 : TYPE == kQ4_1 ? 4 : TYPE == kQ5_0 ? 6 : 8;
}
template <int TYPE>
constexpr int quants_vector() {
    return five_bit<TYPE>() ? 2 : 1;
}

// The fifth bits of 4 consecutive elements, from bit `first` of each lane's qh, as the bytes' bit 4 (byte k: element
// first + k): qh >> first picks a lane of the table (vpermd reads the index's low 4 bits), whose byte k is bit k of
// the index, moved to bit 4.
constexpr int32_t spread_bits(int n) {
    return ((n & 1) << 4) | ((n & 2) << 11) | ((n & 4) << 18) | ((n & 8) << 25);
}
inline __m512i fifth_bits(__m512i qh, int first) {
    const __m512i table = _mm512_set_epi32(spread_bits(15), spread_bits(14), spread_bits(13), spread_bits(12),
                                           spread_bits(11), spread_bits(10), spread_bits(9), spread_bits(8),
                                           spread_bits(7), spread_bits(6), spread_bits(5), spread_bits(4),
                                           spread_bits(3), spread_bits(2), spread_bits(1), spread_bits(0));
    return _mm512_permutexvar_epi32(_mm512_srl_epi32(qh, _mm_cvtsi32_si128(first)), table);
}

// A 4-bit type's 4 quant bytes a lane (elements 4g..4g+3 in the low nibbles, 16 + 4g.. in the high) -> the
// elements' values u, a byte each: Q5's with their fifth bits from qh; IQ4_NL's looked up (`vpshufb`), signed
// int8 at 16 bits, + 128 (unsigned, for `vpdpbusd`) at 8. Signed bytes where weight_signed says so.
template <int TYPE>
constexpr bool weight_signed() {
    return looked_up<TYPE>();
}
template <int TYPE, int BITS>
inline void weight_bytes(__m512i q, __m512i qh, int g, __m512i& low, __m512i& high) {
    const __m512i nib = _mm512_set1_epi8(0x0f);
    if constexpr (five_bit<TYPE>()) {  // (q & nib) | bits, in one instruction each (0xEA: (a & b) | c)
        low = _mm512_ternarylogic_epi32(q, nib, fifth_bits(qh, 4 * g), 0xEA);
        high = _mm512_ternarylogic_epi32(_mm512_srli_epi16(q, 4), nib, fifth_bits(qh, 16 + 4 * g), 0xEA);
    } else {
        (void)qh, (void)g;
        low = _mm512_and_si512(q, nib);
        high = _mm512_and_si512(_mm512_srli_epi16(q, 4), nib);
    }
    if constexpr (looked_up<TYPE>()) {  // kvalues_iq4nl (+ 128 at 8 bits)
        const __m512i table = BITS == 8 ? _mm512_broadcast_i32x4(_mm_setr_epi8(
                                              char(1), char(24), char(45), char(63), char(79), char(93), char(106),
                                              char(118), char(129), char(141), char(153), char(166), char(181),
                                              char(197), char(217), char(241)))
                                        : _mm512_broadcast_i32x4(_mm_setr_epi8(-127, -104, -83, -65, -49, -35, -22,
                                                                               -10, 1, 13, 25, 38, 53, 69, 89, 113));
        low = _mm512_shuffle_epi8(table, low);
        high = _mm512_shuffle_epi8(table, high);
    }
}

// w = d * u + m for a 4-bit type's u: Q4_1's and Q5_1's m, -8 d for Q4_0, -16 d for Q5_0, 0 for IQ4_NL (-128 d at 8
// bits) (`head`: the rows' first 4 bytes)
template <int TYPE, int BITS>
inline __m512 offset_m(__m512i head, __m512 d) {
    if constexpr (TYPE == kQ4_1 || TYPE == kQ5_1)
        return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(head, 16)));
    if constexpr (looked_up<TYPE>()) return BITS == 8 ? _mm512_mul_ps(d, _mm512_set1_ps(-128.0f)) : _mm512_setzero_ps();
    return _mm512_mul_ps(d, _mm512_set1_ps(TYPE == kQ4_0 ? -8.0f : -16.0f));
}

// x row (K) -> q (K int8 or int16: BITS), d and s (one each a 32-block): d = max|x| / (2^(BITS-1) - 1),
// q = round(x / d), s = d * sum q
template <int BITS>
void quantize_row(const float* x, int64_t K, void* qv, float* d, float* s) {
    constexpr float top = BITS == 8 ? 127.0f : 32767.0f;
    for (int64_t b = 0; b < K / 32; ++b) {
        const __m512 a0 = _mm512_loadu_ps(x + 32 * b), a1 = _mm512_loadu_ps(x + 32 * b + 16);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a0), _mm512_abs_ps(a1)));
        const float id = amax > 0.0f ? top / amax : 0.0f;
        const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(a0, _mm512_set1_ps(id)));  // to nearest, ties even
        const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(a1, _mm512_set1_ps(id)));
        if constexpr (BITS == 8) {
            int8_t* q = static_cast<int8_t*>(qv) + 32 * b;
            _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtsepi32_epi8(q0));
            _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtsepi32_epi8(q1));
        } else {
            int16_t* q = static_cast<int16_t*>(qv) + 32 * b;
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), _mm512_cvtsepi32_epi16(q0));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 16), _mm512_cvtsepi32_epi16(q1));
        }
        d[b] = amax / top;
        s[b] = d[b] * float(_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1)));
    }
}

// a 512-bit vector's 16 lanes of 4 bytes (b0..b3) -> two vectors of 16 lanes of 2 int16: (b0, b1) and (b2, b3),
// zero-extended (SIGNED false) or sign-extended
template <bool SIGNED>
inline void widen_pairs(__m512i q, __m512i& lo, __m512i& hi) {
    const char z = char(0x80);  // pshufb: a zero byte
    if constexpr (SIGNED) {  // each byte into its word's high byte, then an arithmetic shift down
        const __m512i c0 = _mm512_broadcast_i32x4(_mm_setr_epi8(z, 0, z, 1, z, 4, z, 5, z, 8, z, 9, z, 12, z, 13));
        const __m512i c1 = _mm512_broadcast_i32x4(_mm_setr_epi8(z, 2, z, 3, z, 6, z, 7, z, 10, z, 11, z, 14, z, 15));
        lo = _mm512_srai_epi16(_mm512_shuffle_epi8(q, c0), 8);
        hi = _mm512_srai_epi16(_mm512_shuffle_epi8(q, c1), 8);
    } else {
        const __m512i c0 = _mm512_broadcast_i32x4(_mm_setr_epi8(0, z, 1, z, 4, z, 5, z, 8, z, 9, z, 12, z, 13, z));
        const __m512i c1 = _mm512_broadcast_i32x4(_mm_setr_epi8(2, z, 3, z, 6, z, 7, z, 10, z, 11, z, 14, z, 15, z));
        lo = _mm512_shuffle_epi8(q, c0);
        hi = _mm512_shuffle_epi8(q, c1);
    }
}

// weight rows [n0, n0 + nc) (nc <= NR; lanes past nc zero) -> panel (K / 32 pieces), by gathers down the rows.
// 8-bit: vector g (0..7) of a piece holds each row's weights 4g..4g+3 as u8; 16-bit: vector p (0..15) its
// weights 2p, 2p+1 as int16 (Q8_0's as they are: m = 0)
// The packed layout (tm_vnni_pack): per group of 16 rows, per 32-block, the vectors make_panel would gather:
// the rows' first 4 bytes of the block (lane j: row j; d, and Q4_1's / Q5_1's m or the first bytes after d),
// then the bytes from there on 4 a lane at a time (Q4_0 / Q4_1: 4 vectors of quants; Q5_0 / Q5_1: qh, then 4 of
// quants; Q8_0: 8 of quants); lanes past the last row zero.
template <int TYPE>
constexpr int64_t packed_piece() {
    return 64 * (1 + (TYPE == kQ8_0 ? 8 : five_bit<TYPE>() ? 5 : 4));
}

template <int TYPE, int BITS, bool PACKED>
void make_panel(const uint8_t* W, int64_t n0, int nc, int64_t K, uint8_t* panel) {
    const int64_t nb = K / 32, rb = nb * block_bytes<TYPE>();
    const __mmask16 live = nc >= NR ? __mmask16(0xffff) : __mmask16((1u << nc) - 1);
    const __m512i rows = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                            _mm512_set1_epi32(int32_t(rb)));
    const __m512i zero = _mm512_setzero_si512();
    const uint8_t* base = PACKED ? W + n0 / NR * nb * packed_piece<TYPE>() : W + n0 * rb;
    constexpr int64_t vec = BITS * 64;  // the weight vectors' bytes a piece
    // vector v of block b: gathered down the rows from byte `at` of their blocks, or read from the packed piece
    auto rows4 = [&](const uint8_t* blk, const uint8_t* packed, int at, int v) {
        if constexpr (PACKED) return _mm512_load_si512(packed + 64 * v);
        else return _mm512_mask_i32gather_epi32(zero, live, rows, blk + at, 1);
    };
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = base + b * block_bytes<TYPE>();
        const uint8_t* packed = base + b * packed_piece<TYPE>();
        uint8_t* p = panel + b * piece<BITS>();
        // the first 4 bytes of each row's block: d (and Q4_1's m) as halves
        const __m512i head = rows4(blk, packed, 0, 0);
        const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(head));
        __m512 m;
        if constexpr (TYPE == kQ8_0) {
            m = BITS == 8 ? _mm512_mul_ps(d, _mm512_set1_ps(-128.0f)) : _mm512_setzero_ps();
            for (int g = 0; g < 8; ++g) {
                const __m512i q = rows4(blk, packed, 2 + 4 * g, 1 + g);
                if constexpr (BITS == 8) {
                    // signed bytes + 128: xor the sign bit (zero lanes stay zero: their d is zero)
                    _mm512_store_si512(p + 64 * g, _mm512_maskz_xor_epi32(live, q, _mm512_set1_epi8(char(0x80))));
                } else {
                    __m512i lo, hi;
                    widen_pairs<true>(q, lo, hi);
                    _mm512_store_si512(p + 128 * g, lo);
                    _mm512_store_si512(p + 128 * g + 64, hi);
                }
            }
        } else {
            m = offset_m<TYPE, BITS>(head, d);
            constexpr int qs = quants_at<TYPE>(), v = quants_vector<TYPE>();
            const __m512i qh = five_bit<TYPE>() ? rows4(blk, packed, qs - 4, 1) : zero;
            for (int g = 0; g < 4; ++g) {  // bytes 4g..4g+3: elements 4g.. in the low nibbles, 16 + 4g.. high
                __m512i low, high;
                weight_bytes<TYPE, BITS>(rows4(blk, packed, qs + 4 * g, v + g), qh, g, low, high);
                if constexpr (BITS == 8) {
                    _mm512_store_si512(p + 64 * g, low);
                    _mm512_store_si512(p + 64 * (g + 4), high);
                } else {
                    __m512i a, c;
                    widen_pairs<weight_signed<TYPE>()>(low, a, c);
                    _mm512_store_si512(p + 128 * g, a);
                    _mm512_store_si512(p + 128 * g + 64, c);
                    widen_pairs<weight_signed<TYPE>()>(high, a, c);
                    _mm512_store_si512(p + 128 * (g + 4), a);
                    _mm512_store_si512(p + 128 * (g + 4) + 64, c);
                }
            }
        }
        _mm512_store_ps(reinterpret_cast<float*>(p + vec), d);
        _mm512_store_ps(reinterpret_cast<float*>(p + vec + 64), m);
    }
}

// R (<= MR) rows of quantized x (rows K values apart; d and s K / 32 apart) times the panel -> y (R rows ldy
// apart, the first nc columns). Per block, each of the BITS weight vectors times 4 broadcast bytes of x
// (4 u8 x s8 products a lane on `vpdpbusd`, 2 int16 x int16 on `vpdpwssd`).
template <int R, int BITS>
void tile(const uint8_t* panel, int64_t K, const void* xqv, const float* xd, const float* xs, float* y,
          int64_t ldy, int nc) {
    const int64_t nb = K / 32;
    constexpr int G = BITS;                       // weight vectors a block
    constexpr int64_t vec = G * 64;
    const auto* xq = static_cast<const uint8_t*>(xqv);
    const int64_t row = K * (BITS / 8);           // x's bytes a row
    __m512 acc[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* p = panel + b * piece<BITS>();
        __m512i ia[R];
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) ia[r] = _mm512_setzero_si512();
#pragma GCC unroll 16
        for (int g = 0; g < G; ++g) {
            const __m512i w = _mm512_load_si512(p + 64 * g);
#pragma GCC unroll 8
            for (int r = 0; r < R; ++r) {
                int32_t four;
                std::memcpy(&four, xq + r * row + b * (4 * BITS) + 4 * g, 4);
                if constexpr (BITS == 8)
                    ia[r] = _mm512_dpbusd_epi32(ia[r], w, _mm512_set1_epi32(four));
                else
                    ia[r] = _mm512_dpwssd_epi32(ia[r], w, _mm512_set1_epi32(four));
            }
        }
        const __m512 dw = _mm512_load_ps(reinterpret_cast<const float*>(p + vec));
        const __m512 mw = _mm512_load_ps(reinterpret_cast<const float*>(p + vec + 64));
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
            const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(ia[r]), dw);
            acc[r] = _mm512_fmadd_ps(t, _mm512_set1_ps(xd[r * nb + b]), acc[r]);
            acc[r] = _mm512_fmadd_ps(mw, _mm512_set1_ps(xs[r * nb + b]), acc[r]);
        }
    }
    const __mmask16 mk = nc >= NR ? __mmask16(0xffff) : __mmask16((1u << nc) - 1);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(y + r * ldy, mk, acc[r]);
}

// R (<= 8) rows of 16-bit x times one packed 16-row group (no panel: each block's weights widened in registers
// and multiplied at once) -> y (R rows ldy apart, the first nc columns). Up to DIRECT_ROWS rows (8 a pass over
// the group, whose blocks stay in L1) the panel's stores and loads cost more than they save: on a 2-core Zen 4
// the default model's matrices at 1 row 1.9-2.2x the panel path (and the block kernel), at 16 rows 1.1x the
// panel path (benchmarks/experiments/vnni_vs_bf16.py). The same integer products and epilogue as tile<R, 16>
// over make_panel's panel (integer sums in another order: exact), so the same bits.
#ifndef TM_DIRECT_ROWS
#define TM_DIRECT_ROWS 32
#endif
constexpr int DIRECT_ROWS = TM_DIRECT_ROWS;

template <int TYPE, int R>
void direct16(const uint8_t* group, int64_t K, const int16_t* xq, const float* xd, const float* xs, float* y,
              int64_t ldy, int nc) {
    const int64_t nb = K / 32;
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* pc = group + b * packed_piece<TYPE>();
        const __m512i head = _mm512_load_si512(pc);
        const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(head));
        __m512 m;
        __m512i ia[R];
        for (int r = 0; r < R; ++r) ia[r] = _mm512_setzero_si512();
        // weight pair vector p (elements 2p, 2p + 1) times x's pair p of each row
        auto dot = [&](int p, __m512i w) {
            for (int r = 0; r < R; ++r) {
                int32_t two;
                std::memcpy(&two, xq + r * K + 32 * b + 2 * p, 4);
                ia[r] = _mm512_dpwssd_epi32(ia[r], w, _mm512_set1_epi32(two));
            }
        };
        if constexpr (TYPE == kQ8_0) {
            m = _mm512_setzero_ps();
#pragma GCC unroll 8
            for (int g = 0; g < 8; ++g) {
                __m512i lo, hi;
                widen_pairs<true>(_mm512_load_si512(pc + 64 * (1 + g)), lo, hi);
                dot(2 * g, lo);
                dot(2 * g + 1, hi);
            }
        } else {
            m = offset_m<TYPE, 16>(head, d);
            constexpr int v = quants_vector<TYPE>();
            const __m512i qh = five_bit<TYPE>() ? _mm512_load_si512(pc + 64) : _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int g = 0; g < 4; ++g) {
                __m512i low, high, a, c;
                weight_bytes<TYPE, 16>(_mm512_load_si512(pc + 64 * (v + g)), qh, g, low, high);
                widen_pairs<weight_signed<TYPE>()>(low, a, c);
                dot(2 * g, a);
                dot(2 * g + 1, c);
                widen_pairs<weight_signed<TYPE>()>(high, a, c);
                dot(8 + 2 * g, a);
                dot(8 + 2 * g + 1, c);
            }
        }
        for (int r = 0; r < R; ++r) {
            const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(ia[r]), d);
            acc[r] = _mm512_fmadd_ps(t, _mm512_set1_ps(xd[r * nb + b]), acc[r]);
            acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(xs[r * nb + b]), acc[r]);
        }
    }
    const __mmask16 mk = nc >= NR ? __mmask16(0xffff) : __mmask16((1u << nc) - 1);
    for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(y + r * ldy, mk, acc[r]);
}

// f(std::integral_constant<int, r>{}) for r in 1..8: a row count known at run time as a template argument
template <typename F>
inline void with_rows(int64_t r, F&& f) {
    switch (r) {
        case 8: f(std::integral_constant<int, 8>{}); break;
        case 7: f(std::integral_constant<int, 7>{}); break;
        case 6: f(std::integral_constant<int, 6>{}); break;
        case 5: f(std::integral_constant<int, 5>{}); break;
        case 4: f(std::integral_constant<int, 4>{}); break;
        case 3: f(std::integral_constant<int, 3>{}); break;
        case 2: f(std::integral_constant<int, 2>{}); break;
        default: f(std::integral_constant<int, 1>{}); break;
    }
}

template <typename T>
T* scratch(std::vector<uint8_t>& v, size_t bytes) {
    return static_cast<T*>(tm_scratch(v, bytes));
}

template <int TYPE, int BITS, bool PACKED>
void vnni_matmul(const uint8_t* W, int64_t N, int64_t K, const float* x, int64_t ldx, int64_t M, float* y,
                 int64_t ldy, int nthreads) {
    if (M <= 0 || N <= 0) return;
    const int64_t nb = K / 32, items = (N + NR - 1) / NR, rb = nb * block_bytes<TYPE>();
    thread_local std::vector<uint8_t> qbuf, sbuf;
    uint8_t* xq = scratch<uint8_t>(qbuf, size_t(M * K * (BITS / 8)));
    float* xd = scratch<float>(sbuf, size_t(2 * M * nb * 4));
    float* xs = xd + M * nb;
    const int64_t row = K * (BITS / 8);  // a quantized row's bytes
    auto quantize = [&](int64_t r) { quantize_row<BITS>(x + r * ldx, K, xq + r * row, xd + r * nb, xs + r * nb); };
    if constexpr (PACKED && BITS == 16) {
        if (M <= DIRECT_ROWS) {  // a few rows: quantized here, then each group straight from its packed bytes
            for (int64_t r = 0; r < M; ++r) quantize(r);
            const auto* q16 = reinterpret_cast<const int16_t*>(xq);
            auto group = [&](int64_t it) {
                const uint8_t* g = W + it * nb * packed_piece<TYPE>();
                const int nc = int(std::min<int64_t>(NR, N - it * NR));
                for (int64_t r = 0; r < M; r += 8) {  // 8 rows a pass over the group's blocks (in L1 after the first)
                    const int16_t* q = q16 + r * K;
                    const float *d = xd + r * nb, *sx = xs + r * nb;
                    float* yt = y + r * ldy + it * NR;
                    with_rows(std::min<int64_t>(8, M - r),
                              [&](auto R) { direct16<TYPE, R.value>(g, K, q, d, sx, yt, ldy, nc); });
                }
            };
            tm_run_items(items, nthreads, group);
            return;
        }
    }
    auto item = [&](int64_t it, int64_t m0, int64_t m1, uint8_t* panel) {
        const int64_t n0 = it * NR;
        const int nc = int(std::min<int64_t>(NR, N - n0));
        make_panel<TYPE, BITS, PACKED>(W, n0, nc, K, panel);
        // the next item's weight rows (this thread's next, under the static schedule) asked into L2 while this
        // item's tiles run, a share before each tile (tm_prefetch_share)
        const int64_t tiles = (m1 - m0 + MR - 1) / MR;
        const char* next = reinterpret_cast<const char*>(PACKED ? W + (it + 1) * nb * packed_piece<TYPE>()
                                                                 : W + (n0 + NR) * rb);
        const int64_t bytes = n0 + NR >= N ? 0 : PACKED ? nb * packed_piece<TYPE>()
                                                         : std::min<int64_t>(NR, N - n0 - NR) * rb;
        for (int64_t t = 0; t < tiles; ++t) {
            tm_prefetch_share(next, bytes, tiles, t);
            const int64_t r = m0 + t * MR;
            const uint8_t* q = xq + r * row;
            const float *d = xd + r * nb, *s = xs + r * nb;
            float* yt = y + r * ldy + n0;
            with_rows(std::min<int64_t>(MR, m1 - r), [&](auto R) { tile<R.value, BITS>(panel, K, q, d, s, yt, ldy, nc); });
        }
    };
#if defined(_OPENMP)
    if (nthreads > 1 && items > 1) {
#pragma omp parallel num_threads(nthreads)
        {
#pragma omp for schedule(static)
            for (int64_t r = 0; r < M; ++r) quantize(r);
            // (the loop's barrier: every row is quantized before any item reads one)
            thread_local std::vector<uint8_t> pbuf;
            uint8_t* panel = scratch<uint8_t>(pbuf, size_t(nb * piece<BITS>()));
            for (int64_t m0 = 0; m0 < M; m0 += CHUNK) {
#pragma omp for schedule(static)
                for (int64_t it = 0; it < items; ++it) item(it, m0, std::min(M, m0 + CHUNK), panel);
            }
        }
        return;
    }
#endif
    for (int64_t r = 0; r < M; ++r) quantize(r);
    thread_local std::vector<uint8_t> pbuf;
    uint8_t* panel = scratch<uint8_t>(pbuf, size_t(nb * piece<BITS>()));
    for (int64_t m0 = 0; m0 < M; m0 += CHUNK)
        for (int64_t it = 0; it < items; ++it) item(it, m0, std::min(M, m0 + CHUNK), panel);
}
#endif  // TM_VNNI

}  // namespace

extern "C" {

// 1 where this build has the VNNI kernel (built for a CPU with AVX512 F/BW/VNNI), else 0
int tm_vnni_available() {
#ifdef TM_VNNI
    return 1;
#else
    return 0;
#endif
}

int tm_block_matmul(int type, const void* W, int64_t N, int64_t K, const float* x, int64_t ldx, int64_t M,
                    float* y, int64_t ldy, int nthreads);  // block_matmul.cpp
int tm_panel_matmul(int type, const void* W, int64_t N, int64_t K, const float* x, int64_t ldx, int64_t M,
                    float* y, int64_t ldy, int nthreads);  // panel_matmul.cpp

// See the header. Returns 0; -2 when K % 32 != 0. Like tm_panel_matmul it takes any block_mm layer: types
// without a VNNI panel (the K-quants) get the block kernel's result, and a build without VNNI the fp32
// panel kernel's.
}  // extern "C"
template <int BITS, bool PACKED = false>
static int vnni_call(int type, const void* W, int64_t N, int64_t K, const float* x, int64_t ldx, int64_t M,
                     float* y, int64_t ldy, int nthreads) {
    if (!PACKED && (type & kPackedBit)) return vnni_call<BITS, true>(type & ~kPackedBit, W, N, K, x, ldx, M, y, ldy,
                                                                      nthreads);
#ifdef TM_VNNI
    if (K % 32) return -2;
    const auto* w = static_cast<const uint8_t*>(W);
    switch (type) {
        case kQ4_0: vnni_matmul<kQ4_0, BITS, PACKED>(w, N, K, x, ldx, M, y, ldy, nthreads); return 0;
        case kQ4_1: vnni_matmul<kQ4_1, BITS, PACKED>(w, N, K, x, ldx, M, y, ldy, nthreads); return 0;
        case kQ8_0: vnni_matmul<kQ8_0, BITS, PACKED>(w, N, K, x, ldx, M, y, ldy, nthreads); return 0;
        default: break;
    }
    if constexpr (PACKED) {  // Q5_0 / Q5_1 / IQ4_NL only packed (the plain ones are ggml's)
        switch (type) {
            case kQ5_0: vnni_matmul<kQ5_0, BITS, true>(w, N, K, x, ldx, M, y, ldy, nthreads); return 0;
            case kQ5_1: vnni_matmul<kQ5_1, BITS, true>(w, N, K, x, ldx, M, y, ldy, nthreads); return 0;
            case kIQ4_NL: vnni_matmul<kIQ4_NL, BITS, true>(w, N, K, x, ldx, M, y, ldy, nthreads); return 0;
            default: return -1;
        }
    } else {
        return tm_block_matmul(type, W, N, K, x, ldx, M, y, ldy, nthreads);
    }
#else
    return PACKED ? -3 : tm_panel_matmul(type, W, N, K, x, ldx, M, y, ldy, nthreads);
#endif
}
extern "C" {

// x at 8 bits per 32-block (llama.cpp's precision)
int tm_vnni_matmul(int type, const void* W, int64_t N, int64_t K, const float* x, int64_t ldx, int64_t M,
                   float* y, int64_t ldy, int nthreads) {
    return vnni_call<8>(type, W, N, K, x, ldx, M, y, ldy, nthreads);
}

// x at 16 bits per 32-block (finer than bf16's 8-bit significand)
int tm_vnni16_matmul(int type, const void* W, int64_t N, int64_t K, const float* x, int64_t ldx, int64_t M,
                     float* y, int64_t ldy, int nthreads) {
    return vnni_call<16>(type, W, N, K, x, ldx, M, y, ldy, nthreads);
}

// Bytes of the packed layout of an (N, K) matrix of `type` (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL; K % 32 == 0),
// else 0.
int64_t tm_vnni_packed_bytes(int type, int64_t N, int64_t K) {
#ifdef TM_VNNI
    if (K % 32 || N <= 0) return 0;
    const int64_t groups = (N + NR - 1) / NR, nb = K / 32;
    switch (type) {
        case kQ4_0: return groups * nb * packed_piece<kQ4_0>();
        case kQ4_1: return groups * nb * packed_piece<kQ4_1>();
        case kQ5_0: return groups * nb * packed_piece<kQ5_0>();
        case kQ5_1: return groups * nb * packed_piece<kQ5_1>();
        case kIQ4_NL: return groups * nb * packed_piece<kIQ4_NL>();
        case kQ8_0: return groups * nb * packed_piece<kQ8_0>();
        default: return 0;
    }
#else
    (void)type, (void)N, (void)K;
    return 0;
#endif
}

// Where a row's block lies in the plain and the packed layouts (tm_vnni_pack, tm_vnni_unpack_rows): a row of nb
// blocks of bb bytes (rb), its quants from byte qs of a block; a packed piece (16 rows, one block) of 64 bytes
// of the blocks' first 4 bytes, then nq vectors of 64 bytes of 4 quant bytes a row.
struct PackGeometry {
    int64_t nb, bb, rb, qs;
    int nq;
    int64_t piece(int64_t row, int64_t b) const { return (row / 16 * nb + b) * 64 * (1 + nq); }
};
static PackGeometry pack_geometry(int type, int64_t K) {
    // Q4_0 / IQ4_NL {d; qs[16]}, Q4_1 {d; m; qs[16]}, Q5_0 {d; qh[4]; qs[16]}, Q5_1 {d; m; qh[4]; qs[16]},
    // Q8_0 {d; qs[32]}
    const int64_t nb = K / 32,
                  bb = type == 2 || type == 20 ? 18 : type == 3 ? 20 : type == 6 ? 22 : type == 7 ? 24 : 34;
    return {nb, bb, nb * bb, type == 3 || type == 7 ? 4 : 2, type == 8 ? 8 : type == 6 || type == 7 ? 5 : 4};
}

// W's blocks -> out (tm_vnni_packed_bytes, 64-byte aligned) in the packed layout. Returns 0, or -1 for a type
// or shape it does not take.
int tm_vnni_pack(int type, const void* W, int64_t N, int64_t K, void* out) {
    const int64_t total = tm_vnni_packed_bytes(type, N, K);
    if (!total) return -1;
    const PackGeometry pg = pack_geometry(type, K);
    const auto* w = static_cast<const uint8_t*>(W);
    auto* o = static_cast<uint8_t*>(out);
    std::memset(o, 0, size_t(total));
    for (int64_t r = 0; r < N; ++r)
        for (int64_t b = 0; b < pg.nb; ++b) {
            uint8_t* piece = o + pg.piece(r, b);
            const uint8_t* blk = w + r * pg.rb + b * pg.bb;
            const int64_t j = r % 16;
            std::memcpy(piece + 4 * j, blk, 4);
            for (int v = 0; v < pg.nq; ++v) std::memcpy(piece + 64 * (1 + v) + 4 * j, blk + pg.qs + 4 * v, 4);
        }
    return 0;
}

// Rows ids[0 .. count) of a packed (N, K) matrix back as the file's blocks (the row's bytes, rb a row), into
// out: the embedding's gather where the tied output layer's blocks were packed. Returns 0, or -1 for a type
// or shape it does not take or an id out of range.
int tm_vnni_unpack_rows(int type, const void* packed, int64_t N, int64_t K, const int64_t* ids, int64_t count,
                        void* out) {
    if (!tm_vnni_packed_bytes(type, N, K)) return -1;
    const PackGeometry pg = pack_geometry(type, K);
    const auto* p = static_cast<const uint8_t*>(packed);
    auto* o = static_cast<uint8_t*>(out);
    for (int64_t i = 0; i < count; ++i) {
        const int64_t r = ids[i], j = r % 16;
        if (r < 0 || r >= N) return -1;
        for (int64_t b = 0; b < pg.nb; ++b) {
            const uint8_t* piece = p + pg.piece(r, b);
            uint8_t* blk = o + i * pg.rb + b * pg.bb;
            std::memcpy(blk, piece + 4 * j, size_t(pg.qs));  // d (and Q4_1's m)
            for (int v = 0; v < pg.nq; ++v) std::memcpy(blk + pg.qs + 4 * v, piece + 64 * (1 + v) + 4 * j, 4);
        }
    }
    return 0;
}

}  // extern "C"
