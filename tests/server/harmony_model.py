"""A tiny model that speaks harmony (gpt-oss's format), for the tests of its reading (openai/harmony.py).

- its tokenizer: the default model's, with harmony's seven markers added as special tokens, as they are in
  gpt-oss's vocabulary (so a default decode drops them);
- its chat template: a small harmony-style one written here (tools as a `functions` namespace in a developer
  message, past calls as messages to functions.NAME, the prompt ending in `<|start|>assistant`; like
  gpt-oss's, it refuses a call turn with both reasoning and content);
- its weights: a one-layer Llama that answers by a script. Attention and MLP write nothing (o_proj and
  down_proj are zero), so the next token depends on the current one alone: each of the script's tokens has
  its own embedding direction, and the output matrix maps it to the token after it. Greedy decoding after
  the prompt's last token (the template's `assistant`) then writes the script, up to its end token. A
  script's tokens must all differ (a repeated token would loop), so a script holds one <|message|>.

A grammar (structured_outputs) still writes any other answer: where it allows the script's next token
that one wins, elsewhere every logit is 0 and the grammar decides.
"""

from __future__ import annotations

import json
from pathlib import Path

MARKERS = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>", "<|call|>", "<|constrain|>"]
TEMPLATE = (
    "{%- if tools -%}<|start|>developer<|message|># Tools\nnamespace functions {\n"
    "{%- for t in tools %}\ntype {{ t.function.name }} = (_: {{ (t.function.parameters or {}) | tojson }}) => any;"
    "{%- endfor %}\n}<|end|>{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' -%}"
    "{%- if m.tool_calls and m.content and m.thinking -%}{{ raise_exception('a call turn takes its analysis "
    "from its thinking or its content, not both') }}{%- endif -%}"
    "{%- if m.thinking -%}<|start|>assistant<|channel|>analysis<|message|>{{ m.thinking }}<|end|>{%- endif -%}"
    "{%- if m.content -%}<|start|>assistant<|channel|>final<|message|>{{ m.content }}<|end|>{%- endif -%}"
    "{%- for c in m.tool_calls or [] -%}<|start|>assistant to=functions.{{ c.function.name }}<|channel|>"
    "commentary json<|message|>{{ c.function.arguments | tojson }}<|call|>{%- endfor -%}"
    "{%- elif m.role == 'tool' -%}<|start|>functions.{{ m.name or m.tool_call_id }} to=assistant<|channel|>"
    "commentary<|message|>{{ m.content }}<|end|>"
    "{%- else -%}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|start|>assistant{%- endif -%}")
# what the model says: reasoning, then an answer after the message's end (without a header of its own: a
# script has one <|message|>)
THINKING = "<|channel|>analysis<|message|>Two and two make four<|end|>Four!<|return|>"
CALLING = '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>'
HIDDEN, WIDTH = 32, 64  # the model's layer widths (HIDDEN: room for a script of up to 32 tokens)


def harmony_tokenizer_json(path: Path) -> None:
    """The default model's tokenizer with the markers added as special tokens, saved as a tokenizer.json."""
    from tokenizers import AddedToken

    from tokenmill.loader.gguf import GGUFFile
    from tokenmill.loader.model_source import default_model_path
    from tokenmill.tokenizer.tokenizer import Tokenizer

    backend = Tokenizer.from_gguf(GGUFFile(default_model_path()).metadata).backend
    backend.add_special_tokens([AddedToken(m, special=True, normalized=False) for m in MARKERS])
    backend.save(str(path))


def write_harmony_model(root: Path, script: str) -> Path:
    """An HF directory at `root` whose model answers `script` (see the module doc) to any chat prompt."""
    import torch
    from safetensors.torch import save_file
    from tokenizers import Tokenizer

    root.mkdir(parents=True, exist_ok=True)
    harmony_tokenizer_json(root / "tokenizer.json")
    (root / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|return|>", "add_bos_token": False,
                                                            "chat_template": TEMPLATE}))
    backend = Tokenizer.from_file(str(root / "tokenizer.json"))
    vocab = backend.get_vocab_size(with_added_tokens=True)
    prompt_end = backend.encode("<|start|>assistant", add_special_tokens=False).ids[-1]
    ids = [prompt_end, *backend.encode(script, add_special_tokens=False).ids]
    assert len(set(ids)) == len(ids) <= HIDDEN, f"a script's tokens must differ: {ids}"
    embed = torch.zeros(vocab, HIDDEN)
    head = torch.zeros(vocab, HIDDEN)
    for k, (tok, after) in enumerate(zip(ids, ids[1:])):
        embed[tok, k] = 1.0  # direction k: "the current token is the script's k-th"
        head[after, k] = 10.0  # ... so the next is its (k + 1)-th
    heads, head_dim = 2, HIDDEN // 2
    layer = {"input_layernorm.weight": torch.ones(HIDDEN), "post_attention_layernorm.weight": torch.ones(HIDDEN),
             "self_attn.q_proj.weight": torch.randn(HIDDEN, HIDDEN) * 0.1,
             "self_attn.k_proj.weight": torch.randn(head_dim, HIDDEN) * 0.1,
             "self_attn.v_proj.weight": torch.randn(head_dim, HIDDEN) * 0.1,
             "self_attn.o_proj.weight": torch.zeros(HIDDEN, HIDDEN),
             "mlp.gate_proj.weight": torch.randn(WIDTH, HIDDEN) * 0.1,
             "mlp.up_proj.weight": torch.randn(WIDTH, HIDDEN) * 0.1,
             "mlp.down_proj.weight": torch.zeros(HIDDEN, WIDTH)}
    weights = {"model.embed_tokens.weight": embed, "model.norm.weight": torch.ones(HIDDEN), "lm_head.weight": head,
               **{f"model.layers.0.{k}": v for k, v in layer.items()}}
    save_file(weights, str(root / "model.safetensors"))
    (root / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab, "hidden_size": HIDDEN,
        "intermediate_size": WIDTH, "num_hidden_layers": 1, "num_attention_heads": heads, "num_key_value_heads": 1,
        "head_dim": head_dim, "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
        "torch_dtype": "float32"}))
    return root
