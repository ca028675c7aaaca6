// y = x . W^T for a GGUF matrix W kept in its file's blocks (Q4_0, Q4_1, Q8_0), for batches of rows (decode
// steps of tens of rows, mixed prefill steps): the fp32 path that block_matmul.cpp's integer kernel is not.
// Each work item dequantizes 16 weight rows into an fp32 panel that stays in L2 ((K, 16): k-major, 16 output
// columns a k), and every 6-row tile of x (packed once per call, (K, 6) a tile) runs the classic
// outer-product microkernel over it: per k, two panel loads, six broadcasts of x, twelve fmas into a 6x16
// register tile. The weights are read from their blocks once per call (4.5-8.5 bits a weight), their
// dequantization is paid once per call rather than once per row, and the multiply-adds run at the FMA
// units' rate. Where the integer kernel takes two 16-bit multiply-adds, a convert and a float fma per eight
// products, and peaks near 90 GFLOPS on a 2-core AVX2 EPYC, this one measured 150-190 at 64-512 rows
// (benchmarks/README.md, "An fp32 panel kernel"); below ~16-32 rows the integer kernel's single pass wins.
//
// Plain C++ (no torch, no ggml headers), built into block_matmul.py's library, called through ctypes and
// from the native decode step (decode_step.cpp's kernel table).
//
//   tm_panel_matmul(type, W, N, K, x, ldx, M, y, ldy, nthreads): tm_block_matmul's arguments and layouts.
//
// Numerics: the weights are ggml's fp32 dequantization (d * q + m as a multiply then an add, Q4_0's q - 8,
// Q8_0's d * q), x is taken at fp32 as it is (the integer kernel rounds it to 16 bits per 32-block).
// Invariant: y[m, n] = x[m, :] . w[n, :] accumulated by one fma chain in k order, whatever M, the row's
// place in the batch or the thread count: a row gives the same bits alone or in any batch (on this kernel;
// the integer kernel's bits differ).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>
#if defined(_OPENMP)
#include <omp.h>
#endif
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && !defined(TM_PORTABLE)
#include <immintrin.h>
#define TM_AVX2 1
#endif

__attribute__((visibility("hidden"))) float tm_half_to_float(uint16_t h);  // block_matmul.cpp, the same library

// Shared with vnni_matmul.cpp (hidden: not the ABI). The calling thread's scratch in v, 64-byte aligned: at
// least `bytes` bytes.
__attribute__((visibility("hidden"))) void* tm_scratch(std::vector<uint8_t>& v, size_t bytes) {
    if (v.size() < bytes + 64) v.resize(bytes + 64);
    const uintptr_t p = reinterpret_cast<uintptr_t>(v.data());
    return reinterpret_cast<void*>((p + 63) & ~uintptr_t(63));
}

// Part `part` of `parts` of the prefetch of [next, next + bytes) into L2: a panel kernel asks for the next
// work item's weight rows a share before each of this item's tiles (16 row streams at once, which the
// hardware prefetchers do not keep ahead of).
__attribute__((visibility("hidden"))) void tm_prefetch_share(const char* next, int64_t bytes, int64_t parts,
                                                             int64_t part) {
    const int64_t share = (bytes + parts - 1) / parts;
    for (int64_t o = part * share; o < std::min(bytes, (part + 1) * share); o += 64) __builtin_prefetch(next + o, 0, 2);
}

namespace {

enum : int { kQ4_0 = 2, kQ4_1 = 3, kQ8_0 = 8, kPacked = 0x100 };  // ggml's type numbers; the packed flag (vnni_matmul.cpp)
constexpr int MR = 6;   // rows of x a microkernel tile
constexpr int NR = 16;  // weight rows (output columns) a panel

inline float half_to_float(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
#ifdef TM_AVX2
    return _cvtsh_ss(h);
#else
    return tm_half_to_float(h);
#endif
}

template <int TYPE>
constexpr int64_t block_bytes() {
    return TYPE == kQ4_0 ? 18 : TYPE == kQ4_1 ? 20 : 34;
}

// one 32-block of one weight row -> out[0..31] fp32, as ggml dequantizes it
template <int TYPE>
inline void dequantize_block(const uint8_t* blk, float* out) {
    const float d = half_to_float(blk);
#ifdef TM_AVX2
    const __m256 vd = _mm256_set1_ps(d);
    if constexpr (TYPE == kQ8_0) {
        for (int i = 0; i < 32; i += 8) {
            const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 2 + i));
            _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), vd));
        }
    } else {
        const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + (TYPE == kQ4_1 ? 4 : 2)));
        const __m128i mask = _mm_set1_epi8(0x0f);
        const __m128i lo = _mm_and_si128(raw, mask), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
        const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
        for (int i = 0; i < 4; ++i) {
            __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[i]));
            if constexpr (TYPE == kQ4_1) {
                q = _mm256_add_ps(_mm256_mul_ps(q, vd), _mm256_set1_ps(half_to_float(blk + 2)));
            } else {
                q = _mm256_mul_ps(_mm256_sub_ps(q, _mm256_set1_ps(8.0f)), vd);
            }
            _mm256_storeu_ps(out + 8 * i, q);
        }
    }
#else
    for (int e = 0; e < 32; ++e) {
        if constexpr (TYPE == kQ8_0) {
            out[e] = float(int8_t(blk[2 + e])) * d;
        } else {
            const uint8_t byte = blk[(TYPE == kQ4_1 ? 4 : 2) + (e & 15)];
            const int q = e < 16 ? (byte & 0x0f) : (byte >> 4);
            out[e] = TYPE == kQ4_1 ? float(q) * d + half_to_float(blk + 2) : float(q - 8) * d;
        }
    }
#endif
}

#ifdef TM_AVX2
// out[j * ldo + i] = in[i * ldi + j] for an 8x8 tile (unpack pairs, then quads, then swap the 128-bit halves)
inline void transpose8(const float* in, int64_t ldi, float* out, int64_t ldo) {
    __m256 r[8], t[8];
    for (int i = 0; i < 8; ++i) r[i] = _mm256_load_ps(in + i * ldi);
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        r[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int j = 0; j < 4; ++j) {
        _mm256_store_ps(out + j * ldo, _mm256_permute2f128_ps(r[j], r[j + 4], 0x20));
        _mm256_store_ps(out + (j + 4) * ldo, _mm256_permute2f128_ps(r[j], r[j + 4], 0x31));
    }
}
#endif

// weight rows [n0, n0 + nc) (nc <= NR; the rest of the panel zero) -> panel (K, NR) fp32, k-major
template <int TYPE>
void make_panel(const uint8_t* W, int64_t n0, int nc, int64_t K, float* panel) {
    const int64_t nb = K / 32, row_bytes = nb * block_bytes<TYPE>();
    alignas(32) float t[NR][32];
    for (int64_t b = 0; b < nb; ++b) {
        for (int c = 0; c < NR; ++c) {
            if (c < nc) {
                dequantize_block<TYPE>(W + (n0 + c) * row_bytes + b * block_bytes<TYPE>(), t[c]);
            } else {
                std::fill(t[c], t[c] + 32, 0.0f);
            }
        }
        float* p = panel + 32 * b * NR;
#ifdef TM_AVX2
        for (int c0 = 0; c0 < NR; c0 += 8)
            for (int k0 = 0; k0 < 32; k0 += 8) transpose8(&t[c0][k0], 32, p + k0 * NR + c0, NR);
#else
        for (int i = 0; i < 32; ++i)
            for (int c = 0; c < NR; ++c) p[i * NR + c] = t[c][i];
#endif
    }
}

// R (<= MR) rows of x, packed (K, MR), times the panel (K, NR) -> y (R rows ldy apart, the first nc columns)
template <int R>
void micro(const float* xp, const float* panel, int64_t K, float* y, int64_t ldy, int nc) {
#ifdef TM_AVX2
    __m256 a0[R], a1[R];  // row r: columns 0-7, 8-15
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) a0[r] = a1[r] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; ++k) {
        const __m256 w0 = _mm256_load_ps(panel + NR * k), w1 = _mm256_load_ps(panel + NR * k + 8);
#pragma GCC unroll 6
        for (int r = 0; r < R; ++r) {
            const __m256 xv = _mm256_broadcast_ss(xp + MR * k + r);
            a0[r] = _mm256_fmadd_ps(xv, w0, a0[r]);
            a1[r] = _mm256_fmadd_ps(xv, w1, a1[r]);
        }
    }
    if (nc == NR) {
#pragma GCC unroll 6
        for (int r = 0; r < R; ++r) {
            _mm256_storeu_ps(y + r * ldy, a0[r]);
            _mm256_storeu_ps(y + r * ldy + 8, a1[r]);
        }
        return;
    }
    // a partial panel: through a buffer (the accumulators only ever indexed by unrolled loops, so they
    // stay in registers: an accumulator read by a runtime loop made the compiler spill all twelve every k)
    alignas(32) float t[R][NR];
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
        _mm256_store_ps(t[r], a0[r]);
        _mm256_store_ps(t[r] + 8, a1[r]);
    }
#else
    float t[R][NR] = {};
    for (int64_t k = 0; k < K; ++k)
        for (int r = 0; r < R; ++r)
            for (int c = 0; c < NR; ++c) t[r][c] += xp[MR * k + r] * panel[NR * k + c];
#endif
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < nc; ++c) y[r * ldy + c] = t[r][c];
}

// the calling thread's scratch: at least n floats
float* scratch(std::vector<uint8_t>& v, size_t n) { return static_cast<float*>(tm_scratch(v, 4 * n)); }

template <int TYPE>
void panel_matmul(const uint8_t* W, int64_t N, int64_t K, const float* x, int64_t ldx, int64_t M, float* y,
                  int64_t ldy, int nthreads) {
    if (M <= 0 || N <= 0) return;
    const int64_t tiles = (M + MR - 1) / MR, items = (N + NR - 1) / NR;
    thread_local std::vector<uint8_t> xbuf;
    float* xp = scratch(xbuf, size_t(tiles * K * MR));  // tile t: (K, MR), rows past M zero
    auto pack = [&](int64_t t) {
        float* o = xp + t * K * MR;
        const int64_t rows = std::min<int64_t>(MR, M - t * MR);
        for (int64_t r = 0; r < MR; ++r) {
            const float* xr = x + (t * MR + r) * ldx;
            for (int64_t k = 0; k < K; ++k) o[k * MR + r] = r < rows ? xr[k] : 0.0f;
        }
    };
    auto item = [&](int64_t it, float* panel) {
        const int64_t n0 = it * NR;
        const int nc = int(std::min<int64_t>(NR, N - n0));
        make_panel<TYPE>(W, n0, nc, K, panel);
        // The next item's weight rows (this thread's next, under the static schedule) are asked into L2 while
        // this item's tiles run, a share before each tile: make_panel reads 16 rows at once, 16 streams the
        // hardware prefetchers do not keep ahead of. The default model's 120 layer matrices, 2 threads, AMX
        // Xeon (AVX2 code), 2026-12-05: 31.6 -> 21.0 ms at 8 rows, 37.0 -> 26.8 at 16, 85.2 -> 71.1 at 64.
        const int64_t rb = K / 32 * block_bytes<TYPE>();
        const char* next = reinterpret_cast<const char*>(W + (n0 + NR) * rb);
        const int64_t bytes = std::max<int64_t>(0, std::min<int64_t>(NR, N - n0 - NR)) * rb;
        for (int64_t t = 0; t < tiles; ++t) {
            tm_prefetch_share(next, bytes, tiles, t);
            const float* xt = xp + t * K * MR;
            float* yt = y + t * MR * ldy + n0;
            switch (std::min<int64_t>(MR, M - t * MR)) {
                case 6: micro<6>(xt, panel, K, yt, ldy, nc); break;
                case 5: micro<5>(xt, panel, K, yt, ldy, nc); break;
                case 4: micro<4>(xt, panel, K, yt, ldy, nc); break;
                case 3: micro<3>(xt, panel, K, yt, ldy, nc); break;
                case 2: micro<2>(xt, panel, K, yt, ldy, nc); break;
                default: micro<1>(xt, panel, K, yt, ldy, nc); break;
            }
        }
    };
#if defined(_OPENMP)
    if (nthreads > 1 && items > 1) {
#pragma omp parallel num_threads(nthreads)
        {
#pragma omp for schedule(static)
            for (int64_t t = 0; t < tiles; ++t) pack(t);
            // (the loop's barrier: every tile is packed before any item reads one)
            thread_local std::vector<uint8_t> pbuf;
            float* panel = scratch(pbuf, size_t(K * NR));
#pragma omp for schedule(static)
            for (int64_t it = 0; it < items; ++it) item(it, panel);
        }
        return;
    }
#endif
    for (int64_t t = 0; t < tiles; ++t) pack(t);
    thread_local std::vector<uint8_t> pbuf;
    float* panel = scratch(pbuf, size_t(K * NR));
    for (int64_t it = 0; it < items; ++it) item(it, panel);
}

}  // namespace

extern "C" {

int tm_block_matmul(int type, const void* W, int64_t N, int64_t K, const float* x, int64_t ldx, int64_t M,
                    float* y, int64_t ldy, int nthreads);  // block_matmul.cpp

// See the header. Returns 0; -1 for a type it does not take (it takes tm_block_matmul's: ask
// tm_block_matmul_supports); -2 when K % 32 != 0. The K-quants have no panel here: they get the block
// kernel's result (kquant_matmul.cpp), so a caller may hand this entry any block_mm layer.
int tm_panel_matmul(int type, const void* W, int64_t N, int64_t K, const float* x, int64_t ldx, int64_t M,
                    float* y, int64_t ldy, int nthreads) {
    if (type & kPacked) return tm_block_matmul(type, W, N, K, x, ldx, M, y, ldy, nthreads);
    if (type != kQ4_0 && type != kQ4_1 && type != kQ8_0)
        return tm_block_matmul(type, W, N, K, x, ldx, M, y, ldy, nthreads);
    if (K % 32) return -2;
    const auto* w = static_cast<const uint8_t*>(W);
    switch (type) {
        case kQ4_0: panel_matmul<kQ4_0>(w, N, K, x, ldx, M, y, ldy, nthreads); return 0;
        case kQ4_1: panel_matmul<kQ4_1>(w, N, K, x, ldx, M, y, ldy, nthreads); return 0;
        case kQ8_0: panel_matmul<kQ8_0>(w, N, K, x, ldx, M, y, ldy, nthreads); return 0;
        default: return -1;
    }
}

}  // extern "C"
