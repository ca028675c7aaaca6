// y = x . W^T for a GGUF matrix W in its file's blocks (Q4_0, Q4_1, Q8_0; Q4_K, Q5_K, Q6_K) on Intel AMX, at
// bf16: each run of 32 weights is dequantized in registers to 32 bf16 values (d * q (+ m), rounded to nearest
// even, the value the dense bf16 copy holds; the K-quants' runs with their own scales) and multiplied by
// the AMX tile unit against x rounded to bf16, with fp32 accumulation. It reads the blocks (4.5-8.5 bits a
// weight) where a dense bf16 matmul reads 16 bits: decode steps of a few to 64 rows are bound by reading the
// weights, so this is the kernel for them on a CPU with AMX (block_matmul.cpp's integer kernel is
// compute-bound from a few rows on; the dense copy reads 3.5x the bytes). The K-quants serve big batches
// (prompts) of files whose blocks the integer kernel does not take.
//
// Built into the block-matmul library (block_matmul.py) from the same -march=native compile: on a CPU
// without AMX-BF16 and AVX512-BF16 the entry points exist and answer "unavailable".
//
//   tm_amx_matmul(type, W, N, K, x, ldx, M, y, ldy, nthreads)   as tm_block_matmul; N % 16 == 0, K % 32 == 0
//                                                                (K % 256 for the K-quants, which only the
//                                                                big-batch path uses: ggml's kernels below)
//   tm_amx_matmul_bf16(type, W, N, K, x, ldx, M, y, ldy, nthreads)   the same with bf16 rows in and out (x
//                                                                as the tiles take it, y rounded to nearest
//                                                                even): the bits of tm_amx_matmul on x
//                                                                widened, its result rounded as torch rounds
//   tm_amx_matmul_grouped(..., min_rows)   as tm_block_matmul_grouped; groups under min_rows on that kernel
//   tm_amx_available()   1 when the CPU has the units and the OS lets this process use the tiles
//
// Layout (the tile multiply C[16][16] += A[16][32] . B[32][16], bf16 pairs along K):
//   A = 16 weight rows n0..n0+15 x one 32-block of K, dequantized row-major (64 bytes a row);
//   B = x's rows m0..m0+15 over the same 32 columns, in pairs: B row k holds (x[m][2k], x[m][2k+1]) for the
//       16 m, a 16x16 transpose of 32-bit pairs, made once per call for every (block, 16 rows of x);
//   C = y^T tile (16 n x 16 m), fp32, transposed into y's rows at the end.
// Up to 4 C tiles (64 rows of x) share each dequantized A tile; past 64 rows each weight row's blocks are
// dequantized once per call into a panel that every 64-row pass reads.
//
// Invariant: y[m, n] depends only on x[m, :] and W[n, :]: one accumulator per (m, n), the blocks in order
// of K, whatever M, the row tiling or the thread count. So a row gives the same bits alone or in a batch.
#include <cstdint>
#include <cstring>
#include <vector>
#if defined(_OPENMP)
#include <omp.h>
#endif

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__) && defined(__AVX512BW__) && \
    defined(__F16C__) && defined(__linux__) && !defined(TM_PORTABLE)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define TM_AMX 1
#endif

namespace {

enum : int { kQ4_0 = 2, kQ4_1 = 3, kQ8_0 = 8, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14 };  // ggml's type numbers

// A row is stored as blocks of block_bytes(type); each holds sub_blocks(type) runs of 32 values (the K-quants'
// 256-value super-blocks: 8 runs of 32, each with its own scale), the unit the tiles take along K.
constexpr int64_t block_bytes(int type) {
    return type == kQ4_0 ? 18 : type == kQ4_1 ? 20 : type == kQ8_0 ? 34 : type == kQ4_K ? 144
         : type == kQ5_K ? 176 : 210;
}
constexpr int64_t sub_blocks(int type) { return type == kQ4_K || type == kQ5_K || type == kQ6_K ? 8 : 1; }

#ifdef TM_AMX

// GCC's tile intrinsics are asm statements that do not tell the compiler they read or write memory: a
// barrier before each tile load (the buffer's stores must happen first) and after each tile store (reads
// of the buffer must come after), or -O3 drops or reorders them
#define TM_MEMORY_BARRIER() asm volatile("" ::: "memory")

struct alignas(64) TileConfig {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
};

// tmm0-3: C tiles (16 x 16 fp32); tmm4: A (16 x 32 bf16); tmm5-7: B (16 pairs x 16 rows of x), one per
// C tile (the fourth reuses tmm5), so that a B load need not wait for the multiply that read the last one
inline void configure_tiles() {
    TileConfig cfg;
    for (int t = 0; t < 8; ++t) {
        cfg.rows[t] = 16;
        cfg.colsb[t] = 64;
    }
    TM_MEMORY_BARRIER();
    _tile_loadconfig(&cfg);
}

// r[i] = row i of a 16 x 16 matrix of 32-bit values -> r[i] = column i
inline void transpose16(__m512i* r) {
    __m512i t[16], u[16];
    for (int i = 0; i < 8; ++i) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    // u[4i + c], 128-bit lane L: column 4L + c of rows 4i..4i+3
    for (int i = 0; i < 4; ++i) {
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int c = 0; c < 4; ++c) {
        const __m512i v0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44), v1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xEE);
        const __m512i w0 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44),
                      w1 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xEE);
        r[c] = _mm512_shuffle_i32x4(v0, w0, 0x88);
        r[4 + c] = _mm512_shuffle_i32x4(v0, w0, 0xDD);
        r[8 + c] = _mm512_shuffle_i32x4(v1, w1, 0x88);
        r[12 + c] = _mm512_shuffle_i32x4(v1, w1, 0xDD);
    }
}

inline float half(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

// Run j of 32 values of the block at b (j = 0 for the 32-value types) -> 32 bf16 at out (64 bytes). The
// K-quants' values are ggml's dequantization's (ggml's dequantize_row_q4_K / _q6_K, in the same fp32 steps):
//   Q4_K (d, dmin, 12 bytes of 6-bit scales and mins for the 8 runs, 128 bytes of nibbles: runs 2i and
//        2i + 1 are the low and high nibbles of bytes 32i..32i+31): d * sc_j * q - dmin * m_j;
//   Q5_K (as Q4_K, with 32 bytes of fifth bits before the nibbles: run j's is bit j of qh[l]): q + 16 bit;
//   Q6_K (128 bytes of low nibbles, 64 of 2-bit highs, 16 int8 scales of 16 values, d): in each half of
//        128 values, run r of 4 takes nibble r / 2 of ql[32 (r % 2) + l] and bits 2r of qh[l]; value
//        (d * sc) * (q - 32).
template <int TYPE>
inline void dequant_block(const uint8_t* b, int j, uint16_t* out) {
    __m512 lo, hi;
    if constexpr (TYPE == kQ4_K || TYPE == kQ5_K) {
        const uint8_t* sc = b + 4;
        int s, m;
        if (j < 4) {
            s = sc[j] & 63, m = sc[j + 4] & 63;
        } else {
            s = (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4), m = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
        }
        const __m512 d1 = _mm512_set1_ps(half(b) * float(s)), m1 = _mm512_set1_ps(half(b + 2) * float(m));
        const uint8_t* q = b + (TYPE == kQ5_K ? 48 : 16) + 32 * (j / 2);
        const int shift = 4 * (j & 1);
        const __m512i nib = _mm512_set1_epi32(15);
        __m512i q0 = _mm512_and_si512(
            _mm512_srli_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))), shift), nib);
        __m512i q1 = _mm512_and_si512(
            _mm512_srli_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16))), shift),
            nib);
        if constexpr (TYPE == kQ5_K) {  // + 16 where bit j of qh[l] is set
            const uint8_t* qh = b + 16;
            const __m512i bit = _mm512_set1_epi32(1 << j), sixteen = _mm512_set1_epi32(16);
            const __m512i h0 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qh)));
            const __m512i h1 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qh + 16)));
            q0 = _mm512_mask_add_epi32(q0, _mm512_test_epi32_mask(h0, bit), q0, sixteen);
            q1 = _mm512_mask_add_epi32(q1, _mm512_test_epi32_mask(h1, bit), q1, sixteen);
        }
        lo = _mm512_fmsub_ps(_mm512_cvtepi32_ps(q0), d1, m1);
        hi = _mm512_fmsub_ps(_mm512_cvtepi32_ps(q1), d1, m1);
    } else if constexpr (TYPE == kQ6_K) {
        const int h = j / 4, r = j % 4;
        const uint8_t* ql = b + 64 * h + 32 * (r & 1);
        const uint8_t* qh = b + 128 + 32 * h;
        const auto* sc = reinterpret_cast<const int8_t*>(b + 192) + 8 * h + 2 * r;
        const float d = half(b + 208);
        const __m512i nib = _mm512_set1_epi32(15), two = _mm512_set1_epi32(3), off = _mm512_set1_epi32(32);
        auto values = [&](int l0) {  // values l0 .. l0 + 15 of the run, as (q - 32) in fp32
            const __m512i l = _mm512_and_si512(
                _mm512_srli_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ql + l0))),
                                  4 * (r >> 1)), nib);
            const __m512i hb = _mm512_and_si512(
                _mm512_srli_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qh + l0))),
                                  2 * r), two);
            return _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_or_si512(l, _mm512_slli_epi32(hb, 4)), off));
        };
        lo = _mm512_mul_ps(_mm512_set1_ps(d * float(sc[0])), values(0));
        hi = _mm512_mul_ps(_mm512_set1_ps(d * float(sc[1])), values(16));
    } else if constexpr (TYPE == kQ8_0) {
        const __m512 d = _mm512_set1_ps(half(b));
        const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2));
        const __m128i q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 18));
        lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0)), d);
        hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1)), d);
    } else {
        const int off = TYPE == kQ4_1 ? 4 : 2;
        const __m512 d = _mm512_set1_ps(half(b));
        const __m512 m = TYPE == kQ4_1 ? _mm512_set1_ps(half(b + 2)) : _mm512_set1_ps(-8.0f * half(b));
        const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + off)));
        const __m512i ql = _mm512_and_si512(q, _mm512_set1_epi32(15)), qh = _mm512_srli_epi32(q, 4);
        // d * q + m in one rounding (Q4_0: d * (q - 8) exactly as d * q - 8 d when both are exact in fp32)
        lo = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ql), d, m);
        hi = _mm512_fmadd_ps(_mm512_cvtepi32_ps(qh), d, m);
    }
    _mm512_storeu_si512(out, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));  // elements 0-15 from lo, 16-31 from hi
}

// 32 values of a row of x from p as 16 bf16 pairs: fp32 rounded to nearest even; bf16 as they stand (the fp32
// path's rounding of a widened bf16 value gives it back, bar denormals, which the tile multiply takes as zero)
inline __m512i row_pairs(const float* p) {
    return (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(p + 16), _mm512_loadu_ps(p));
}
inline __m512i row_pairs(const uint16_t* p) { return _mm512_loadu_si512(p); }

// x rows [0, M) (fp32 or bf16, ldx apart) -> B tiles: xb[(kb * MT + mt) * 256 + k * 16 + j] = the bf16 pair of
// row 16 mt + j at columns 32 kb + 2k, +1 (rows past M: zero)
template <typename X>
void pack_x(const X* x, int64_t ldx, int64_t M, int64_t K, std::vector<uint32_t>& xb) {
    const int64_t nb = K / 32, MT = (M + 15) / 16;
    xb.resize(size_t(nb * MT * 256));
    for (int64_t mt = 0; mt < MT; ++mt)
        for (int64_t kb = 0; kb < nb; ++kb) {
            __m512i r[16];
            for (int j = 0; j < 16; ++j) {
                const int64_t m = 16 * mt + j;
                r[j] = m < M ? row_pairs(x + m * ldx + 32 * kb) : _mm512_setzero_si512();
            }
            transpose16(r);
            uint32_t* dst = xb.data() + (kb * MT + mt) * 256;
            for (int k = 0; k < 16; ++k) _mm512_storeu_si512(dst + 16 * k, r[k]);
        }
}

// 16 fp32 -> bf16 as torch rounds: to nearest, ties to even; a NaN stays a NaN, made quiet (the bit
// arithmetic of decode_step.cpp's to_bf16, denormals kept, where VCVTNEPS2BF16 would flush them)
inline __m256i round_bf16(__m512i u) {
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
}

// one row's 16 fp32 outputs (bits in r) into y: as they are, or rounded to bf16
inline void store_row(float* y, __m512i r) { _mm512_storeu_si512(y, r); }
inline void store_row(uint16_t* y, __m512i r) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(y), round_bf16(r)); }

// a C tile stored to cbuf (16 weight rows x 16 x rows, fp32) -> y[m0 + j][n0 + i] for the rows j < mv
template <typename Y>
inline void store_c(Y* y, int64_t ldy, int64_t n0, int64_t m0, int64_t mv, const float* cbuf) {
    __m512i r[16];
    for (int i = 0; i < 16; ++i) r[i] = _mm512_load_si512(cbuf + 16 * i);
    transpose16(r);  // r[j] = x row m0 + j's 16 outputs
    for (int j = 0; j < mv; ++j) store_row(y + (m0 + j) * ldy + n0, r[j]);
}

// C tiles 0..NT-1 = sum over the K blocks kb of A(kb) . B(kb, mt0 + t): A(kb) = a_of(kb), the 16 weight
// rows from n0 at block kb (16 x 32 bf16, rows 64 bytes apart); then into y's rows 16 mt0.. (transposed)
template <int NT, typename AOf, typename Y>
inline void tile_pass(AOf a_of, int64_t nb, const uint32_t* xb, int64_t MT, int64_t mt0, int64_t M, Y* y,
                      int64_t ldy, int64_t n0) {
    alignas(64) float cbuf[256];
    _tile_zero(0);
    if constexpr (NT > 1) _tile_zero(1);
    if constexpr (NT > 2) _tile_zero(2);
    if constexpr (NT > 3) _tile_zero(3);
    for (int64_t kb = 0; kb < nb; ++kb) {
        const uint16_t* a = a_of(kb);
        TM_MEMORY_BARRIER();
        _tile_loadd(4, a, 64);
        const uint32_t* b = xb + (kb * MT + mt0) * 256;
        _tile_loadd(5, b, 64);
        _tile_dpbf16ps(0, 4, 5);
        if constexpr (NT > 1) {
            _tile_loadd(6, b + 256, 64);
            _tile_dpbf16ps(1, 4, 6);
        }
        if constexpr (NT > 2) {
            _tile_loadd(7, b + 512, 64);
            _tile_dpbf16ps(2, 4, 7);
        }
        if constexpr (NT > 3) {
            _tile_loadd(5, b + 768, 64);
            _tile_dpbf16ps(3, 4, 5);
        }
    }
    const int64_t m0 = 16 * mt0;
    auto valid = [&](int t) { const int64_t v = M - m0 - 16 * t; return v < 16 ? v : 16; };
    // the tile number is part of the instruction (the intrinsics are macros over it): one line per tile
    _tile_stored(0, cbuf, 64);
    TM_MEMORY_BARRIER();
    store_c(y, ldy, n0, m0, valid(0), cbuf);
    if constexpr (NT > 1) {
        _tile_stored(1, cbuf, 64);
        TM_MEMORY_BARRIER();
        store_c(y, ldy, n0, m0 + 16, valid(1), cbuf);
    }
    if constexpr (NT > 2) {
        _tile_stored(2, cbuf, 64);
        TM_MEMORY_BARRIER();
        store_c(y, ldy, n0, m0 + 32, valid(2), cbuf);
    }
    if constexpr (NT > 3) {
        _tile_stored(3, cbuf, 64);
        TM_MEMORY_BARRIER();
        store_c(y, ldy, n0, m0 + 48, valid(3), cbuf);
    }
}

template <int NT, typename AOf, typename Y>
inline void tile_pass_any(int nt, AOf a_of, int64_t nb, const uint32_t* xb, int64_t MT, int64_t mt0, int64_t M,
                          Y* y, int64_t ldy, int64_t n0) {
    switch (nt) {
        case 4: tile_pass<4>(a_of, nb, xb, MT, mt0, M, y, ldy, n0); break;
        case 3: tile_pass<3>(a_of, nb, xb, MT, mt0, M, y, ldy, n0); break;
        case 2: tile_pass<2>(a_of, nb, xb, MT, mt0, M, y, ldy, n0); break;
        default: tile_pass<1>(a_of, nb, xb, MT, mt0, M, y, ldy, n0); break;
    }
}

// Weight rows [16 c0, 16 c1) against all M rows of x (MT tiles of 16). Up to 64 rows (one pass of at most
// 4 C tiles) each block is dequantized just before its multiply, alternating two A buffers so that one
// block's dequantization need not wait for the tile load of the one before; past 64 rows the 16 weight
// rows are dequantized once into a panel (K/32 tiles) that every 64-row pass reads. Same values, same
// order of accumulation either way.
template <int TYPE, typename Y>
void rows_any(const uint8_t* W, int64_t K, int64_t c0, int64_t c1, const uint32_t* xb, int64_t MT, int64_t M,
              Y* y, int64_t ldy) {
    constexpr int64_t S = sub_blocks(TYPE);
    const int64_t nb = K / 32, bb = block_bytes(TYPE), row_bytes = nb / S * bb;
    alignas(64) uint16_t abuf[2][16 * 32];
    thread_local std::vector<uint16_t> panel;
    if (MT > 4) panel.resize(size_t(nb * 512));
    for (int64_t c = c0; c < c1; ++c) {
        const int64_t n0 = 16 * c;
        const uint8_t* wr = W + n0 * row_bytes;
        auto dequant = [&](int64_t kb, uint16_t* a) {
            // the 16 rows are 16 streams (row_bytes apart) that the hardware prefetcher does not keep ahead
            // of: asking for each row's block 6 ahead made the calls 1.10-1.20x faster at 1-16 rows (the
            // (3072, 576) Q4_1 layers, 30 or 120 of them, 1 or 2 threads, in one process against the
            // kernel without it; 0.96-1.15x at 64 rows; distances 3-24 alike). A prefetch never faults, so
            // one past the end of W is harmless.
            // (a super-block: the line of it 6 runs ahead, (kb + 6) / S blocks and that run's share of bb on)
            const int64_t ahead = (kb + 6) / S * bb + (kb + 6) % S * bb / S;
            for (int i = 0; i < 16; ++i) {
                _mm_prefetch(reinterpret_cast<const char*>(wr + i * row_bytes + ahead), _MM_HINT_T0);
                dequant_block<TYPE>(wr + i * row_bytes + kb / S * bb, int(kb % S), a + 32 * i);
            }
        };
        if (MT <= 4) {
            auto fused = [&](int64_t kb) {
                uint16_t* a = abuf[kb & 1];
                dequant(kb, a);
                return static_cast<const uint16_t*>(a);
            };
            tile_pass_any<4>(int(MT), fused, nb, xb, MT, 0, M, y, ldy, n0);
            continue;
        }
        uint16_t* p = panel.data();
        for (int64_t kb = 0; kb < nb; ++kb) dequant(kb, p + kb * 512);
        auto from_panel = [&](int64_t kb) { return static_cast<const uint16_t*>(p + kb * 512); };
        for (int64_t mt0 = 0; mt0 < MT; mt0 += 4)
            tile_pass_any<4>(int(MT - mt0 < 4 ? MT - mt0 : 4), from_panel, nb, xb, MT, mt0, M, y, ldy, n0);
    }
}

// X, Y: float or uint16_t (bf16) rows
template <int TYPE, typename X, typename Y>
void amx_matmul(const uint8_t* W, int64_t N, int64_t K, const X* x, int64_t ldx, int64_t M, Y* y,
                int64_t ldy, int nthreads) {
    thread_local std::vector<uint32_t> xb;
    pack_x(x, ldx, M, K, xb);
    TM_MEMORY_BARRIER();
    const int64_t MT = (M + 15) / 16, chunks = N / 16;
    const uint32_t* xbp = xb.data();
#if defined(_OPENMP)
    if (nthreads > 1 && chunks > 1) {
#pragma omp parallel num_threads(nthreads)
        {
            const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
            const int64_t c0 = chunks * t / nt, c1 = chunks * (t + 1) / nt;
            configure_tiles();
            rows_any<TYPE, Y>(W, K, c0, c1, xbp, MT, M, y, ldy);
            _tile_release();
        }
        return;
    }
#endif
    configure_tiles();
    rows_any<TYPE, Y>(W, K, 0, chunks, xbp, MT, M, y, ldy);
    _tile_release();
}

bool os_grants_tiles() {
    // Linux: a process asks once for the tile data state (ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
}

bool cpu_has_amx() {
    unsigned a, b, c, d;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
    const bool tile = d & (1u << 24), bf16 = d & (1u << 22), avx512bw = b & (1u << 30);
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(1));
    const bool avx512bf16 = a & (1u << 5);
    return tile && bf16 && avx512bw && avx512bf16;
}

#endif  // TM_AMX

}  // namespace

extern "C" int tm_amx_available();

namespace {

template <typename X, typename Y>
int amx_entry(int type, const void* W, int64_t N, int64_t K, const X* x, int64_t ldx, int64_t M, Y* y, int64_t ldy,
              int nthreads) {
    if (K % 32 || N % 16) return -2;
#ifdef TM_AMX
    if (!tm_amx_available()) return -3;
    if (M <= 0) return 0;
    const auto* w = static_cast<const uint8_t*>(W);
    if (sub_blocks(type) > 1 && K % 256) return -2;  // the K-quants' super-blocks
    switch (type) {
        case kQ4_0: amx_matmul<kQ4_0>(w, N, K, x, ldx, M, y, ldy, nthreads); return 0;
        case kQ4_1: amx_matmul<kQ4_1>(w, N, K, x, ldx, M, y, ldy, nthreads); return 0;
        case kQ8_0: amx_matmul<kQ8_0>(w, N, K, x, ldx, M, y, ldy, nthreads); return 0;
        case kQ4_K: amx_matmul<kQ4_K>(w, N, K, x, ldx, M, y, ldy, nthreads); return 0;
        case kQ5_K: amx_matmul<kQ5_K>(w, N, K, x, ldx, M, y, ldy, nthreads); return 0;
        case kQ6_K: amx_matmul<kQ6_K>(w, N, K, x, ldx, M, y, ldy, nthreads); return 0;
        default: return -1;
    }
#else
    (void)type, (void)W, (void)x, (void)ldx, (void)M, (void)y, (void)ldy, (void)nthreads;
    return -3;
#endif
}

}  // namespace

extern "C" {

int tm_amx_available() {
#ifdef TM_AMX
    static const int ok = cpu_has_amx() && os_grants_tiles();
    return ok;
#else
    return 0;
#endif
}

// See the header. 0; -1 a type it does not take; -2 K % 32 or N % 16; -3 no AMX here.
int tm_amx_matmul(int type, const void* W, int64_t N, int64_t K, const float* x, int64_t ldx, int64_t M, float* y,
                  int64_t ldy, int nthreads) {
    return amx_entry(type, W, N, K, x, ldx, M, y, ldy, nthreads);
}

// x, y: bf16 (uint16_t) rows, ldx and ldy elements apart; statuses as tm_amx_matmul's
int tm_amx_matmul_bf16(int type, const void* W, int64_t N, int64_t K, const uint16_t* x, int64_t ldx, int64_t M,
                       uint16_t* y, int64_t ldy, int nthreads) {
    return amx_entry(type, W, N, K, x, ldx, M, y, ldy, nthreads);
}

int tm_block_matmul(int type, const void* W, int64_t N, int64_t K, const float* x, int64_t ldx, int64_t M, float* y,
                    int64_t ldy, int nthreads);  // block_matmul.cpp, in the same library

// Rows [starts[g], starts[g] + counts[g]) of x (M, K) times W[g] (N, K), into the same rows of y (M, N): a
// group of at least min_rows rows exactly what tm_amx_matmul on its rows gives, a smaller one what
// tm_block_matmul gives (the callers' rule for one matrix: block_matmul.AMX_MIN_ROWS).
int tm_amx_matmul_grouped(int type, const void* const* W, int64_t groups, const int64_t* starts,
                          const int64_t* counts, int64_t N, int64_t K, const float* x, int64_t M, float* y,
                          int nthreads, int64_t min_rows) {
    (void)M;
    for (int64_t g = 0; g < groups; ++g) {
        if (counts[g] <= 0) continue;
        const auto fn = counts[g] >= min_rows ? tm_amx_matmul : tm_block_matmul;
        const int rc = fn(type, W[g], N, K, x + starts[g] * K, K, counts[g], y + starts[g] * N, N, nthreads);
        if (rc) return rc;
    }
    return 0;
}

}  // extern "C"
