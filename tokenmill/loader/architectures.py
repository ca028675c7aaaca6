"""The model registry's table: every architecture tokenmill implements, and the names it goes by.

One row per architecture (our name is ModelConfig.architecture). It maps the names other tools use
onto it: GGUF's `general.architecture`, the HF `architectures` classes in config.json, and the HF class
`tokenmill convert` writes. The implementation is named as "module:Class" and imported only when that
architecture is loaded (models/registry.py), so this table stays free of torch and readable by the
loader, the memory plan and the CLI.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Architecture:
    name: str  # ours: ModelConfig.architecture
    implementation: str  # "module:Class", a CausalLM (models/interface.py)
    gguf_names: tuple[str, ...]  # GGUF general.architecture values that load as this one
    hf_classes: tuple[str, ...]  # HF config.json `architectures` entries; the first is what convert writes
    hf_model_type: str  # HF config.json `model_type` convert writes
    is_moe: bool = False  # mixture of experts: a GGUF of one of gguf_names with expert tensors loads as this


_LLAMA = "tokenmill.models.llama:LlamaForCausalLM"
_MOE = "tokenmill.models.moe:MoEForCausalLM"

ARCHITECTURES: dict[str, Architecture] = {a.name: a for a in [
    Architecture("llama", _LLAMA, ("llama", "smollm"), ("LlamaForCausalLM",), "llama"),
    Architecture("mistral", _LLAMA, ("mistral",), ("MistralForCausalLM",), "mistral"),
    # Ministral 3 (3B, 8B, 14B): Mistral with YaRN and an attention temperature past the original context
    Architecture("ministral3", _LLAMA, ("mistral3",), ("Ministral3ForCausalLM",), "ministral3"),
    Architecture("qwen2", _LLAMA, ("qwen2",), ("Qwen2ForCausalLM",), "qwen2"),
    Architecture("granite", _LLAMA, ("granite",), ("GraniteForCausalLM",), "granite"),
    Architecture("smollm3", _LLAMA, ("smollm3",), ("SmolLM3ForCausalLM",), "smollm3"),
    Architecture("olmo2", "tokenmill.models.olmo2:Olmo2ForCausalLM", ("olmo2",), ("Olmo2ForCausalLM",), "olmo2"),
    # OLMo 3: OLMo 2 with windowed layers (3 of 4) rotated without the global layers' YaRN; llama.cpp writes it as
    # olmo2 with attention.sliding_window (ModelConfig.from_gguf tells them apart; the name finds OLMo 2's row
    # first)
    Architecture("olmo3", "tokenmill.models.olmo2:Olmo2ForCausalLM", ("olmo2",), ("Olmo3ForCausalLM",), "olmo3"),
    Architecture("exaone4", "tokenmill.models.olmo2:Exaone4ForCausalLM", ("exaone4",), ("Exaone4ForCausalLM",),
                 "exaone4"),
    # ERNIE 4.5 (dense): llama with rotary on adjacent pairs of dims (loader/weights.py, INTERLEAVED_ROTARY)
    Architecture("ernie4_5", _LLAMA, ("ernie4_5",), ("Ernie4_5ForCausalLM",), "ernie4_5"),
    # ERNIE 4.5 MoE (21B-A3B, 300B-A47B): ERNIE 4.5's attention, a dense first layer, then experts chosen with a
    # per-expert bias and two ungated shared experts
    Architecture("ernie4_5_moe", "tokenmill.models.moe:Ernie45MoeForCausalLM", ("ernie4_5-moe",),
                 ("Ernie4_5_MoeForCausalLM",), "ernie4_5_moe", is_moe=True),
    Architecture("glm4", "tokenmill.models.glm4:Glm4ForCausalLM", ("glm4",), ("Glm4ForCausalLM",), "glm4"),
    Architecture("hunyuan_dense", "tokenmill.models.hunyuan:HunYuanDenseForCausalLM", ("hunyuan-dense",),
                 ("HunYuanDenseV1ForCausalLM",), "hunyuan_v1_dense"),
    Architecture("arcee", "tokenmill.models.arcee:ArceeForCausalLM", ("arcee",), ("ArceeForCausalLM",), "arcee"),
    Architecture("cohere2", "tokenmill.models.cohere2:Cohere2ForCausalLM", ("cohere2",), ("Cohere2ForCausalLM",),
                 "cohere2"),
    Architecture("qwen3", _LLAMA, ("qwen3",), ("Qwen3ForCausalLM",), "qwen3"),
    # Qwen3.5 (0.8B-27B): three Gated DeltaNet (linear attention, a recurrent state) layers to one of gated
    # attention; the VL checkpoint's language model
    Architecture("qwen3_5", "tokenmill.models.qwen3_5:Qwen3_5ForCausalLM", ("qwen35",),
                 ("Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration"), "qwen3_5_text"),
    # Qwen3.5 MoE (35B-A3B, 122B-A10B, 397B-A17B): Qwen3.5's layers with experts and a gated shared expert
    Architecture("qwen3_5_moe", "tokenmill.models.qwen3_5:Qwen3_5MoeForCausalLM", ("qwen35moe",),
                 ("Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration"), "qwen3_5_moe_text", is_moe=True),
    # LFM2 (350M-2.6B): short-conv layers (a gated depthwise conv, a recurrent state per sequence) between GQA
    # layers with q / k norms
    Architecture("lfm2", "tokenmill.models.lfm2:Lfm2ForCausalLM", ("lfm2",), ("Lfm2ForCausalLM",), "lfm2"),
    # LFM2-MoE (8B-A1B): LFM2's layers, experts (sigmoid scores, a selection-only bias) past the leading dense MLPs
    Architecture("lfm2_moe", "tokenmill.models.lfm2:Lfm2MoeForCausalLM", ("lfm2moe",), ("Lfm2MoeForCausalLM",),
                 "lfm2_moe", is_moe=True),
    # Granite 4.0-H (Micro, Tiny, Small): Mamba2 layers (a recurrent state per sequence) among GQA attention layers
    # (NoPE in the released ones), Granite's multipliers; a dense MLP (Micro) or experts beside an ungated shared
    # MLP (Tiny, Small). One HF class and one GGUF name for both: ModelConfig tells them apart by the experts
    Architecture("granite_hybrid", "tokenmill.models.granite_hybrid:GraniteHybridForCausalLM", ("granitehybrid",),
                 ("GraniteMoeHybridForCausalLM",), "granitemoehybrid"),
    Architecture("granite_hybrid_moe", "tokenmill.models.granite_hybrid:GraniteHybridForCausalLM", ("granitehybrid",),
                 ("GraniteMoeHybridForCausalLM",), "granitemoehybrid", is_moe=True),
    Architecture("qwen3moe", _MOE, ("qwen3moe",), ("Qwen3MoeForCausalLM",), "qwen3_moe", is_moe=True),
    Architecture("qwen2moe", _MOE, ("qwen2moe",), ("Qwen2MoeForCausalLM",), "qwen2_moe", is_moe=True),
    # llama.cpp writes Mixtral as general.architecture "llama", with expert tensors (blk.N.ffn_gate_exps)
    Architecture("mixtral", _MOE, ("llama",), ("MixtralForCausalLM",), "mixtral", is_moe=True),
    # OLMoE: OLMo's whole-projection q / k norms before a llama-style pre-norm layer, experts for the MLP
    Architecture("olmoe", "tokenmill.models.moe:OlmoeForCausalLM", ("olmoe",), ("OlmoeForCausalLM",), "olmoe",
                 is_moe=True),
    # Granite 3.x MoE: Granite's four multipliers, experts for the MLP, and (GraniteMoeShared, which llama.cpp
    # writes as "granitemoe" too) an always-on shared expert beside them
    Architecture("granitemoe", _MOE, ("granitemoe",), ("GraniteMoeForCausalLM", "GraniteMoeSharedForCausalLM"),
                 "granitemoe", is_moe=True),
    # gpt-oss (20b, 120b): attention sinks, alternating windows, biased experts on a clamped SwiGLU
    Architecture("gpt_oss", "tokenmill.models.gpt_oss:GptOssForCausalLM", ("gpt-oss",), ("GptOssForCausalLM",),
                 "gpt_oss", is_moe=True),
    Architecture("phi3", "tokenmill.models.phi3:Phi3ForCausalLM", ("phi3",), ("Phi3ForCausalLM",), "phi3"),
    Architecture("gemma3", "tokenmill.models.gemma3:Gemma3ForCausalLM", ("gemma3",), ("Gemma3ForCausalLM",),
                 "gemma3_text"),
    Architecture("gemma", "tokenmill.models.gemma:GemmaForCausalLM", ("gemma",), ("GemmaForCausalLM",), "gemma"),
    Architecture("gemma2", "tokenmill.models.gemma3:Gemma3ForCausalLM", ("gemma2",), ("Gemma2ForCausalLM",),
                 "gemma2"),
]}


def supported() -> str:
    """The supported architectures, for error messages."""
    return ", ".join(sorted(ARCHITECTURES))


def from_gguf_name(gguf_arch: str, has_experts: bool = False) -> Architecture:
    """The architecture a GGUF file's general.architecture names, the mixture-of-experts one where the
    file has expert tensors; a ValueError listing ours otherwise."""
    named = [a for a in ARCHITECTURES.values() if gguf_arch in a.gguf_names]
    if not named:
        raise ValueError(f"GGUF architecture {gguf_arch!r} is not supported; supported: {supported()}")
    for a in named:
        if a.is_moe == has_experts:
            return a
    kind = "with" if has_experts else "without"
    raise ValueError(f"GGUF architecture {gguf_arch!r} {kind} expert tensors is not supported; supported: "
                     f"{supported()}")


def from_hf_config(hf_archs: list[str], model_type: str | None) -> Architecture:
    """The architecture of an HF config.json (its `architectures` list, else its model_type)."""
    for name in hf_archs:
        for a in ARCHITECTURES.values():
            if name in a.hf_classes:
                return a
    if not hf_archs and model_type is not None:
        for a in ARCHITECTURES.values():
            if a.hf_model_type == model_type:
                return a
    raise ValueError(f"architecture {hf_archs or model_type} is not supported; supported: {supported()} "
                     f"(HF classes: {', '.join(sorted(c for a in ARCHITECTURES.values() for c in a.hf_classes))})")


def get(name: str) -> Architecture:
    if name not in ARCHITECTURES:
        raise ValueError(f"architecture {name!r} is not supported; supported: {supported()}")
    return ARCHITECTURES[name]
