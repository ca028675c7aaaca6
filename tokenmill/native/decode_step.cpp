// tokenmill's decode step in one foreign call: every decoder layer of a Llama-family model over a step of
// M decode tokens, from the embeddings to the final norm, without returning to Python. Activations, norms
// and the KV cache are fp32 or bf16 (the model's compute dtype); the matmul kernels take fp32 rows and give
// fp32 rows, so at bf16 each matmul's input is widened and its output rounded to bf16 (ties to even), then
// the bias added and rounded again: what torch does around the same kernels on the Python path. The AMX
// kernel takes and gives bf16 rows itself (tm_amx_matmul_bf16: the same bits, without the two passes over
// the wide buffers, which were ~3% of a 64-row step of SmolLM2).
//
// Plain C++ without torch headers, no kernels of its own: it calls the kernels the Python path calls (the
// block kernel or ggml's matmul, and kernels.cpp's norm, rotary, silu*mul and paged decode attention),
// through function pointers the binding hands in, with the same arguments in the same order. So its result
// is bit for bit the Python path's; what it removes is ~190 us of Python per layer (module calls, tensor
// allocation, ctypes argument conversion), which was a third of a one-stream decode step of SmolLM2.
//
// Per layer, for x (M, D) the previous layer's MLP output and res (M, D) the residual stream:
//   h = rmsnorm(res += x) * w_in                 (layer 0: res = the embeddings, h = rmsnorm(res) * w_in; OLMo 2 and
//                                                EXAONE 4 have no w_in or w_post: h = (res += x))
// then the token mixer: in an LFM2 short conv layer
//   bcx = h . Win^T (M, 3D);  c = C * conv(B * x) over each sequence's window (tm_shortconv_decode);  y = c . Wout^T
// in a Mamba2 layer (Granite 4.0-H)
//   z | xBC | dt = h . Win^T;  g = the conv, the scan and the gated norm over each sequence's window and state
//   (tm_mamba2_decode) (M, I);  y = g . Wout^T
// in a Gated DeltaNet layer (Qwen3.5)
//   qkvz = h . Wqkvz^T;  ba = h . Wba^T;  g = the conv, the delta rule and the gated norm over each sequence's window
//   and state (tm_gdn_decode) (M, Hv dv);  y = g . Wout^T
// else attention:
//   qkv = h . Wqkv^T (+ b)                       (M, (nh + 2 nkv) hd), q | k | v heads adjacent (Qwen3.5's gated
//                                                attention: each q head then its gate's hd; q and k heads copied
//                                                out, adjacent, and the output times sigmoid(gate) before Wo)
//   q and k heads rmsnorm'ed in place, each by its norm's weight (Qwen3's q / k norms, Gemma 3's by (1 + w);
//   where the layer has them)
//   rotary on q and k heads in place (by the step's tables, or a windowed layer's own: Gemma's local layers);
//   k, v rows copied to their cache slots (all M before any attends)
//   a = attention(q over each row's paged context [start, len))   (M, nh hd) (scores soft-capped: Gemma 2)
//   h = rmsnorm(res += a . Wo^T) * w_post           (Gemma 2 / 3, GLM-4: rmsnorm(a . Wo^T) * w_attn_out joins res)
//   x = (act(h . Wg^T) * (h . Wu^T)) . Wd^T        act silu, or gelu (tanh) for Gemma; in a mixture-of-experts
//                                                  layer x = moe(h): the router, the routing and the chosen
//                                                  experts in one tm_moe call (ggml_shim.cpp)
//   (Gemma 2 / 3, GLM-4: x = rmsnorm(x) * w_mlp_out)
// (Cohere2: LayerNorm for every rmsnorm, and the MLP on the mixer's h: x = mixer(h) + mlp(h), no w_post)
// and at the end out = rmsnorm(res += x) * w_final.

#include <cstdint>
#include <cstring>

namespace {

using bf16 = uint16_t;

inline float to_f32(bf16 x) {
    uint32_t u = uint32_t(x) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline bf16 to_bf16(float x) {  // torch's rounding: to nearest, ties to even; NaN stays a quiet NaN
    uint32_t u;
    std::memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return bf16((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return bf16(u >> 16);
}

using BlockMatmulFn = int (*)(int type, const void* W, int64_t N, int64_t K, const float* x, int64_t ldx, int64_t M,
                              float* y, int64_t ldy, int nthreads);
using AmxBf16MatmulFn = int (*)(int type, const void* W, int64_t N, int64_t K, const bf16* x, int64_t ldx, int64_t M,
                                bf16* y, int64_t ldy, int nthreads);
using GgmlMatmulFn = int (*)(void** weights, const int64_t* offsets, int n_weights, const float* x, int64_t m,
                             int64_t k, float* y, int64_t ldy, int nthreads);
using AddRmsNormFn = int (*)(int dtype, void* out, int64_t out_stride, const void* x, int64_t x_stride, void* res,
                             int64_t res_stride, const void* w, int64_t rows, int64_t D, float eps, int nthreads);
using SiluMulFn = int (*)(int dtype, void* out, int64_t out_stride, const void* in, int64_t in_stride, int64_t rows,
                          int64_t I, int nthreads);
using RotaryFn = int (*)(int dtype, void* x, int64_t x_stride, int64_t heads, int64_t head_dim, int64_t rot,
                         const void* cos, const void* ssin, int64_t tab_stride, int64_t rows, int nthreads);
using HeadRmsNormFn = int (*)(int dtype, void* x, int64_t x_stride, int64_t rows, int64_t heads, int64_t hd,
                              const void* w, float offset, float eps, int nthreads);
using MoeFn = int (*)(void* router, const float* router_bias, const float* logits, int scoring, const float* sel_bias,
                      int renorm, float scaling, int top_k, int n_experts, void** gate_up, int n_gu, void** down,
                      const float* const* gu_bias, const float* const* down_bias, void** shared_gu, void* shared_down,
                      const float* shared_weight, const float* x, int64_t n_tokens, int64_t k, float* out, int64_t d,
                      int act, float alpha, float limit, int64_t max_rows, int n_threads);
using ShortConvFn = int (*)(int dtype, void* out, int64_t out_stride, const void* bcx, int64_t bcx_stride,
                            const float* conv_w, float* conv_pool, const int64_t* src_slots, const int64_t* dst_slots,
                            int64_t N, int64_t C, int64_t K, int nthreads);
using Mamba2Fn = int (*)(int dtype, void* out, int64_t out_stride, const void* xbc, int64_t xbc_stride, const void* z,
                         int64_t z_stride, const void* dt, int64_t dt_stride, const float* conv_w, const float* conv_b,
                         float* conv_pool, float* ssm_pool, const int64_t* src_slots, const int64_t* dst_slots,
                         const float* neg_a, const float* dt_bias, const float* D, const float* norm_w, int64_t N,
                         int64_t H, int64_t G, int64_t P, int64_t Ns, int64_t K, float eps, int nthreads);
using GdnFn = int (*)(int dtype, void* out, int64_t out_stride, const void* qkv, int64_t qkv_stride, const void* z,
                      int64_t z_stride, const void* ba, int64_t ba_stride, const float* conv_w, float* conv_pool,
                      float* ssm_pool, const int64_t* src_slots, const int64_t* dst_slots, const float* neg_a,
                      const float* dt_bias, const float* norm_w, int64_t N, int64_t Hk, int64_t Hv, int64_t dk,
                      int64_t dv, int64_t K, int tiled, float eps, int nthreads);
using SigmoidMulFn = int (*)(int dtype, void* x, int64_t x_stride, const void* g, int64_t g_stride,
                             int64_t g_head_stride, int64_t rows, int64_t heads, int64_t hd, int nthreads);
using SigmoidF32Fn = int (*)(int dtype, const void* x, int64_t n, float* out);
using AttentionFn = int (*)(int dtype, void* out, int64_t out_stride, const void* q, int64_t q_stride,
                            const void* k_cache, const void* v_cache, const int64_t* tables, int64_t table_stride,
                            const int64_t* lens, const int64_t* starts, int64_t num_seqs, int64_t nh, int64_t nkv,
                            int64_t hd, int64_t block_size, float scale, float softcap, int64_t partition,
                            int nthreads, int64_t prefill_from, const float* sinks);

}  // namespace

extern "C" {

// The kernels, as the libraries export them (the binding fills these from the loaded libraries).
struct TmKernels {
    BlockMatmulFn block_matmul;  // NULL when no linear uses the block kernel
    BlockMatmulFn amx_matmul;    // the same blocks on AMX at bf16 (amx_matmul.cpp); NULL when none uses it
    AmxBf16MatmulFn amx_matmul_bf16;  // the same kernel on bf16 rows in and out; set with amx_matmul
    int64_t amx_min_rows;        // kind 2 takes the AMX kernel from this many rows, the block kernel below
    BlockMatmulFn panel_matmul;  // the same blocks at fp32 for batches of rows (panel_matmul.cpp); NULL: never
    int64_t panel_min_rows;      // kind 0 takes the panel kernel from this many rows, the block kernel below
    GgmlMatmulFn ggml_matmul;    // NULL when no linear uses ggml's
    AddRmsNormFn add_rms_norm;
    SiluMulFn silu_and_mul;
    RotaryFn rotary;
    AttentionFn attention;       // tm_paged_attention_rows, every row a decode (prefill_from = M)
    HeadRmsNormFn head_rms_norm;
    MoeFn moe;                   // NULL when no layer is a mixture of experts
    ShortConvFn shortconv;       // NULL when no layer is a short conv
    Mamba2Fn mamba2;             // NULL when no layer is a Mamba2 one
    SiluMulFn gelu_tanh_and_mul; // the MLP's activation where TmModel.act is 1 (Gemma's)
    GdnFn gdn;                   // NULL when no layer is a Gated DeltaNet
    SigmoidMulFn sigmoid_mul;    // attention output gates (Qwen3.5's)
    SigmoidF32Fn sigmoid_f32;    // gated shared experts' weights
    AddRmsNormFn add_layer_norm; // every norm but the q / k ones where TmModel.norm is 1 (Cohere's LayerNorm)
};

// One linear layer y (M, out) = x (M, in) . W^T (+ bias): its output columns in parts.
//   kind 0: part i is a matrix of `rows[i]` rows in plain blocks of ggml type types[i] at ptrs[i], writing
//           columns [offsets[i], offsets[i] + rows[i]) (the block kernel, one call per part);
//   kind 1: ptrs are ggml weight handles, multiplied in one tm_matmul call with `offsets`;
//   kind 2: as kind 0, on the AMX kernel from amx_min_rows rows (bf16 products: the gguf method's choice at
//           bf16 on AMX), on the block kernel below.
struct TmLinear {
    int32_t kind;
    int32_t n_parts;
    int64_t in_features, out_features;
    const int32_t* types;      // (n_parts,), kinds 0 and 2
    const void* const* ptrs;   // (n_parts,)
    const int64_t* rows;       // (n_parts,), kinds 0 and 2
    const int64_t* offsets;    // (n_parts,)
    const void* bias;          // (out_features,) at the model's dtype, or NULL
};

// A mixture-of-experts layer: tm_moe's arguments but the step's (its router a ggml weight, no logits passed; a
// shared expert, if any, always inside the call, gated by sigmoid(h . shared_gate) where the layer has one).
struct TmMoe {
    void* router;
    const float* router_bias;
    int32_t scoring, renorm, top_k, n_experts, n_gu, act;
    float scaling, alpha, limit;
    const float* sel_bias;
    void** gate_up;
    void** down;
    const float* const* gu_bias;
    const float* const* down_bias;
    void** shared_gu;
    void* shared_down;
    int64_t max_rows;          // an expert's most rows (the caller runs the step natively only within them)
    TmLinear shared_gate;      // (1, D): the shared expert's output times sigmoid(h . w) (Qwen2-MoE's); n_parts 0: none
};

// A Mamba2 layer between its projections (tm_mamba2_decode's arguments but the step's); in_proj's rows are
// z (I = H P) | xBC (C = I + 2 G Ns) | dt (H).
struct TmMamba {
    const float* conv_w;       // (C, K)
    const float* conv_b;       // (C,)
    float* conv_pool;          // (slots, C, K - 1)
    float* ssm_pool;           // (slots, H, P, Ns)
    const float* neg_a;        // (H,) -exp(A_log)
    const float* dt_bias;      // (H,)
    const float* skip;         // (H,) D
    const float* norm_w;       // (I,)
    int64_t H, G, P, Ns, K;
    float eps;
};

// A Gated DeltaNet layer between its projections (tm_gdn_decode's arguments but the step's); in_proj_qkvz's rows are
// q | k | v (C = 2 Hk dk + Hv dv) | z (Hv dv), in_proj_ba's b | a (Hv each).
struct TmGdn {
    const float* conv_w;       // (C, K)
    float* conv_pool;          // (slots, C, K - 1)
    float* ssm_pool;           // (slots, Hv, dk, dv)
    const float* neg_a;        // (Hv,) -exp(A_log)
    const float* dt_bias;      // (Hv,)
    const float* norm_w;       // (dv,) the gated norm's weight
    int64_t Hk, Hv, dk, dv, K, tiled;
    float eps;
};

struct TmLayer {
    const void* input_norm;   // (D,), or NULL: none (OLMo 2's and EXAONE 4's layers norm only each sublayer's output)
    const void* post_norm;    // (D,) the norm before the MLP, or NULL: none
    TmLinear qkv, o, gate_up, down;
    void* k_cache;            // (num_blocks, block_size, nkv, hd), contiguous
    void* v_cache;
    int64_t window;           // 0: every key; W > 0: the last W keys of each query
    int64_t rotate;           // 1: rotary on q and k; 0: none (SmolLM3's NoPE layers)
    const void* q_norm;       // (hd,) per-head norms of q and k before rotary, or NULL (none)
    const void* k_norm;
    const TmMoe* moe;         // NULL: the gate_up / down MLP; else the mixture of experts (gate_up, down unused)
    const float* sinks;       // (nh,) fp32 attention sinks (gpt-oss's), or NULL
    // an LFM2 short conv layer instead of attention (qkv: in_proj (3D, D), o: out_proj (D, D); no KV cache), or NULL
    const float* conv_w;      // (D, K) fp32
    float* conv_pool;         // (slots, D, K - 1) fp32: each sequence's window, read from src, written to dst slots
    int64_t conv_k;
    const TmMamba* mamba;     // a Mamba2 layer instead of attention (qkv: in_proj, o: out_proj), or NULL
    int64_t rope_alt;         // 1: rotary by the step's second tables (cos_alt / ssin_alt: windowed layers' own base)
    const void* attn_out_norm;  // (D,) the mixer's output rmsnorm'ed before it joins the residual (Gemma 2 / 3,
                                // GLM-4), or NULL
    const void* mlp_out_norm;   // (D,) ... and the MLP's, or NULL
    // a Gated DeltaNet layer instead of attention (qkv: in_proj_qkvz, ba: in_proj_ba, o: out_proj), or NULL
    const TmGdn* gdn;
    TmLinear ba;
    int64_t gate;             // 1: q's rows are per head hd of q then hd of a gate; the output times sigmoid(gate)
    int64_t qk_norm_whole;    // 1: q_norm / k_norm normalize the whole projection (nh hd, nkv hd: OLMo 2's), not
                              // each head
    int64_t parallel;         // 1: the MLP reads the mixer's input h too; the layer's output is their sum (Cohere2)
};

struct TmModel {
    int32_t dtype;            // 0: fp32, 1: bf16 (activations, norm weights, biases, KV cache)
    int64_t num_layers, D, nh, nkv, hd, I, block_size, partition;
    int64_t rot;              // each head's leading dims that rotate (hd; fewer: partial rotary)
    float eps, scale;
    float residual_scale;     // each sublayer's output times this before it joins the residual (Granite; else 1)
    int32_t act;              // the MLP's gate activation: 0 silu, 1 gelu (tanh approximation; Gemma's); 2: no gate,
                              // relu(up) ** 2 (Arcee's: gate_up is up_proj, I rows)
    float qk_offset;          // q / k norms scale by (qk_offset + w) (Gemma 3's 1; else 0)
    float softcap;            // attention scores soft-capped at this (Gemma 2's); 0: none
    int32_t qk_norm_after_rotary;  // 1: the q / k norms after rotary (Hunyuan's), not before
    int32_t norm;             // the layers' and the final norm: 0 RMSNorm, 1 LayerNorm without a bias (Cohere's)
    const TmLayer* layers;    // (num_layers,)
    const void* final_norm;   // (D,)
    TmKernels k;
};

// One step's inputs, outputs and scratch, at the model's dtype unless said; every buffer contiguous.
struct TmStep {
    int64_t M;                 // decode tokens
    int64_t num_layers;        // run the first this many layers (layer-skip drafting), then the final norm
    void* x;                   // (M, D) in: the embeddings; clobbered (the residual stream)
    const void* cos;           // (M, rot) rotary rows, tab_stride apart
    const void* ssin;          // (M, rot) signed sin rows
    const void* cos_alt;       // (M, rot) the second tables' rows (layers with rope_alt), tab_stride apart; or NULL
    const void* ssin_alt;
    int64_t tab_stride;
    const int64_t* slots;      // (M,) cache slot of each token's K/V
    const int64_t* tables;     // (M, table_stride) block table of each token's sequence
    int64_t table_stride;
    const int64_t* lens;       // (M,) keys each token attends to (its position + 1)
    const int64_t* src_slots;  // (M,) each sequence's recurrent state slot read (-1: fresh) (short conv, Mamba2)
    const int64_t* dst_slots;  // (M,) ... and written
    int64_t* starts;           // (M,) scratch: each token's first key under a window
    void* qkv;                 // (M, (nh + 2 nkv) hd) ((2 nh + 2 nkv) hd gated), or a recurrent layer's in_proj rows if wider
    void* qk;                  // (M, (nh + nkv) hd): gated attention's q and k heads, adjacent; or NULL
    void* attn;                // (M, nh hd), or a recurrent layer's rows for out_proj if wider
    void* h;                   // (M, D)
    void* y;                   // (M, D)
    void* gate_up;             // (M, 2 I)
    void* act;                 // (M, I)
    void* out;                 // (M, D) the final normed hidden states
    void* gate_logit;          // (M,) a gated shared expert's logits
    float* shared_w;           // (M,) fp32: ... and weights
    float* wide_in;            // bf16 only, fp32: (M, the widest matmul input)
    float* wide_out;           // bf16 only, fp32: (M, the widest matmul output)
    int nthreads;              // for the matmuls and the kernels (which keep a single row on one thread)
};

int tm_decode_step_abi() { return 18; }  // 18: Arcee's relu(up) ** 2; 17: LayerNorm models, parallel MLPs (Cohere2); 16: q / k norms after rotary; 15: gated shared experts; 14: layers without pre-norms, whole-projection q / k norms (OLMo 2, EXAONE 4); 13: Qwen3.5's layers (Gated DeltaNet, gated attention); 12: Gemma's layers (sandwich norms, GELU, (1 + w) q / k norms, two rotary tables, softcap); 11: partial rotary; 10: Mamba2 layers; 9: LFM2's short conv layers; 8: attention sinks; 7: q / k norms and mixture-of-experts layers; 6: the attention kernel's softcap

}  // extern "C"

namespace {

int matmul(const TmKernels& k, const TmLinear& L, const float* x, int64_t M, float* y, int nthreads) {
    if (L.kind == 1)
        return k.ggml_matmul(const_cast<void**>(L.ptrs), L.offsets, L.n_parts, x, M, L.in_features, y,
                             L.out_features, nthreads);
    const BlockMatmulFn fn = L.kind == 2 && M >= k.amx_min_rows                               ? k.amx_matmul
                             : L.kind == 0 && k.panel_matmul != nullptr && M >= k.panel_min_rows ? k.panel_matmul
                                                                                                 : k.block_matmul;
    int rc = 0;
    for (int i = 0; i < L.n_parts && rc == 0; ++i)
        rc = fn(L.types[i], L.ptrs[i], L.rows[i], L.in_features, x, L.in_features, M, y + L.offsets[i],
                L.out_features, nthreads);
    return rc;
}

// y (M, out) = x (M, in) . W^T + bias, at the model's dtype (see the header for bf16's rounding)
int linear(const TmModel& m, const TmLinear& L, const void* x, int64_t M, void* y, const TmStep& s) {
    const int64_t n_in = M * L.in_features, n_out = M * L.out_features;
    if (m.dtype == 0) {
        float* yf = static_cast<float*>(y);
        const int rc = matmul(m.k, L, static_cast<const float*>(x), M, yf, s.nthreads);
        if (rc == 0 && L.bias != nullptr) {
            const float* b = static_cast<const float*>(L.bias);
            for (int64_t i = 0; i < n_out; ++i) yf[i] = yf[i] + b[i % L.out_features];
        }
        return rc;
    }
    const bf16* xb = static_cast<const bf16*>(x);
    bf16* yb = static_cast<bf16*>(y);
    if (L.kind == 2 && M >= m.k.amx_min_rows && m.k.amx_matmul_bf16 != nullptr) {
        for (int i = 0; i < L.n_parts; ++i) {
            const int rc = m.k.amx_matmul_bf16(L.types[i], L.ptrs[i], L.rows[i], L.in_features, xb, L.in_features, M,
                                               yb + L.offsets[i], L.out_features, s.nthreads);
            if (rc) return rc;
        }
    } else {
        for (int64_t i = 0; i < n_in; ++i) s.wide_in[i] = to_f32(xb[i]);
        const int rc = matmul(m.k, L, s.wide_in, M, s.wide_out, s.nthreads);
        if (rc) return rc;
        for (int64_t i = 0; i < n_out; ++i) yb[i] = to_bf16(s.wide_out[i]);
    }
    if (L.bias != nullptr) {
        const bf16* b = static_cast<const bf16*>(L.bias);
        for (int64_t i = 0; i < n_out; ++i) yb[i] = to_bf16(to_f32(yb[i]) + to_f32(b[i % L.out_features]));
    }
    return 0;
}

// y (M, D) = the mixture of experts on h (M, D), at the model's dtype (bf16: widened, then rounded, as the
// Python path does around the same call)
int moe(const TmModel& m, const TmMoe& E, const void* h, int64_t M, void* y, const TmStep& s) {
    const float* shared_w = nullptr;
    if (E.shared_gate.n_parts > 0) {  // (before h is widened: the gate's matmul uses the wide buffers too)
        int rc = linear(m, E.shared_gate, h, M, s.gate_logit, s);
        if (rc == 0) rc = m.k.sigmoid_f32(m.dtype, s.gate_logit, M, s.shared_w);
        if (rc) return rc;
        shared_w = s.shared_w;
    }
    const float* x = static_cast<const float*>(h);
    float* out = static_cast<float*>(y);
    if (m.dtype != 0) {
        const bf16* hb = static_cast<const bf16*>(h);
        for (int64_t i = 0; i < M * m.D; ++i) s.wide_in[i] = to_f32(hb[i]);
        x = s.wide_in, out = s.wide_out;
    }
    const int rc = m.k.moe(E.router, E.router_bias, nullptr, E.scoring, E.sel_bias, E.renorm, E.scaling, E.top_k,
                           E.n_experts, E.gate_up, E.n_gu, E.down, E.gu_bias, E.down_bias, E.shared_gu, E.shared_down,
                           shared_w, x, M, m.D, out, m.D, E.act, E.alpha, E.limit, E.max_rows, s.nthreads);
    if (rc == 0 && m.dtype != 0) {
        bf16* yb = static_cast<bf16*>(y);
        for (int64_t i = 0; i < M * m.D; ++i) yb[i] = to_bf16(s.wide_out[i]);
    }
    return rc;
}

// y (M, D) = the short conv layer on h (M, D): in_proj into qkv's buffer, the conv into attn's, out_proj
int short_conv(const TmModel& m, const TmLayer& L, const TmStep& s) {
    int rc = linear(m, L.qkv, s.h, s.M, s.qkv, s);
    if (rc == 0)
        rc = m.k.shortconv(m.dtype, s.attn, m.D, s.qkv, 3 * m.D, L.conv_w, L.conv_pool, s.src_slots, s.dst_slots, s.M,
                           m.D, L.conv_k, s.nthreads);
    return rc == 0 ? linear(m, L.o, s.attn, s.M, s.y, s) : rc;
}

// y (M, D) = the Mamba2 layer on h (M, D): in_proj into qkv's buffer, the kernel into attn's, out_proj
int mamba2(const TmModel& m, const TmLayer& L, const TmStep& s) {
    const TmMamba& A = *L.mamba;
    const int64_t I = A.H * A.P, W = L.qkv.out_features;  // in_proj's rows: z (I) | xBC | dt (H)
    const int64_t esize = m.dtype == 0 ? 4 : 2;
    char* zx = static_cast<char*>(s.qkv);
    int rc = linear(m, L.qkv, s.h, s.M, s.qkv, s);
    if (rc == 0)
        rc = m.k.mamba2(m.dtype, s.attn, I, zx + I * esize, W, zx, W, zx + (W - A.H) * esize, W, A.conv_w, A.conv_b,
                        A.conv_pool, A.ssm_pool, s.src_slots, s.dst_slots, A.neg_a, A.dt_bias, A.skip, A.norm_w, s.M,
                        A.H, A.G, A.P, A.Ns, A.K, A.eps, s.nthreads);
    return rc == 0 ? linear(m, L.o, s.attn, s.M, s.y, s) : rc;
}

// y (M, D) = the Gated DeltaNet layer on h (M, D): in_proj_qkvz into qkv's buffer, in_proj_ba into y's (2 Hv <= D),
// the kernel into attn's, out_proj
int gdn(const TmModel& m, const TmLayer& L, const TmStep& s) {
    const TmGdn& G = *L.gdn;
    const int64_t C = 2 * G.Hk * G.dk + G.Hv * G.dv, W = L.qkv.out_features, esize = m.dtype == 0 ? 4 : 2;
    int rc = linear(m, L.qkv, s.h, s.M, s.qkv, s);
    if (rc == 0) rc = linear(m, L.ba, s.h, s.M, s.y, s);
    if (rc == 0)
        rc = m.k.gdn(m.dtype, s.attn, G.Hv * G.dv, s.qkv, W, static_cast<char*>(s.qkv) + C * esize, W, s.y, 2 * G.Hv,
                     G.conv_w, G.conv_pool, G.ssm_pool, s.src_slots, s.dst_slots, G.neg_a, G.dt_bias, G.norm_w, s.M,
                     G.Hk, G.Hv, G.dk, G.dv, G.K, int(G.tiled), G.eps, s.nthreads);
    return rc == 0 ? linear(m, L.o, s.attn, s.M, s.y, s) : rc;
}

// y (M, D) = the attention layer on h (M, D), every token's K/V written to the cache first
int attention(const TmModel& m, const TmLayer& L, const TmStep& s) {
    const TmKernels& k = m.k;
    const int64_t M = s.M, hd = m.hd, nh = m.nh, nkv = m.nkv;
    const int64_t qkv_w = (nh * (L.gate ? 2 : 1) + 2 * nkv) * hd, kv_w = nkv * hd, esize = m.dtype == 0 ? 4 : 2;
    const int t = s.nthreads, dt = m.dtype;
    auto at = [esize](void* p, int64_t elems) { return static_cast<char*>(p) + elems * esize; };
    int rc = linear(m, L.qkv, s.h, M, s.qkv, s);
    if (rc) return rc;
    // q | k heads adjacent at qk, rows qk_w apart; v rows at v, qkv_w apart
    void* qk = s.qkv;
    int64_t qk_w = qkv_w;
    const char* v = at(s.qkv, (nh + nkv) * hd);
    if (L.gate) {  // q's heads out from between their gates, beside k's
        qk = s.qk, qk_w = (nh + nkv) * hd, v = at(s.qkv, (2 * nh + nkv) * hd);
        for (int64_t r = 0; r < M; ++r) {
            for (int64_t h = 0; h < nh; ++h)
                std::memcpy(at(qk, r * qk_w + h * hd), at(s.qkv, r * qkv_w + 2 * h * hd), hd * esize);
            std::memcpy(at(qk, r * qk_w + nh * hd), at(s.qkv, r * qkv_w + 2 * nh * hd), kv_w * esize);
        }
    }
    const int64_t qh = L.qk_norm_whole ? 1 : nh, kh = L.qk_norm_whole ? 1 : nkv;  // the norms' "heads"
    auto norms = [&]() {
        int r = 0;
        if (L.q_norm != nullptr)
            r = k.head_rms_norm(dt, qk, qk_w, M, qh, nh * hd / qh, L.q_norm, m.qk_offset, m.eps, t);
        if (r == 0 && L.k_norm != nullptr)
            r = k.head_rms_norm(dt, at(qk, nh * hd), qk_w, M, kh, nkv * hd / kh, L.k_norm, m.qk_offset, m.eps, t);
        return r;
    };
    if (!m.qk_norm_after_rotary) rc = norms();
    if (rc == 0 && L.rotate)
        rc = k.rotary(dt, qk, qk_w, nh + nkv, hd, m.rot, L.rope_alt ? s.cos_alt : s.cos,
                      L.rope_alt ? s.ssin_alt : s.ssin, s.tab_stride, M, t);
    if (rc == 0 && m.qk_norm_after_rotary) rc = norms();
    if (rc) return rc;
    for (int64_t r = 0; r < M; ++r) {  // every token's K/V is in the cache before any token attends
        std::memcpy(at(L.k_cache, s.slots[r] * kv_w), at(qk, r * qk_w + nh * hd), kv_w * esize);
        std::memcpy(at(L.v_cache, s.slots[r] * kv_w), v + r * qkv_w * esize, kv_w * esize);
    }
    const int64_t* starts = nullptr;
    if (L.window > 0) {
        for (int64_t r = 0; r < M; ++r) s.starts[r] = s.lens[r] > L.window ? s.lens[r] - L.window : 0;
        starts = s.starts;
    }
    rc = k.attention(dt, s.attn, nh * hd, qk, qk_w, L.k_cache, L.v_cache, s.tables, s.table_stride, s.lens, starts,
                     M, nh, nkv, hd, m.block_size, m.scale, m.softcap, m.partition, t, M, L.sinks);
    if (rc == 0 && L.gate) rc = k.sigmoid_mul(dt, s.attn, nh * hd, at(s.qkv, hd), qkv_w, 2 * hd, M, nh, hd, t);
    return rc == 0 ? linear(m, L.o, s.attn, M, s.y, s) : rc;
}

// y (n,) = y + z, rounded as torch rounds a + b
void add_rows(int dt, void* y, const void* z, int64_t n) {
    if (dt == 0) {
        float* a = static_cast<float*>(y);
        const float* b = static_cast<const float*>(z);
        for (int64_t i = 0; i < n; ++i) a[i] = a[i] + b[i];
    } else {
        bf16* a = static_cast<bf16*>(y);
        const bf16* b = static_cast<const bf16*>(z);
        for (int64_t i = 0; i < n; ++i) a[i] = to_bf16(to_f32(a[i]) + to_f32(b[i]));
    }
}

// h = rmsnorm(res += x) * w (x NULL: h = rmsnorm(res) * w); w NULL (no norm before the sublayer): res += x, then h = a
// copy of res, each sum rounded as torch rounds x + res
int into_h(const TmModel& m, const void* w, const void* x, void* res, const TmStep& s) {
    const int64_t M = s.M, D = m.D, n = M * D;
    const AddRmsNormFn norm = m.norm == 1 ? m.k.add_layer_norm : m.k.add_rms_norm;
    if (w != nullptr)
        return x == nullptr ? norm(m.dtype, s.h, D, res, D, nullptr, 0, w, M, D, m.eps, s.nthreads)
                            : norm(m.dtype, s.h, D, x, D, res, D, w, M, D, m.eps, s.nthreads);
    if (x != nullptr) add_rows(m.dtype, res, x, n);
    std::memcpy(s.h, res, n * (m.dtype == 0 ? 4 : 2));
    return 0;
}

// dst (M, D) = the layer's MLP (or mixture of experts) on h (M, D)
int mlp(const TmModel& m, const TmLayer& L, const TmStep& s, void* dst) {
    if (L.moe != nullptr) return moe(m, *L.moe, s.h, s.M, dst, s);
    int rc = linear(m, L.gate_up, s.h, s.M, s.gate_up, s);
    if (rc == 0 && m.act == 2) {  // each product rounded once, as torch's square(relu(up))
        const int64_t n = s.M * m.I;
        if (m.dtype == 0) {
            const float* u = static_cast<const float*>(s.gate_up);
            float* a = static_cast<float*>(s.act);
            for (int64_t i = 0; i < n; ++i) a[i] = u[i] > 0.0f ? u[i] * u[i] : 0.0f;
        } else {
            const bf16* u = static_cast<const bf16*>(s.gate_up);
            bf16* a = static_cast<bf16*>(s.act);
            for (int64_t i = 0; i < n; ++i) {
                const float v = to_f32(u[i]);
                a[i] = to_bf16(v > 0.0f ? v * v : 0.0f);
            }
        }
    } else if (rc == 0)
        rc = (m.act == 1 ? m.k.gelu_tanh_and_mul : m.k.silu_and_mul)(m.dtype, s.act, m.I, s.gate_up, 2 * m.I, s.M,
                                                                      m.I, s.nthreads);
    return rc == 0 ? linear(m, L.down, s.act, s.M, dst, s) : rc;
}


// p (n,) *= f in place, rounded as torch rounds a tensor times a Python float (in fp32; bf16 to nearest even)
void scale_rows(int dt, void* p, int64_t n, float f) {
    if (dt == 0) {
        float* q = static_cast<float*>(p);
        for (int64_t i = 0; i < n; ++i) q[i] *= f;
    } else {
        bf16* q = static_cast<bf16*>(p);
        for (int64_t i = 0; i < n; ++i) q[i] = to_bf16(to_f32(q[i]) * f);
    }
}

}  // namespace

extern "C" {

// Returns 0; a kernel's nonzero status (and the step is not to be trusted) otherwise.
int tm_decode_step(const TmModel* model, const TmStep* s) {
    const TmModel& m = *model;
    const TmKernels& k = m.k;
    const int64_t M = s->M, D = m.D;
    const int t = s->nthreads, dt = m.dtype;
    if (M <= 0) return 0;
    if (dt != 0 && dt != 1) return -1;
    int rc = 0;
    void* res = s->x;
    const AddRmsNormFn norm = m.norm == 1 ? k.add_layer_norm : k.add_rms_norm;
    for (int64_t l = 0; l < s->num_layers && rc == 0; ++l) {
        const TmLayer& L = m.layers[l];
        rc = into_h(m, L.input_norm, l == 0 ? nullptr : s->y, res, *s);
        if (rc == 0)
            rc = L.conv_w != nullptr ? short_conv(m, L, *s)
                 : L.mamba != nullptr ? mamba2(m, L, *s)
                 : L.gdn != nullptr   ? gdn(m, L, *s)
                                      : attention(m, L, *s);
        if (rc == 0 && L.parallel) {  // the MLP on the same h, into out's buffer (written only at the end), summed
            rc = mlp(m, L, *s, s->out);
            if (rc == 0) add_rows(dt, s->y, s->out, M * D);
            continue;
        }
        if (rc == 0 && L.attn_out_norm != nullptr)  // in place (the kernel reads a row before writing it)
            rc = norm(dt, s->y, D, s->y, D, nullptr, 0, L.attn_out_norm, M, D, m.eps, t);
        if (rc == 0 && m.residual_scale != 1.0f) scale_rows(dt, s->y, M * D, m.residual_scale);
        if (rc == 0) rc = into_h(m, L.post_norm, s->y, res, *s);
        if (rc == 0) rc = mlp(m, L, *s, s->y);
        if (rc == 0 && L.mlp_out_norm != nullptr)
            rc = norm(dt, s->y, D, s->y, D, nullptr, 0, L.mlp_out_norm, M, D, m.eps, t);
        if (rc == 0 && m.residual_scale != 1.0f) scale_rows(dt, s->y, M * D, m.residual_scale);
    }
    if (rc) return rc;
    if (s->num_layers == 0) return norm(dt, s->out, D, res, D, nullptr, 0, m.final_norm, M, D, m.eps, t);
    return norm(dt, s->out, D, s->y, D, res, D, m.final_norm, M, D, m.eps, t);
}

}  // extern "C"
