#include <immintrin.h>
#include <cstdint>
#include <omp.h>
extern "C" float read_tiles(const float* k, const float* v, int64_t layers, int64_t layer_stride, int64_t keys,
                            int64_t nkv, int64_t hd, int64_t part, int mode, int nt) {
    // mode 0: per tile, per head: 16 K segments then 16 V segments (the kernel's order)
    // mode 1: per tile: the whole 16 K slots, then the whole 16 V slots (contiguous)
    float total = 0;
    const int64_t slot = nkv * hd;
    const int64_t nparts = (keys + part - 1) / part;
#pragma omp parallel for num_threads(nt) reduction(+:total) schedule(dynamic,1) collapse(2)
    for (int64_t l = 0; l < layers; ++l)
        for (int64_t p = 0; p < nparts; ++p) {
            const float* K = k + l * layer_stride;
            const float* V = v + l * layer_stride;
            __m256 acc = _mm256_setzero_ps();
            int64_t end = (p + 1) * part < keys ? (p + 1) * part : keys;
            for (int64_t t = p * part; t < end; t += 16) {
                if (mode == 0) {
                    for (int64_t h = 0; h < nkv; ++h) {
                        for (int j = 0; j < 16; ++j)
                            for (int64_t c = 0; c < hd; c += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(K + (t + j) * slot + h * hd + c));
                        for (int j = 0; j < 16; ++j)
                            for (int64_t c = 0; c < hd; c += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(V + (t + j) * slot + h * hd + c));
                    }
                } else {
                    for (int64_t i = 0; i < 16 * slot; i += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(K + t * slot + i));
                    for (int64_t i = 0; i < 16 * slot; i += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(V + t * slot + i));
                }
            }
            float s[8]; _mm256_storeu_ps(s, acc);
            for (int i = 0; i < 8; ++i) total += s[i];
        }
    return total;
}
