// MEASURED, NOT KEPT (benchmarks/README.md, 2026-12-06): an experiment, not part of the package; built only by
// benchmarks/experiments/amx_int8_vs.py. On the AMX Xeon it lost to the integer kernel at one row (the tile
// unit alone, weight tiles formed once, already took ~50 us of the integer kernel's 56 on a (1536, 576) Q4_1
// matrix) and to the bf16 AMX kernel from ~7 rows.
//
// y = x . W^T for a GGUF matrix W in its file's blocks (Q4_0, Q4_1, Q8_0) on Intel AMX's integer tiles, with
// x quantized as block_matmul.cpp quantizes it (per row and 32-block, to 16 bits: d = amax / 32767): the
// same integer sums of products as that kernel, taken by the tile unit. A 16-bit x is two 8-bit tiles, its
// high bytes (signed) and its low bytes (unsigned), so each 32-block's sum is 256 C_hi + C_lo, exact in
// int32. The weights go into the tiles as the file has them (4-bit or 8-bit integers), with no conversion to
// floats: the work per weight is a byte transpose of 16 rows at a time, where the bf16 AMX kernel
// (amx_matmul.cpp) dequantizes every weight to bf16 and the integer kernel (block_matmul.cpp) multiplies
// every weight into every row on the vector units. So from one row to 16 a call costs about what reading
// the blocks costs.
//
// Built into the block-matmul library (block_matmul.py) from the same -march=native compile: on a CPU
// without AMX-INT8 the entry points exist and answer "unavailable" (-3).
//
//   tm_amx8_matmul(type, W, N, K, x, ldx, M, y, ldy, nthreads)        as tm_block_matmul; N % 16 == 0, K % 32 == 0
//   tm_amx8_matmul_bf16(type, W, N, K, x, ldx, M, y, ldy, nthreads)   bf16 rows in and out (x widened to fp32
//                                                                      first, y rounded to nearest even)
//   tm_amx8_available()   1 when the CPU has the integer tiles and the OS lets this process use them
//
// Layout (the tile multiply C[m][n] += sum over k of A[m][k] * B[k / 4][4 n + k % 4], 8-bit products, int32 sums):
//   A = 16 rows of x (fewer for M < 16: the tiles are configured to M rows) over one 32-block: two tiles,
//       the high and the low bytes of the 16-bit values, made once per call;
//   B = 16 weight rows n0..n0+15 over the same block, 8 rows of 64 bytes (k = 4r..4r+3 of each weight row):
//       for the 4-bit types rows 0-3 are the low nibbles of the block's 16 bytes and rows 4-7 the high
//       nibbles, so B is a 16 x 4 transpose of 32-bit words and two masks;
//   C = two tiles (x rows x 16 weight rows) of int32, read back after each block: the block's scales are
//       per (row, block) on both sides, so each block's sums are scaled in fp32 on the vector unit:
//       acc[m] += (256 C_hi + C_lo) * (dw * xd[m]) + mw * xs[m]   (mw: Q4_1's min, Q4_0's -8 dw; xs = xd sum q).
//
// Invariant: y[m, n] depends only on x[m, :] and W[n, :]: each output adds its blocks in order of K, one fma
// pair a block, whatever M, the row tiling or the thread count. So a row gives the same bits alone or in a
// batch (and this kernel serves every row count where it runs).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>
#if defined(_OPENMP)
#include <omp.h>
#endif

#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__F16C__) && defined(__linux__) && !defined(TM_PORTABLE)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define TM_AMX8 1
#endif

// block_matmul.cpp's activation quantizer, in the same library (hidden: not the ABI)
__attribute__((visibility("hidden"))) void tm_quantize_rows16(const float* x, int64_t ldx, int64_t M, int64_t K,
                                                             int64_t group, float qmax, int layout,
                                                             std::vector<int16_t>& q, std::vector<float>& d,
                                                             std::vector<float>& s);

namespace {

enum : int { kQ4_0 = 2, kQ4_1 = 3, kQ8_0 = 8 };  // ggml's type numbers

constexpr int64_t block_bytes(int type) { return type == kQ4_0 ? 18 : type == kQ4_1 ? 20 : 34; }

#ifdef TM_AMX8

// GCC's tile intrinsics are asm statements that do not tell the compiler they read or write memory: a
// barrier before each tile load and after each tile store (as amx_matmul.cpp)
#define TM_MEMORY_BARRIER() asm volatile("" ::: "memory")

struct alignas(64) TileConfig {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
};

// tmm0, tmm1 and tmm5, tmm6: C_hi, C_lo of two weight chunks (rows x 16 int32); tmm2, tmm3: A_hi, A_lo (rows
// x 32 bytes); tmm4, tmm7: the two chunks' B (8 x 64 bytes)
inline void configure_tiles(int rows) {
    TileConfig cfg;
    for (int t : {0, 1, 5, 6}) {
        cfg.rows[t] = uint8_t(rows);
        cfg.colsb[t] = 64;
    }
    for (int t : {2, 3}) {
        cfg.rows[t] = uint8_t(rows);
        cfg.colsb[t] = 32;
    }
    for (int t : {4, 7}) {
        cfg.rows[t] = 8;
        cfg.colsb[t] = 64;
    }
    TM_MEMORY_BARRIER();
    _tile_loadconfig(&cfg);
}

// 16 rows' 16 bytes at p, p + stride, .. -> q[j] = 32-bit word j of every row (lane i: row i)
inline void transpose16x4(const uint8_t* p, int64_t stride, __m512i* q) {
    __m512i z[4];  // z[d], 128-bit lane l: row 4 l + d
    for (int d = 0; d < 4; ++d) {
        __m512i v = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + d * stride)));
        v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + (4 + d) * stride)), 1);
        v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + (8 + d) * stride)), 2);
        z[d] = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + (12 + d) * stride)), 3);
    }
    const __m512i t0 = _mm512_unpacklo_epi32(z[0], z[1]), t1 = _mm512_unpackhi_epi32(z[0], z[1]);
    const __m512i t2 = _mm512_unpacklo_epi32(z[2], z[3]), t3 = _mm512_unpackhi_epi32(z[2], z[3]);
    q[0] = _mm512_unpacklo_epi64(t0, t2);  // lane 4 l + d: word 0 of row 4 l + d
    q[1] = _mm512_unpackhi_epi64(t0, t2);
    q[2] = _mm512_unpacklo_epi64(t1, t3);
    q[3] = _mm512_unpackhi_epi64(t1, t3);
}

// The B tile (512 bytes at bt) and the scales of 16 weight rows' block at w (rows row_bytes apart): dw[i]
// (the block's d) and mw[i] (its offset per unit of x: Q4_1's m, Q4_0's -8 d, Q8_0's 0)
template <int TYPE>
inline void form_b(const uint8_t* w, int64_t row_bytes, uint8_t* bt, __m512& dw, __m512& mw) {
    alignas(64) uint32_t head[16];
    for (int i = 0; i < 16; ++i) std::memcpy(head + i, w + i * row_bytes, 4);  // d (and m): the first 2 (4) bytes
    const __m512i h = _mm512_load_si512(head);
    dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h));
    if constexpr (TYPE == kQ4_1) {
        mw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(h, 16)));
    } else if constexpr (TYPE == kQ4_0) {
        mw = _mm512_mul_ps(dw, _mm512_set1_ps(-8.0f));
    } else {
        mw = _mm512_setzero_ps();
    }
    __m512i q[4];
    if constexpr (TYPE == kQ8_0) {
        transpose16x4(w + 2, row_bytes, q);  // values 0-15
        for (int r = 0; r < 4; ++r) _mm512_storeu_si512(bt + 64 * r, q[r]);
        transpose16x4(w + 18, row_bytes, q);  // values 16-31
        for (int r = 0; r < 4; ++r) _mm512_storeu_si512(bt + 64 * (4 + r), q[r]);
    } else {
        transpose16x4(w + (TYPE == kQ4_1 ? 4 : 2), row_bytes, q);
        const __m512i nib = _mm512_set1_epi8(0x0f);
        for (int r = 0; r < 4; ++r) {
            _mm512_storeu_si512(bt + 64 * r, _mm512_and_si512(q[r], nib));  // values 4r..4r+3: low nibbles
            _mm512_storeu_si512(bt + 64 * (4 + r), _mm512_and_si512(_mm512_srli_epi32(q[r], 4), nib));  // 16 + 4r..
        }
    }
}

// the block's two tile products: C_hi += A_hi . B, C_lo += A_lo . B with the signedness of each operand (x's
// high bytes signed, its low bytes unsigned; 4-bit weights unsigned, Q8_0's signed). SET 0: C tiles 0, 1 and
// B tile 4; SET 1: 5, 6 and 7 (the tile numbers are part of the instructions: the intrinsics are macros)
template <int TYPE, int SET>
inline void multiply_block() {
    if constexpr (TYPE == kQ8_0 && SET == 0) {
        _tile_dpbssd(0, 2, 4);
        _tile_dpbusd(1, 3, 4);
    } else if constexpr (TYPE == kQ8_0) {
        _tile_dpbssd(5, 2, 7);
        _tile_dpbusd(6, 3, 7);
    } else if constexpr (SET == 0) {
        _tile_dpbsud(0, 2, 4);
        _tile_dpbuud(1, 3, 4);
    } else {
        _tile_dpbsud(5, 2, 7);
        _tile_dpbuud(6, 3, 7);
    }
}

inline void store_row(float* y, __m512 v) { _mm512_storeu_ps(y, v); }
// fp32 -> bf16 as torch rounds: to nearest, ties to even; NaN stays NaN (amx_matmul.cpp's rounding)
inline void store_row(uint16_t* y, __m512 v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y), _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet)));
}

// x, quantized, as the tiles take it: per (block b, tile mt of 16 rows) the A_hi and A_lo tiles (16 rows of 32
// bytes each; rows past M zero) at xa + 1024 (b MT + mt), and per (row, block) the scale d and s = d sum q
struct PackedX {
    std::vector<int16_t> q;
    std::vector<float> d, s;
    std::vector<uint8_t> xa;
};

void pack_x(const float* x, int64_t ldx, int64_t M, int64_t K, PackedX& px) {
    tm_quantize_rows16(x, ldx, M, K, 32, 32767.0f, 0, px.q, px.d, px.s);
    const int64_t nb = K / 32, MT = (M + 15) / 16;
    px.xa.assign(size_t(nb * MT * 1024), 0);
    for (int64_t m = 0; m < M; ++m)
        for (int64_t b = 0; b < nb; ++b) {
            const __m512i v = _mm512_loadu_si512(px.q.data() + m * K + 32 * b);  // 32 int16
            uint8_t* tile = px.xa.data() + 1024 * (b * MT + m / 16) + 32 * (m % 16);
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(tile), _mm512_cvtepi16_epi8(_mm512_srai_epi16(v, 8)));
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(tile + 512), _mm512_cvtepi16_epi8(v));  // low bytes
        }
}

// The tile products of weight chunks c and c + 1 (G = 2, sharing the x tiles) or c alone (G = 1) over all K
// blocks, against x's row tile mt: the C tiles accumulate from block to block (no read between, so the tile
// unit runs the blocks back to back) and are stored after each, cumulative, to cb: chunk g's C_hi after block
// b at cb + 32 rows (2 b + 2 g nb) ... see rows_amx8. form(b, g, tile) gives chunk g's B tile at block b.
template <int TYPE, int G, typename Form>
inline void tile_products(int64_t nb, int64_t MT, int64_t mt, const uint8_t* xa, int rows, Form form, int32_t* cb) {
    alignas(64) uint8_t bt[G][512];
    _tile_zero(0);
    _tile_zero(1);
    if constexpr (G == 2) {
        _tile_zero(5);
        _tile_zero(6);
    }
    const int64_t step = 16 * int64_t(rows);  // int32 of one stored C tile
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* t0 = form(b, 0, bt[0]);
        const uint8_t* t1 = G == 2 ? form(b, 1, bt[G - 1]) : nullptr;
        const uint8_t* a = xa + 1024 * (b * MT + mt);
        TM_MEMORY_BARRIER();
        _tile_loadd(2, a, 32);
        _tile_loadd(3, a + 512, 32);
        _tile_loadd(4, t0, 64);
        multiply_block<TYPE, 0>();
        int32_t* c = cb + 2 * G * step * b;
        _tile_stored(0, c, 64);
        _tile_stored(1, c + step, 64);
        if constexpr (G == 2) {
            _tile_loadd(7, t1, 64);
            multiply_block<TYPE, 1>();
            _tile_stored(5, c + 2 * step, 64);
            _tile_stored(6, c + 3 * step, 64);
        }
    }
    TM_MEMORY_BARRIER();
}

// weight rows [16 c0, 16 c1) against the packed rows of x -> y (rows ldy apart). For one tile of x rows each
// block's B tiles are formed just before their multiply; for more, a weight chunk's B tiles and scales are
// formed once into a panel that each tile of x rows reads. After a chunk's products, each block's sums are
// the differences of the cumulative C tiles (exact: int32 arithmetic wraps, and a block's sum fits), scaled
// in block order.
template <int TYPE, typename Y>
void rows_amx8(const uint8_t* W, int64_t K, int64_t c0, int64_t c1, const PackedX& px, int64_t M, Y* y, int64_t ldy) {
    const int64_t nb = K / 32, bb = block_bytes(TYPE), row_bytes = nb * bb, MT = (M + 15) / 16;
    const int rows = M < 16 ? int(M) : 16;
    const int64_t step = 16 * int64_t(rows);
    thread_local std::vector<uint8_t> panel;   // per (chunk of the pair, block): the B tile
    thread_local std::vector<float> scales;    // per (chunk of the pair, block): dw, then mw (16 floats each)
    thread_local std::vector<int32_t> cbuf;    // the stored C tiles, cumulative
    panel.resize(size_t(2 * nb * 512));
    scales.resize(size_t(2 * nb * 32));
    cbuf.resize(size_t(4 * nb * step));
    const float *xd = px.d.data(), *xs = px.s.data();
    for (int64_t c = c0; c < c1;) {
        const int G = c + 1 < c1 ? 2 : 1;
        auto make = [&](int64_t b, int g, uint8_t* tile) {
            const uint8_t* wr = W + 16 * (c + g) * row_bytes;
            // 16 streams row_bytes apart: ask for each row's block 6 ahead (as amx_matmul.cpp; a prefetch
            // past the end of W never faults)
            for (int i = 0; i < 16; ++i)
                _mm_prefetch(reinterpret_cast<const char*>(wr + i * row_bytes + (b + 6) * bb), _MM_HINT_T0);
            __m512 dw, mw;
#ifdef TM_FAKE_B  // the tile unit's own cost: the first tile formed once, reused for every block
            static thread_local bool formed = false;
            if (!formed) form_b<TYPE>(wr + b * bb, row_bytes, tile, dw, mw), formed = true;
            dw = mw = _mm512_set1_ps(1.0f);
#else
            form_b<TYPE>(wr + b * bb, row_bytes, tile, dw, mw);
#endif
            float* sc = scales.data() + 32 * (g * nb + b);
            _mm512_storeu_ps(sc, dw);
            _mm512_storeu_ps(sc + 16, mw);
            return static_cast<const uint8_t*>(tile);
        };
        if (MT > 1)  // the pair's B tiles once, for every row tile
            for (int g = 0; g < G; ++g)
                for (int64_t b = 0; b < nb; ++b) make(b, g, panel.data() + 512 * (g * nb + b));
        for (int64_t mt = 0; mt < MT; ++mt) {
            auto fused = [&](int64_t b, int g, uint8_t* tile) { return make(b, g, tile); };
            auto from_panel = [&](int64_t b, int g, uint8_t*) {
                return static_cast<const uint8_t*>(panel.data() + 512 * (g * nb + b));
            };
            const uint8_t* xa = px.xa.data();
            if (G == 2) {
                if (MT > 1) tile_products<TYPE, 2>(nb, MT, mt, xa, rows, from_panel, cbuf.data());
                else tile_products<TYPE, 2>(nb, MT, mt, xa, rows, fused, cbuf.data());
            } else {
                if (MT > 1) tile_products<TYPE, 1>(nb, MT, mt, xa, rows, from_panel, cbuf.data());
                else tile_products<TYPE, 1>(nb, MT, mt, xa, rows, fused, cbuf.data());
            }
            const int64_t m0 = 16 * mt, mv = std::min<int64_t>(16, M - m0);
            for (int g = 0; g < G; ++g)
                for (int64_t m = 0; m < mv; ++m) {
                    __m512 acc = _mm512_setzero_ps();
                    __m512i prev_hi = _mm512_setzero_si512(), prev_lo = _mm512_setzero_si512();
                    for (int64_t b = 0; b < nb; ++b) {
                        const int32_t* cc = cbuf.data() + 2 * G * step * b + 2 * g * step + 16 * m;
                        const __m512i hi = _mm512_loadu_si512(cc), lo = _mm512_loadu_si512(cc + step);
                        const __m512i sum = _mm512_add_epi32(_mm512_slli_epi32(_mm512_sub_epi32(hi, prev_hi), 8),
                                                             _mm512_sub_epi32(lo, prev_lo));
                        prev_hi = hi, prev_lo = lo;
                        const float* sc = scales.data() + 32 * (g * nb + b);
                        const int64_t xi = (m0 + m) * nb + b;
                        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(_mm512_loadu_ps(sc), _mm512_set1_ps(xd[xi])), acc);
                        if constexpr (TYPE != kQ8_0) acc = _mm512_fmadd_ps(_mm512_loadu_ps(sc + 16), _mm512_set1_ps(xs[xi]), acc);
                    }
                    store_row(y + (m0 + m) * ldy + 16 * (c + g), acc);
                }
        }
        c += G;
    }
}

template <int TYPE, typename Y>
void amx8_matmul(const uint8_t* W, int64_t N, int64_t K, const float* x, int64_t ldx, int64_t M, Y* y, int64_t ldy,
                 int nthreads) {
    thread_local PackedX px;
    pack_x(x, ldx, M, K, px);
    const PackedX* pp = &px;  // a thread_local named in the parallel region would be each thread's own
    const int rows = M < 16 ? int(M) : 16;
    const int64_t chunks = N / 16;
#if defined(_OPENMP)
    if (nthreads > 1 && chunks > 1) {
#pragma omp parallel num_threads(nthreads)
        {
            const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
            configure_tiles(rows);
            rows_amx8<TYPE, Y>(W, K, chunks * t / nt, chunks * (t + 1) / nt, *pp, M, y, ldy);
            _tile_release();
        }
        return;
    }
#endif
    (void)nthreads;
    configure_tiles(rows);
    rows_amx8<TYPE, Y>(W, K, 0, chunks, *pp, M, y, ldy);
    _tile_release();
}

bool cpu_has_amx_int8() {
    unsigned a, b, c, d;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
    const bool tile = d & (1u << 24), int8 = d & (1u << 25), avx512bw = b & (1u << 30), avx512vl = b & (1u << 31);
    return tile && int8 && avx512bw && avx512vl;
}

bool os_grants_tiles() {
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;  // ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA (amx_matmul.cpp)
}

#endif  // TM_AMX8

}  // namespace

extern "C" int tm_amx8_available();

namespace {

// statuses: 0; -1 a type it does not take; -2 K % 32 or N % 16; -3 no AMX-INT8 here
template <typename Y>
int amx8_entry(int type, const void* W, int64_t N, int64_t K, const float* x, int64_t ldx, int64_t M, Y* y,
               int64_t ldy, int nthreads) {
    if (type != kQ4_0 && type != kQ4_1 && type != kQ8_0) return -1;
    if (K % 32 || N % 16) return -2;
#ifdef TM_AMX8
    if (!tm_amx8_available()) return -3;
    if (M <= 0) return 0;
    const auto* w = static_cast<const uint8_t*>(W);
    switch (type) {
        case kQ4_0: amx8_matmul<kQ4_0>(w, N, K, x, ldx, M, y, ldy, nthreads); return 0;
        case kQ4_1: amx8_matmul<kQ4_1>(w, N, K, x, ldx, M, y, ldy, nthreads); return 0;
        default: amx8_matmul<kQ8_0>(w, N, K, x, ldx, M, y, ldy, nthreads); return 0;
    }
#else
    (void)W, (void)x, (void)ldx, (void)M, (void)y, (void)ldy, (void)nthreads;
    return -3;
#endif
}

}  // namespace

extern "C" {

int tm_amx8_available() {
#ifdef TM_AMX8
    static const int ok = cpu_has_amx_int8() && os_grants_tiles();
    return ok;
#else
    return 0;
#endif
}

// See the header.
int tm_amx8_matmul(int type, const void* W, int64_t N, int64_t K, const float* x, int64_t ldx, int64_t M, float* y,
                   int64_t ldy, int nthreads) {
    return amx8_entry(type, W, N, K, x, ldx, M, y, ldy, nthreads);
}

// x, y: bf16 (uint16_t) rows, ldx and ldy elements apart: x widened to fp32, then as tm_amx8_matmul, y rounded
int tm_amx8_matmul_bf16(int type, const void* W, int64_t N, int64_t K, const uint16_t* x, int64_t ldx, int64_t M,
                        uint16_t* y, int64_t ldy, int nthreads) {
    thread_local std::vector<float> xf;
    xf.resize(size_t(std::max<int64_t>(M, 0) * K));
    for (int64_t m = 0; m < M; ++m)
        for (int64_t k = 0; k < K; ++k) {
            const uint32_t u = uint32_t(x[m * ldx + k]) << 16;
            std::memcpy(&xf[size_t(m * K + k)], &u, 4);
        }
    return amx8_entry(type, W, N, K, xf.data(), K, M, y, ldy, nthreads);
}

}  // extern "C"
