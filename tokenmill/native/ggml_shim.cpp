// tokenmill's bridge to ggml's CPU matmuls, through ggml's public C API only (built against the pinned
// ggml vendored in llama-cpp-python's sdist; see ggml_build.py). One call per linear layer from Python (ctypes), so the
// per-call overhead is one foreign call, not one per ggml function.
//
// A weight is an (N rows x K) matrix of one ggml type: either the file's own bytes (zero copy: `data`
// points into an mmap of the GGUF file and must outlive the weight), or a copy in one of ggml's repacked
// layouts (an "extra" CPU buffer type, e.g. interleaved Q4_0/Q4_K tiles on AVX2) when the running CPU
// supports it for this type, checked the way llama.cpp checks it (supports_op), never by trying.
//
// tm_matmul computes y[m, off_i : off_i + N_i] = x[m, :] . W_i[n, :] for every weight i of a fused layer
// (q|k|v, gate|up), all in one ggml graph. x: (M, K) fp32 row-major; y: (M, ldy) fp32 row-major.
// Like llama.cpp, ggml quantizes x per row to 8 bits (Q8_0 / Q8_K) before the integer dot products.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <vector>

#include "ggml.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

namespace {

struct Weight {
    ggml_context* ctx = nullptr;       // holds the tensor's metadata
    ggml_tensor* t = nullptr;          // ne = {K, N}
    ggml_backend_buffer_t buf = nullptr;  // repacked copy (or nullptr: data points at the caller's bytes)
    const char* layout = "ggml";
};

std::once_flag g_init;

// ggml's own log: warnings and errors to stderr, its per-tensor info lines ("repack: ...") dropped.
void log_cb(ggml_log_level level, const char* text, void*) {
    if (level == GGML_LOG_LEVEL_WARN || level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

void init_once() {
    std::call_once(g_init, [] {
        ggml_log_set(log_cb, nullptr);
        ggml_cpu_init();
    });
}

ggml_context* small_ctx(size_t n_tensors, void* mem, size_t mem_size) {
    ggml_init_params p{};
    p.mem_size = mem ? mem_size : n_tensors * ggml_tensor_overhead() + 1024;
    p.mem_buffer = mem;
    p.no_alloc = true;
    return ggml_init(p);
}

// gf run on n_threads, `work` its scratch (grown as the plan asks): 0, or 2 if ggml fails.
int compute(ggml_cgraph* gf, int n_threads, std::vector<uint8_t>& work) {
    ggml_cplan plan = ggml_graph_plan(gf, n_threads, nullptr);
    if (plan.work_size > work.size()) work.resize(plan.work_size);
    plan.work_data = work.data();
    return ggml_graph_compute(gf, &plan) == GGML_STATUS_SUCCESS ? 0 : 2;
}

// The first extra CPU buffer type (repack, AMX, ...) that supports mul_mat with this weight, or nullptr.
// AMX only with allow_amx: llama.cpp's AMX path for Q4_1 was seen to segfault at the first decode on a
// Sapphire Rapids Xeon (benchmarks/compare.sh runs llama-server with --no-repack for that reason).
ggml_backend_buffer_type_t pick_extra_buft(ggml_tensor* w, bool allow_amx) {
    ggml_backend_reg_t reg = ggml_backend_cpu_reg();
    ggml_backend_dev_t dev = ggml_backend_reg_dev_get(reg, 0);
    auto get_extra = (ggml_backend_dev_get_extra_bufts_t)ggml_backend_reg_get_proc_address(
        reg, "ggml_backend_dev_get_extra_bufts");
    if (!get_extra) return nullptr;
    ggml_context* ctx = small_ctx(4, nullptr, 0);
    ggml_tensor* x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, w->ne[0], 64);
    ggml_tensor* wt = ggml_dup_tensor(ctx, w);
    ggml_tensor* op = ggml_mul_mat(ctx, wt, x);
    ggml_backend_buffer_type_t found = nullptr;
    for (ggml_backend_buffer_type_t* b = get_extra(dev); b && *b; ++b) {
        if (!allow_amx && std::strstr(ggml_backend_buft_name(*b), "AMX")) continue;
        ggml_backend_buffer_t dummy = ggml_backend_buft_alloc_buffer(*b, 0);
        wt->buffer = dummy;
        bool ok = ggml_backend_dev_supports_op(dev, op);
        wt->buffer = nullptr;
        ggml_backend_buffer_free(dummy);
        if (ok) {
            found = *b;
            break;
        }
    }
    ggml_free(ctx);
    return found;
}

// ggml's repacked Q4_K (block_q4_Kx8 in ggml-cpu/repack.h, "q4_K_8x8" / "q4_K_8x4"): 8 rows' blocks of one
// 256-column span interleaved into one 1152-byte block: d[8], dmin[8] (fp16), scales[96] (for each
// sub-block sb of 32 columns, 12 bytes holding the 8 rows' 6-bit scale and min packed as a plain Q4_K block
// packs its 8 sub-blocks: row j read as sub-block j), qs[1024] (the rows' 128 quant bytes, B at a time in
// turn, B = the interleave). Which interleave ggml chose is not in its public API, so it is derived as ggml
// derives it (repack.cpp, ggml_repack_get_optimal_repack_type): 8 with AVX2, or NEON with int8 matmul; 4
// with NEON dot products only; 0 (none we can read) otherwise.
constexpr int kQK = 256;
struct PlainQ4K {  // block_q4_K
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qs[kQK / 2];
};
struct RepackedQ4K {  // block_q4_Kx8
    uint16_t d[8], dmin[8];
    uint8_t scales[96];
    uint8_t qs[kQK * 4];
};
static_assert(sizeof(PlainQ4K) == 144 && sizeof(RepackedQ4K) == 1152, "Q4_K block sizes");

int q4k_interleave() {
    if (ggml_cpu_has_avx2()) return 8;
    if (ggml_cpu_has_neon() && ggml_cpu_has_matmul_int8()) return 8;
    if (ggml_cpu_has_neon() && ggml_cpu_has_dotprod()) return 4;
    return 0;
}

// 0, or the interleave of w's layout if it is ggml's repacked Q4_K and we can read it back as plain blocks.
int readable_repack(const Weight* w) {
    if (!w->buf || w->t->type != GGML_TYPE_Q4_K || std::strcmp(w->layout, "CPU_REPACK") != 0) return 0;
    if (w->t->ne[1] % 8 != 0) return 0;
    return q4k_interleave();
}

// The plain blocks of rows [8g, 8g + 8) from the repacked ones: `in` the group's nb repacked blocks, `out`
// (8, nb) plain blocks. The exact inverse of ggml's make_block_q4_Kx8 (the tests check the round trip).
// B, the interleave, is a template argument so the copies are of constant size.
template <int B>
void unrepack_q4k_group_b(const RepackedQ4K* in, int64_t nb, PlainQ4K* out) {
    for (int64_t x = 0; x < nb; ++x) {
        const RepackedQ4K& r = in[x];
        for (int j = 0; j < 8; ++j) {
            PlainQ4K& p = out[j * nb + x];
            p.d = r.d[j];
            p.dmin = r.dmin[j];
            // row j's byte o sits at ((o / B) * 8 + j) * B + o % B: chunks of B bytes
            for (int c = 0; c < kQK / 2 / B; ++c) std::memcpy(p.qs + c * B, r.qs + (c * 8 + j) * B, B);
            std::memset(p.scales, 0, sizeof p.scales);
            for (int sb = 0; sb < 8; ++sb) {
                const uint8_t* b = r.scales + sb * 12;  // row j's (scale, min) for sub-block sb, as "sub-block" j
                uint8_t sc, mn;
                if (j < 4) {
                    sc = b[j] & 63;
                    mn = b[j + 4] & 63;
                } else {
                    sc = (b[j + 4] & 15) | ((b[j - 4] >> 6) << 4);
                    mn = (b[j + 4] >> 4) | ((b[j] >> 6) << 4);
                }
                if (sb < 4) {  // packed as ggml's Q4_K quantizer packs them
                    p.scales[sb] |= sc;
                    p.scales[sb + 4] |= mn;
                } else {
                    p.scales[sb + 4] = (sc & 15) | ((mn & 15) << 4);
                    p.scales[sb - 4] |= (sc >> 4) << 6;
                    p.scales[sb] |= (mn >> 4) << 6;
                }
            }
        }
    }
}

void unrepack_q4k_group(const RepackedQ4K* in, int64_t nb, int interleave, PlainQ4K* out) {
    if (interleave == 8) unrepack_q4k_group_b<8>(in, nb, out);
    else unrepack_q4k_group_b<4>(in, nb, out);
}

// Rows [r0, r0 + rows) of a repacked Q4_K weight as the file's plain blocks at out (r0, rows multiples of
// 8; groups of 8 rows spread over n_threads when big). 0, or -1 where the layout cannot be read back.
int read_back_q4k(const Weight* w, int64_t r0, int64_t rows, void* out, int n_threads) {
    const int interleave = readable_repack(w);
    if (!interleave || r0 % 8 || rows % 8) return -1;
    const int64_t k = w->t->ne[0], nb = k / kQK, groups = rows / 8;
    const auto* src = (const RepackedQ4K*)w->t->data + (r0 / 8) * nb;
    const int nt = rows * k >= (1 << 17) ? n_threads : 1;
#pragma omp parallel for num_threads(nt) if (nt > 1) schedule(static)
    for (int64_t g = 0; g < groups; ++g) unrepack_q4k_group(src + g * nb, nb, interleave, (PlainQ4K*)out + g * 8 * nb);
    return 0;
}

}  // namespace

extern "C" {

size_t tm_row_size(int type, int64_t k) { return ggml_row_size((ggml_type)type, k); }

int64_t tm_block_size(int type) { return ggml_blck_size((ggml_type)type); }

int tm_type_count() { return GGML_TYPE_COUNT; }

const char* tm_type_name(int type) { return ggml_type_name((ggml_type)type); }

// A weight of `type`, (n rows x k). repack & 1: copy `data` into a repacked layout if the CPU has one for
// this type (else fall back to zero copy); repack & 2: AMX layouts may be used too. nullptr on a bad shape.
void* tm_weight_create(int type, int64_t k, int64_t n, const void* data, int repack) {
    init_once();
    if (k % ggml_blck_size((ggml_type)type) != 0) return nullptr;
    auto* w = new Weight();
    w->ctx = small_ctx(1, nullptr, 0);
    w->t = ggml_new_tensor_2d(w->ctx, (ggml_type)type, k, n);
    if (repack & 1) {
        if (ggml_backend_buffer_type_t buft = pick_extra_buft(w->t, (repack & 2) != 0)) {
            size_t size = ggml_backend_buft_get_alloc_size(buft, w->t);
            w->buf = ggml_backend_buft_alloc_buffer(buft, size);
            if (w->buf) {
                ggml_backend_buffer_set_usage(w->buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
                ggml_backend_tensor_alloc(w->buf, w->t, ggml_backend_buffer_get_base(w->buf));
                ggml_backend_tensor_set(w->t, data, 0, ggml_nbytes(w->t));  // repacks
                w->layout = ggml_backend_buft_name(buft);
                return w;
            }
        }
    }
    w->t->data = const_cast<void*>(data);
    return w;
}

// Bytes the weight keeps: its repacked buffer, or the caller's bytes it points at.
size_t tm_weight_nbytes(void* h) {
    auto* w = (Weight*)h;
    return w->buf ? ggml_backend_buffer_get_size(w->buf) : ggml_nbytes(w->t);
}

const char* tm_weight_layout(void* h) { return ((Weight*)h)->layout; }

int tm_weight_repacked(void* h) { return ((Weight*)h)->buf != nullptr; }

void tm_weight_free(void* h) {
    auto* w = (Weight*)h;
    if (!w) return;
    if (w->buf) ggml_backend_buffer_free(w->buf);
    ggml_free(w->ctx);
    delete w;
}

// See the header comment. offsets[i]: first output column of weight i. Returns 0 on success.
int tm_matmul(void** weights, const int64_t* offsets, int n_weights, const float* x, int64_t m, int64_t k,
              float* y, int64_t ldy, int n_threads) {
    init_once();
    thread_local std::vector<uint8_t> meta, work;
    thread_local std::vector<float> scratch;
    size_t meta_size = (2 + 2 * (size_t)n_weights) * ggml_tensor_overhead() +
                       ggml_graph_overhead_custom(2 * n_weights + 2, false) + 1024;
    if (meta.size() < meta_size) meta.resize(meta_size);
    ggml_context* ctx = small_ctx(0, meta.data(), meta.size());
    ggml_tensor* xt = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, m);
    xt->data = const_cast<float*>(x);
    ggml_cgraph* gf = ggml_new_graph_custom(ctx, 2 * n_weights + 2, false);
    // a single weight writing all of y's columns writes in place; otherwise each result goes to scratch
    // (ggml's repacked kernels assume a contiguous destination) and is copied into its columns
    bool direct = n_weights == 1 && offsets[0] == 0 && ((Weight*)weights[0])->t->ne[1] == ldy;
    size_t total = 0;
    for (int i = 0; i < n_weights; ++i) total += (size_t)((Weight*)weights[i])->t->ne[1] * m;
    if (!direct && scratch.size() < total) scratch.resize(total);
    std::vector<ggml_tensor*> outs(n_weights);
    size_t pos = 0;
    for (int i = 0; i < n_weights; ++i) {
        ggml_tensor* w = ((Weight*)weights[i])->t;
        if (w->ne[0] != k) {
            ggml_free(ctx);
            return 1;
        }
        ggml_tensor* r = ggml_mul_mat(ctx, w, xt);  // ne = {N_i, M}
        r->data = direct ? (void*)y : (void*)(scratch.data() + pos);
        pos += (size_t)w->ne[1] * m;
        outs[i] = r;
        ggml_build_forward_expand(gf, r);
    }
    int status = compute(gf, n_threads, work);
    if (!direct && status == 0) {
        for (int i = 0; i < n_weights; ++i) {
            int64_t ni = outs[i]->ne[0];
            const float* src = (const float*)outs[i]->data;
            for (int64_t r = 0; r < m; ++r) std::memcpy(y + r * ldy + offsets[i], src + r * ni, ni * sizeof(float));
        }
    }
    ggml_free(ctx);
    return status;
}

// Grouped rows, one weight each (a mixture of experts): rows [starts[g], starts[g] + counts[g]) of x times
// weight g give the same rows of y; every weight is (ldy x k), so it writes all of y's columns. One graph
// for all groups: one foreign call and one thread team for every expert of a layer, not one per expert.
// Each group is the same ggml mul_mat a single call would run, so results do not depend on the grouping.
int tm_matmul_grouped(void** weights, int n_groups, const int64_t* starts, const int64_t* counts, const float* x,
                      int64_t k, float* y, int64_t ldy, int n_threads) {
    init_once();
    thread_local std::vector<uint8_t> meta, work;
    size_t meta_size = (2 * (size_t)n_groups + 2) * ggml_tensor_overhead() +
                       ggml_graph_overhead_custom(2 * n_groups + 2, false) + 1024;
    if (meta.size() < meta_size) meta.resize(meta_size);
    ggml_context* ctx = small_ctx(0, meta.data(), meta.size());
    ggml_cgraph* gf = ggml_new_graph_custom(ctx, 2 * n_groups + 2, false);
    int n_nodes = 0;
    for (int g = 0; g < n_groups; ++g) {
        if (counts[g] == 0) continue;
        ggml_tensor* w = ((Weight*)weights[g])->t;
        if (w->ne[0] != k || w->ne[1] != ldy) {
            ggml_free(ctx);
            return 1;
        }
        ggml_tensor* xg = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, counts[g]);
        xg->data = const_cast<float*>(x + starts[g] * k);
        ggml_tensor* r = ggml_mul_mat(ctx, w, xg);  // ne = {ldy, counts[g]}: rows of y, contiguous
        r->data = y + starts[g] * ldy;
        ggml_build_forward_expand(gf, r);
        ++n_nodes;
    }
    int status = n_nodes ? compute(gf, n_threads, work) : 0;
    ggml_free(ctx);
    return status;
}

// tm_moe's middle, a mixture of experts' MLPs on grouped rows in one graph: group g's rows [starts[g],
// starts[g] + counts[g]) of x (k wide) through its gate and up weights, the gated activation, and its down
// weight (d x I), into the same rows of y (d wide). n_gu = 1: gate_up[g] is one (2I x k) weight, gate rows then up rows;
// n_gu = 2: gate_up[2g], gate_up[2g + 1] are gate and up, (I x k) each. act 0: silu(gate) * up; act 1:
// gpt-oss's (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha g), g = min(gate, limit). Biases (fp32, or
// null): gu_bias[g * n_gu + j] the gate_up weight's (its rows), down_bias[g]. One foreign call and one thread
// team for a layer's experts, the intermediate rows never leaving fp32. Each group's rows are the same
// mul_mat ggml runs for them alone, each row independent of the others. 0 on success, 1 on a bad shape.
static int run_experts(void** gate_up, int n_gu, void** down, int n_groups, const int64_t* starts,
                       const int64_t* counts, const float* x, int64_t k, float* y, int64_t d, int act, float alpha,
                       float limit, const float* const* gu_bias, const float* const* down_bias, int n_threads) {
    init_once();
    thread_local std::vector<uint8_t> meta, work;
    thread_local std::vector<float> scratch;
    const size_t per_group = 16;  // tensors a group makes at most
    size_t meta_size = (per_group * (size_t)n_groups + 4) * ggml_tensor_overhead() +
                       ggml_graph_overhead_custom(per_group * n_groups + 4, false) + 1024;
    if (meta.size() < meta_size) meta.resize(meta_size);
    // the intermediate rows: gate and up (2I) and with their biases (2I), the activation (I), the down
    // before its bias (d), per row; each tensor 64-byte aligned
    size_t need = 0;
    for (int g = 0; g < n_groups; ++g) {
        const int64_t inter = ((Weight*)down[g])->t->ne[0];
        need += (size_t)(5 * inter + d) * counts[g] + 16 * 6;
    }
    if (scratch.size() < need) scratch.resize(need);
    float* next = scratch.data();
    auto place = [&next](ggml_tensor* t) {  // t's data in the scratch, its start 64-byte aligned
        t->data = next;
        next += (ggml_nelements(t) + 15) / 16 * 16;
    };
    auto bias_add = [](ggml_context* ctx, ggml_tensor* t, const float* b) {
        if (!b) return t;
        ggml_tensor* bt = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, t->ne[0]);
        bt->data = const_cast<float*>(b);
        return ggml_add(ctx, t, bt);
    };
    ggml_context* ctx = small_ctx(0, meta.data(), meta.size());
    ggml_cgraph* gf = ggml_new_graph_custom(ctx, per_group * n_groups + 4, false);
    int n_nodes = 0;
    for (int g = 0; g < n_groups; ++g) {
        const int64_t n = counts[g];
        if (n == 0) continue;
        ggml_tensor* dw = ((Weight*)down[g])->t;
        const int64_t inter = dw->ne[0];
        ggml_tensor* gu[2] = {((Weight*)gate_up[g * n_gu])->t, n_gu == 2 ? ((Weight*)gate_up[g * n_gu + 1])->t : nullptr};
        bool bad = dw->ne[1] != d || gu[0]->ne[0] != k || gu[0]->ne[1] != (n_gu == 2 ? inter : 2 * inter) ||
                   (n_gu == 2 && (gu[1]->ne[0] != k || gu[1]->ne[1] != inter));
        if (bad) {
            ggml_free(ctx);
            return 1;
        }
        ggml_tensor* xg = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, n);
        xg->data = const_cast<float*>(x + starts[g] * k);
        ggml_tensor* h[2] = {nullptr, nullptr};
        for (int j = 0; j < n_gu; ++j) {
            ggml_tensor* r = ggml_mul_mat(ctx, gu[j], xg);  // ne = {rows of the weight, n}
            place(r);
            h[j] = bias_add(ctx, r, gu_bias ? gu_bias[g * n_gu + j] : nullptr);
            if (h[j] != r) place(h[j]);
        }
        if (n_gu == 1) {  // gate and up: the halves of each row
            ggml_tensor* both = h[0];
            h[0] = ggml_view_2d(ctx, both, inter, n, both->nb[1], 0);
            h[1] = ggml_view_2d(ctx, both, inter, n, both->nb[1], inter * sizeof(float));
        }
        ggml_tensor* a = act == 1 ? ggml_swiglu_oai(ctx, h[0], h[1], alpha, limit) : ggml_swiglu_split(ctx, h[0], h[1]);
        place(a);
        ggml_tensor* r = ggml_mul_mat(ctx, dw, a);  // ne = {d, n}: y's rows, contiguous
        ggml_tensor* out = bias_add(ctx, r, down_bias ? down_bias[g] : nullptr);
        if (out != r) place(r);
        out->data = y + starts[g] * d;
        ggml_build_forward_expand(gf, out);
        ++n_nodes;
    }
    int status = n_nodes ? compute(gf, n_threads, work) : 0;
    ggml_free(ctx);
    return status;
}

// A whole mixture-of-experts layer in one call, from its input rows x (n_tokens, k) fp32 to out (n_tokens, d)
// fp32, over all n_experts experts (gate_up: n_experts * n_gu weights, down: n_experts, biases likewise or null):
// 1. the router's logits (n_tokens, n_experts): router (n_experts x k) times x, plus router_bias (null: none);
//    or, with router null, read from `logits` (the caller computed them);
// 2. per token, scores = softmax(logits) (scoring 0) or sigmoid(logits) (1); the top_k experts by scores +
//    sel_bias (null: none; it only chooses), in descending order, ties to the lower id; their weights the chosen
//    scores, divided by their sum (at least 1e-12) if renorm, times scaling;
// 3. the (token, choice) slots grouped by expert (ascending id, token order within one), then, with a shared
//    expert (shared_gu: n_gu weights, shared_down; null: none; no biases), every token once more for it; the
//    experts run as run_experts runs them; out[t] = sum over j < top_k, in j's order, of weight_j * (its
//    expert's result), plus shared_weight[t] (null: 1) * (the shared expert's result).
// A token's result depends only on its own row, not on the other tokens of the call. Returns 0; 3 (nothing
// written) where an expert gets more than max_rows rows (the caller's dense path is the faster there); 1 on a
// bad shape; 2 if ggml fails.
int tm_moe(void* router, const float* router_bias, const float* logits, int scoring, const float* sel_bias,
           int renorm, float scaling, int top_k, int n_experts, void** gate_up, int n_gu, void** down,
           const float* const* gu_bias, const float* const* down_bias, void** shared_gu, void* shared_down,
           const float* shared_weight, const float* x, int64_t n_tokens, int64_t k, float* out, int64_t d, int act,
           float alpha, float limit, int64_t max_rows, int n_threads) {
    init_once();
    thread_local std::vector<float> lg, xg, yg, score, weight;
    thread_local std::vector<int64_t> counts, starts, slot_expert, row_token, slot_row, order;
    thread_local std::vector<void*> gu_sel, dn_sel;
    thread_local std::vector<const float*> gub_sel, dnb_sel;
    const int64_t E = n_experts, K = top_k, S = n_tokens * K;
    if (K < 1 || K > E) return 1;
    if (router) {
        lg.resize((size_t)n_tokens * E);
        const int64_t zero = 0;
        int status = tm_matmul(&router, &zero, 1, x, n_tokens, k, lg.data(), E, n_threads);
        if (status) return status;
        if (router_bias)
            for (int64_t t = 0; t < n_tokens; ++t)
                for (int64_t e = 0; e < E; ++e) lg[t * E + e] += router_bias[e];
        logits = lg.data();
    }
    // 2. routing
    score.resize(E);
    weight.resize(S);
    slot_expert.resize(S);
    order.resize(E);
    counts.assign(E, 0);
    for (int64_t t = 0; t < n_tokens; ++t) {
        const float* l = logits + t * E;
        if (scoring == 0) {
            float mx = l[0];
            for (int64_t e = 1; e < E; ++e) mx = std::max(mx, l[e]);
            float sum = 0.0f;
            for (int64_t e = 0; e < E; ++e) sum += (score[e] = std::exp(l[e] - mx));
            for (int64_t e = 0; e < E; ++e) score[e] /= sum;
        } else {
            for (int64_t e = 0; e < E; ++e) score[e] = 1.0f / (1.0f + std::exp(-l[e]));
        }
        for (int64_t e = 0; e < E; ++e) order[e] = e;
        auto key = [&](int64_t e) { return sel_bias ? score[e] + sel_bias[e] : score[e]; };
        std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int64_t a, int64_t b) {
            const float ka = key(a), kb = key(b);
            return ka > kb || (ka == kb && a < b);
        });
        float sum = 0.0f;
        for (int64_t j = 0; j < K; ++j) sum += score[order[j]];
        const float div = renorm ? std::max(sum, 1e-12f) : 1.0f;
        for (int64_t j = 0; j < K; ++j) {
            const int64_t e = order[j];
            slot_expert[t * K + j] = e;
            weight[t * K + j] = (renorm ? score[e] / div : score[e]) * scaling;
            ++counts[e];
        }
    }
    // 3. grouped rows: expert by expert, slots in order within one
    starts.resize(E);
    int64_t rows = 0;
    for (int64_t e = 0; e < E; ++e) {
        if (counts[e] > max_rows) return 3;
        starts[e] = rows;
        rows += counts[e];
    }
    row_token.resize(S);
    slot_row.resize(S);
    {
        std::vector<int64_t>& fill = order;  // (reused) the next free row of each expert
        fill.assign(starts.begin(), starts.end());
        for (int64_t s = 0; s < S; ++s) {
            const int64_t r = fill[slot_expert[s]]++;
            row_token[r] = s / K;
            slot_row[s] = r;
        }
    }
    const int64_t R = shared_gu ? S + n_tokens : S;  // the shared expert's rows after the routed ones
    if (shared_gu && n_tokens > max_rows) return 3;
    xg.resize((size_t)R * k);
    yg.resize((size_t)R * d);
    for (int64_t r = 0; r < S; ++r) std::memcpy(xg.data() + r * k, x + row_token[r] * k, k * sizeof(float));
    if (shared_gu) std::memcpy(xg.data() + S * k, x, (size_t)n_tokens * k * sizeof(float));
    gu_sel.clear();
    dn_sel.clear();
    gub_sel.clear();
    dnb_sel.clear();
    std::vector<int64_t> g_starts, g_counts;
    for (int64_t e = 0; e < E; ++e) {
        if (!counts[e]) continue;
        for (int j = 0; j < n_gu; ++j) {
            gu_sel.push_back(gate_up[e * n_gu + j]);
            if (gu_bias) gub_sel.push_back(gu_bias[e * n_gu + j]);
        }
        dn_sel.push_back(down[e]);
        if (down_bias) dnb_sel.push_back(down_bias[e]);
        g_starts.push_back(starts[e]);
        g_counts.push_back(counts[e]);
    }
    if (shared_gu) {
        for (int j = 0; j < n_gu; ++j) {
            gu_sel.push_back(shared_gu[j]);
            if (gu_bias) gub_sel.push_back(nullptr);
        }
        dn_sel.push_back(shared_down);
        if (down_bias) dnb_sel.push_back(nullptr);
        g_starts.push_back(S);
        g_counts.push_back(n_tokens);
    }
    int status = run_experts(gu_sel.data(), n_gu, dn_sel.data(), (int)dn_sel.size(), g_starts.data(), g_counts.data(),
                             xg.data(), k, yg.data(), d, act, alpha, limit, gu_bias ? gub_sel.data() : nullptr,
                             down_bias ? dnb_sel.data() : nullptr, n_threads);
    if (status) return status;
    for (int64_t t = 0; t < n_tokens; ++t) {
        float* o = out + t * d;
        for (int64_t j = 0; j < K; ++j) {
            const float w = weight[t * K + j];
            const float* yr = yg.data() + slot_row[t * K + j] * d;
            if (j == 0) {
                for (int64_t c = 0; c < d; ++c) o[c] = w * yr[c];
            } else {
                for (int64_t c = 0; c < d; ++c) o[c] += w * yr[c];
            }
        }
        if (shared_gu) {
            const float w = shared_weight ? shared_weight[t] : 1.0f;
            const float* ys = yg.data() + (S + t) * d;
            for (int64_t c = 0; c < d; ++c) o[c] += w * ys[c];
        }
    }
    return 0;
}

// Dequantize rows ids[0..n) of an (rows x k) matrix of `type` at `data` into out (n, k) fp32.
void tm_get_rows(int type, const void* data, int64_t k, const int64_t* ids, int64_t n, float* out) {
    const ggml_type_traits* tr = ggml_get_type_traits((ggml_type)type);
    size_t row = ggml_row_size((ggml_type)type, k);
    for (int64_t i = 0; i < n; ++i) tr->to_float((const uint8_t*)data + ids[i] * row, out + i * k, k);
}

// Dequantize a whole (rows x k) matrix (rows contiguous) into out, split over n_threads rows-wise (one
// thread below ~128K values, ~0.1 ms of work: a parallel region costs more than it saves there).
void tm_dequantize(int type, const void* data, int64_t rows, int64_t k, float* out, int n_threads) {
    const ggml_type_traits* tr = ggml_get_type_traits((ggml_type)type);
    size_t row = ggml_row_size((ggml_type)type, k);
    int nt = rows * k >= (1 << 17) ? n_threads : 1;
    int64_t chunk = (rows + nt - 1) / nt;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int t = 0; t < nt; ++t) {
        int64_t r0 = t * chunk, r1 = r0 + chunk < rows ? r0 + chunk : rows;
        if (r1 > r0) tr->to_float((const uint8_t*)data + r0 * row, out + r0 * k, (r1 - r0) * k);
    }
}

// ggml's quantizer (imatrix-free): src (rows, k) fp32 -> dst, rows * tm_row_size(type, k) bytes.
size_t tm_quantize(int type, const float* src, void* dst, int64_t rows, int64_t k) {
    init_once();
    return ggml_quantize_chunk((ggml_type)type, src, dst, 0, rows, k, nullptr);
}

int tm_quantize_requires_imatrix(int type) { return ggml_quantize_requires_imatrix((ggml_type)type); }

// The row spans tm_weight_dequantize reads this weight in: 1 for plain blocks, 8 for ggml's repacked Q4_K
// (8 rows interleaved), 0 where it cannot read it (F32, other repacked layouts).
int tm_weight_row_align(void* h) {
    auto* w = (Weight*)h;
    if (!w->buf) return w->t->type != GGML_TYPE_F32;
    return readable_repack(w) ? 8 : 0;
}

// Rows [r0, r0 + rows) of the weight as fp32 (rows, K) at out, from its plain blocks or, for a repacked
// Q4_K weight (r0 and rows multiples of 8), from the plain blocks read back out of the repacked ones.
// So a repacked matrix can still take the dense path (dequantize a tile, multiply by oneDNN) for big
// batches. Returns 0, or -1 where the weight's layout cannot be read (tm_weight_row_align 0).
int tm_weight_dequantize(void* h, int64_t r0, int64_t rows, float* out, int n_threads) {
    auto* w = (Weight*)h;
    const int64_t k = w->t->ne[0];
    if (!w->buf) {
        if (w->t->type == GGML_TYPE_F32) return -1;
        tm_dequantize(w->t->type, (const uint8_t*)w->t->data + r0 * ggml_row_size(w->t->type, k), rows, k, out,
                      n_threads);
        return 0;
    }
    const int interleave = readable_repack(w);
    if (!interleave || r0 % 8 || rows % 8) return -1;
    const int64_t nb = k / kQK, groups = rows / 8;
    const ggml_type_traits* tr = ggml_get_type_traits(GGML_TYPE_Q4_K);
    const auto* src = (const RepackedQ4K*)w->t->data + (r0 / 8) * nb;
    int nt = rows * k >= (1 << 17) ? n_threads : 1;
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        std::vector<PlainQ4K> plain(8 * nb);
#pragma omp for schedule(static)
        for (int64_t g = 0; g < groups; ++g) {
            unrepack_q4k_group(src + g * nb, nb, interleave, plain.data());
            tr->to_float(plain.data(), out + g * 8 * k, 8 * k);
        }
    }
    return 0;
}

// The weight's plain blocks for rows [r0, r0 + rows) into out (rows x tm_row_size bytes): a repacked Q4_K
// weight read back (r0, rows multiples of 8; on n_threads when big), or a copy of plain ones. -1 where
// unreadable. For the AMX kernel's K-quant tiles (layers/ggml_linear.py) and the tests.
int tm_weight_plain_blocks(void* h, int64_t r0, int64_t rows, void* out, int n_threads) {
    auto* w = (Weight*)h;
    if (!w->buf) {
        const size_t row = ggml_row_size(w->t->type, w->t->ne[0]);
        std::memcpy(out, (const uint8_t*)w->t->data + r0 * row, rows * row);
        return 0;
    }
    return read_back_q4k(w, r0, rows, out, n_threads);
}

// y[:, col0 : col0 + N] = x . W^T for a repacked Q4_K weight, on ggml's plain-block Q4_K matmul: rows are
// read back into the file's blocks a tile at a time (as many whole 8-row groups as fit in `scratch_bytes`),
// and each tile is multiplied as a zero-copy plain weight over `scratch`. ggml's repacked Q4_K kernel is the
// faster one for decode batches, its plain tiled one for prompts (on a Zen 4 EPYC, a 7B file's prefill:
// 26-28 against 12-14 tok/s; benchmarks/README.md): this gives a repacked matrix the plain one for big
// batches with one layout in memory. The result is exactly what a plain weight of the same blocks gives.
// Returns 0, -1 where the layout cannot be read back or scratch holds no 8-row group, else tm_matmul's status.
int tm_weight_matmul_plain(void* h, const float* x, int64_t m, float* y, int64_t ldy, int64_t col0,
                           void* scratch, size_t scratch_bytes, int n_threads) {
    auto* w = (Weight*)h;
    const int interleave = readable_repack(w);
    const int64_t k = w->t->ne[0], n = w->t->ne[1];
    const size_t row = ggml_row_size(GGML_TYPE_Q4_K, k);
    const int64_t step = (int64_t)(scratch_bytes / row) / 8 * 8;
    if (!interleave || step == 0) return -1;
    for (int64_t r0 = 0; r0 < n; r0 += step) {
        const int64_t rows = std::min(step, n - r0);
        read_back_q4k(w, r0, rows, scratch, n_threads);
        void* tile = tm_weight_create(GGML_TYPE_Q4_K, k, rows, scratch, 0);
        const int64_t off = col0 + r0;
        int status = tile ? tm_matmul(&tile, &off, 1, x, m, k, y, ldy, n_threads) : -1;
        tm_weight_free(tile);
        if (status) return status;
    }
    return 0;
}

}  // extern "C"
