// y = x . W^T for a GGUF matrix W kept in its file's blocks (Q4_0, Q4_1, Q8_0), for batches of rows, in 8-bit
// integer arithmetic on AVX512-VNNI (`vpdpbusd`: 64 byte products a 512-bit instruction, twice bf16's
// `vdpbf16ps`): the panel kernel of CPUs that have VNNI and no AMX (Zen 4, Intel before Sapphire Rapids),
// where oneDNN's bf16 or fp32 matmul on a dense copy is otherwise what runs past the block kernels' crossover.
//
// Per call: x is quantized row by row to int8 per 32-block as llama.cpp's Q8_1 (d = max|x| / 127, q =
// round(x / d), s = d * sum q). Per work item, 16 weight rows are unpacked from their blocks into a panel that
// stays in L1/L2: per 32-block, eight 512-bit vectors whose lane j holds 4 consecutive weights of row j as
// unsigned bytes (u = q for Q4_1's nibbles, q for Q4_0's (its -8 moved into m), q + 128 for Q8_0), and the
// rows' d and m as fp32 (w = d * u + m: Q4_1's m; -8 d for Q4_0; -128 d for Q8_0). Each tile of x rows then
// runs over the panel: per block, eight `vpdpbusd` per row (the weight vector times 4 broadcast bytes of x)
// give the 16 rows' integer dot products, and y += (isum * dw) * dx + mw * sx in fp32.
// The weights are read from their blocks once per 256-row chunk of x (4.5-8.5 bits a weight; no dense copy
// is kept), the unpacking is paid once per chunk rather than per row.
//
// Plain C++ (no torch, no ggml headers), in block_matmul.py's library, called through ctypes and from the native
// decode step (decode_step.cpp's kernel table, as the panel kernel).
//
//   tm_vnni_matmul(type, W, N, K, x, ldx, M, y, ldy, nthreads): tm_block_matmul's arguments and layouts.
//
// Numerics: llama.cpp's (x at 8 bits per 32-block; the weights exact): ~5e-3 relative to the fp32 product.
// Invariant: y[m, n] is computed by the same instructions in the same order whatever M, the row's place in
// the batch or the thread count: a row gives the same bits alone or in any batch.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>
#if defined(_OPENMP)
#include <omp.h>
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__F16C__) && \
    !defined(TM_PORTABLE)
#include <immintrin.h>
#define TM_VNNI 1
#endif

// panel_matmul.cpp, the same library (hidden: not the ABI)
__attribute__((visibility("hidden"))) void* tm_scratch(std::vector<uint8_t>& v, size_t bytes);
__attribute__((visibility("hidden"))) void tm_prefetch_share(const char* next, int64_t bytes, int64_t parts,
                                                             int64_t part);

namespace {

#ifdef TM_VNNI
enum : int { kQ4_0 = 2, kQ4_1 = 3, kQ8_0 = 8 };  // ggml's type numbers
constexpr int NR = 16;                           // weight rows (output columns) a panel: the 16 lanes
constexpr int MR = 8;                            // rows of x a tile
constexpr int64_t PIECE = 8 * 64 + 2 * 64;       // a panel's bytes a 32-block: 8 vectors of u8, dw[16], mw[16]
constexpr int64_t CHUNK = 256;                   // rows of x a panel is unpacked for

template <int TYPE>
constexpr int64_t block_bytes() {
    return TYPE == kQ4_0 ? 18 : TYPE == kQ4_1 ? 20 : 34;
}

// x row (K) -> q (K int8), d and s (one each a 32-block)
void quantize_row(const float* x, int64_t K, int8_t* q, float* d, float* s) {
    for (int64_t b = 0; b < K / 32; ++b) {
        const __m512 a0 = _mm512_loadu_ps(x + 32 * b), a1 = _mm512_loadu_ps(x + 32 * b + 16);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a0), _mm512_abs_ps(a1)));
        const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
        const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(a0, _mm512_set1_ps(id)));  // to nearest, ties even
        const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(a1, _mm512_set1_ps(id)));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 32 * b), _mm512_cvtsepi32_epi8(q0));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 32 * b + 16), _mm512_cvtsepi32_epi8(q1));
        d[b] = amax / 127.0f;
        s[b] = d[b] * float(_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1)));
    }
}

// weight rows [n0, n0 + nc) (nc <= NR; lanes past nc zero) -> panel (K / 32 pieces), by gathers down the rows
template <int TYPE>
void make_panel(const uint8_t* W, int64_t n0, int nc, int64_t K, uint8_t* panel) {
    const int64_t nb = K / 32, rb = nb * block_bytes<TYPE>();
    const __mmask16 live = nc >= NR ? __mmask16(0xffff) : __mmask16((1u << nc) - 1);
    const __m512i rows = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                            _mm512_set1_epi32(int32_t(rb)));
    const __m512i nib = _mm512_set1_epi8(0x0f), zero = _mm512_setzero_si512();
    const uint8_t* base = W + n0 * rb;
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = base + b * block_bytes<TYPE>();
        uint8_t* p = panel + b * PIECE;
        // the first 4 bytes of each row's block: d (and Q4_1's m) as halves
        const __m512i head = _mm512_mask_i32gather_epi32(zero, live, rows, blk, 1);
        const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(head));
        __m512 m;
        if constexpr (TYPE == kQ8_0) {
            m = _mm512_mul_ps(d, _mm512_set1_ps(-128.0f));
            for (int g = 0; g < 8; ++g) {
                const __m512i q = _mm512_mask_i32gather_epi32(zero, live, rows, blk + 2 + 4 * g, 1);
                // signed bytes + 128: xor the sign bit (zero lanes stay zero: their d is zero)
                _mm512_store_si512(p + 64 * g, _mm512_maskz_xor_epi32(live, q, _mm512_set1_epi8(char(0x80))));
            }
        } else {
            m = TYPE == kQ4_1 ? _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(head, 16)))
                              : _mm512_mul_ps(d, _mm512_set1_ps(-8.0f));
            constexpr int qs = TYPE == kQ4_1 ? 4 : 2;
            for (int g = 0; g < 4; ++g) {  // bytes 4g..4g+3: elements 4g.. in the low nibbles, 16 + 4g.. high
                const __m512i q = _mm512_mask_i32gather_epi32(zero, live, rows, blk + qs + 4 * g, 1);
                _mm512_store_si512(p + 64 * g, _mm512_and_si512(q, nib));
                _mm512_store_si512(p + 64 * (g + 4), _mm512_and_si512(_mm512_srli_epi16(q, 4), nib));
            }
        }
        _mm512_store_ps(reinterpret_cast<float*>(p + 512), d);
        _mm512_store_ps(reinterpret_cast<float*>(p + 576), m);
    }
}

// R (<= MR) rows of quantized x (rows K bytes apart; d and s K / 32 apart) times the panel -> y (R rows ldy
// apart, the first nc columns)
template <int R>
void tile(const uint8_t* panel, int64_t K, const int8_t* xq, const float* xd, const float* xs, float* y,
          int64_t ldy, int nc) {
    const int64_t nb = K / 32;
    __m512 acc[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* p = panel + b * PIECE;
        __m512i ia[R];
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) ia[r] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int g = 0; g < 8; ++g) {
            const __m512i w = _mm512_load_si512(p + 64 * g);
#pragma GCC unroll 8
            for (int r = 0; r < R; ++r) {
                int32_t four;
                std::memcpy(&four, xq + r * K + 32 * b + 4 * g, 4);
                ia[r] = _mm512_dpbusd_epi32(ia[r], w, _mm512_set1_epi32(four));
            }
        }
        const __m512 dw = _mm512_load_ps(reinterpret_cast<const float*>(p + 512));
        const __m512 mw = _mm512_load_ps(reinterpret_cast<const float*>(p + 576));
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

template <typename T>
T* scratch(std::vector<uint8_t>& v, size_t bytes) {
    return static_cast<T*>(tm_scratch(v, bytes));
}

template <int TYPE>
void vnni_matmul(const uint8_t* W, int64_t N, int64_t K, const float* x, int64_t ldx, int64_t M, float* y,
                 int64_t ldy, int nthreads) {
    if (M <= 0 || N <= 0) return;
    const int64_t nb = K / 32, items = (N + NR - 1) / NR, rb = nb * block_bytes<TYPE>();
    thread_local std::vector<uint8_t> qbuf, sbuf;
    int8_t* xq = scratch<int8_t>(qbuf, size_t(M * K));
    float* xd = scratch<float>(sbuf, size_t(2 * M * nb * 4));
    float* xs = xd + M * nb;
    auto quantize = [&](int64_t r) { quantize_row(x + r * ldx, K, xq + r * K, xd + r * nb, xs + r * nb); };
    auto item = [&](int64_t it, int64_t m0, int64_t m1, uint8_t* panel) {
        const int64_t n0 = it * NR;
        const int nc = int(std::min<int64_t>(NR, N - n0));
        make_panel<TYPE>(W, n0, nc, K, panel);
        // the next item's weight rows (this thread's next, under the static schedule) asked into L2 while this
        // item's tiles run, a share before each tile (tm_prefetch_share)
        const int64_t tiles = (m1 - m0 + MR - 1) / MR;
        const char* next = reinterpret_cast<const char*>(W + (n0 + NR) * rb);
        const int64_t bytes = std::max<int64_t>(0, std::min<int64_t>(NR, N - n0 - NR)) * rb;
        for (int64_t t = 0; t < tiles; ++t) {
            tm_prefetch_share(next, bytes, tiles, t);
            const int64_t r = m0 + t * MR;
            const int8_t* q = xq + r * K;
            const float *d = xd + r * nb, *s = xs + r * nb;
            float* yt = y + r * ldy + n0;
            switch (std::min<int64_t>(MR, m1 - r)) {
                case 8: tile<8>(panel, K, q, d, s, yt, ldy, nc); break;
                case 7: tile<7>(panel, K, q, d, s, yt, ldy, nc); break;
                case 6: tile<6>(panel, K, q, d, s, yt, ldy, nc); break;
                case 5: tile<5>(panel, K, q, d, s, yt, ldy, nc); break;
                case 4: tile<4>(panel, K, q, d, s, yt, ldy, nc); break;
                case 3: tile<3>(panel, K, q, d, s, yt, ldy, nc); break;
                case 2: tile<2>(panel, K, q, d, s, yt, ldy, nc); break;
                default: tile<1>(panel, K, q, d, s, yt, ldy, nc); break;
            }
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
            uint8_t* panel = scratch<uint8_t>(pbuf, size_t(nb * PIECE));
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
    uint8_t* panel = scratch<uint8_t>(pbuf, size_t(nb * PIECE));
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
int tm_vnni_matmul(int type, const void* W, int64_t N, int64_t K, const float* x, int64_t ldx, int64_t M,
                   float* y, int64_t ldy, int nthreads) {
#ifdef TM_VNNI
    if (K % 32) return -2;
    const auto* w = static_cast<const uint8_t*>(W);
    switch (type) {
        case kQ4_0: vnni_matmul<kQ4_0>(w, N, K, x, ldx, M, y, ldy, nthreads); return 0;
        case kQ4_1: vnni_matmul<kQ4_1>(w, N, K, x, ldx, M, y, ldy, nthreads); return 0;
        case kQ8_0: vnni_matmul<kQ8_0>(w, N, K, x, ldx, M, y, ldy, nthreads); return 0;
        default: return tm_block_matmul(type, W, N, K, x, ldx, M, y, ldy, nthreads);
    }
#else
    return tm_panel_matmul(type, W, N, K, x, ldx, M, y, ldy, nthreads);
#endif
}

}  // extern "C"
