"""Ollama's `options` -> SamplingParams, and the request's own context window (`num_ctx`).

    option              here                                   absent
    temperature         temperature (0 or below: greedy)       0.8 (Ollama's default)
    top_k               top_k (0 or below: off)                40
    top_p, min_p        top_p (0 or below, 1 or above: off),   0.9, 0.0
                        min_p
    seed                seed (negative: random)                random
    stop                stop strings                           none
    num_predict         max_tokens; 0 or below: until the      -1
                        context ends (no context shift here)
    num_ctx             the request's context: prompt + output the server's (--max-model-len); more is
                        fit in it (a longer prompt is a 400)   clamped to it (logged once), as Ollama
                                                               clamps to the model's
    repeat_penalty      repetition_penalty over the prompt     1.0 (off: Ollama's new engine applies
                        and the output                         none either)
    repeat_last_n       the penalties' window (llama.cpp's     64 (Ollama's)
                        penalty_last_n): the last N tokens;
                        -1: the whole context; 0: all three off
    presence_penalty,   OpenAI's rule: over the generated      0.0
    frequency_penalty   tokens

Options that place the model (num_thread, num_gpu, use_mmap, ...) were decided when the server started:
they are accepted, and the first request that sets one logs that it is fixed at start. Options whose
sampler this server does not have (typical_p, tfs_z, mirostat) are accepted at their neutral values and a
400 otherwise; mirostat_tau and mirostat_eta only tune mirostat, which is then off. num_keep says which
tokens survive a context shift, which never happens here (logged once too). penalize_newline true is what
repeat_penalty does here; false is a 400.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from tokenmill.entrypoints.ollama.protocol import Options
from tokenmill.entrypoints.server.errors import bad_request
from tokenmill.sampling_defaults import SamplingDefaults
from tokenmill.sampling_params import ParamError, SamplingParams, StructuredOutputsParams

log = logging.getLogger("tokenmill.server")

# Ollama's defaults for the sampling options a request leaves out
DEFAULT_TEMPERATURE = 0.8
DEFAULT_TOP_K = 40
DEFAULT_REPEAT_LAST_N = 64  # Ollama's: the penalties look back over the last 64 tokens
DEFAULT_TOP_P = 0.9

PLACEMENT_OPTIONS = ("numa", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv", "logits_all", "vocab_only",
                     "use_mmap", "use_mlock", "embedding_only", "num_thread", "rope_frequency_base",
                     "rope_frequency_scale")
# option -> the value that turns its sampler off (any other value is a 400)
_NEUTRAL = {"typical_p": 1.0, "tfs_z": 1.0, "mirostat": 0, "penalize_newline": True}


@dataclass(frozen=True)
class RequestOptions:
    """What a request's options ask for."""

    params: SamplingParams  # max_tokens None: resolved against `num_ctx` once the prompt is known
    num_ctx: int  # prompt + output must fit in this many tokens
    num_predict: int | None  # generated tokens at most; None: until the context ends


class OptionsMapper:
    """Maps one server's requests' options; remembers which fixed-at-start options it has logged."""

    def __init__(self, max_model_len: int, vocab_size: int, defaults: SamplingDefaults | None = None) -> None:
        """`defaults`: the model's own sampling defaults (sampling_defaults.py), which replace Ollama's where
        the model gives one, as a Modelfile's PARAMETER lines do."""
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.defaults = defaults or SamplingDefaults()
        self._logged: set[str] = set()

    def default_parameters(self) -> dict[str, float | int]:
        """The sampling defaults a request without options gets: Ollama's, or the model's where it has one."""
        d = self.defaults
        out: dict[str, float | int] = {"temperature": d.pick("temperature", None, DEFAULT_TEMPERATURE),
                                       "top_k": d.pick("top_k", None, DEFAULT_TOP_K),
                                       "top_p": d.pick("top_p", None, DEFAULT_TOP_P)}
        if d.min_p is not None:
            out["min_p"] = d.min_p
        if d.repetition_penalty is not None:
            out["repeat_penalty"] = d.repetition_penalty
        return out

    def map(self, options: Options | None, *, logprobs: int | None = None,
            structured_outputs: StructuredOutputsParams | None = None) -> RequestOptions:
        """SamplingParams (with the request's logprobs and `format` constraint) and the context for
        `options`; a value this server cannot honour is a 400."""
        o = options or Options()
        self._note_fixed(o)
        for name, neutral in _NEUTRAL.items():
            value = getattr(o, name)
            if value is not None and value != neutral:
                raise bad_request(f"option {name} {value} is not supported by this server (only {neutral}: off)",
                                  f"options.{name}")
        num_ctx = self._num_ctx(o.num_ctx)
        num_predict = self._num_predict(o.num_predict)
        d = self.defaults
        model_default = o.repeat_penalty is None and d.repetition_penalty is not None and o.repeat_last_n is None
        if model_default:  # the model's recommendation (generation_config: HF's, over the whole context)
            o = o.model_copy(update={"repeat_penalty": d.repetition_penalty, "repeat_last_n": -1})
        repetition, presence, frequency, window = self._penalties(o)
        top_k = d.pick("top_k", None, DEFAULT_TOP_K) if o.top_k is None else max(o.top_k, 0)
        top_p = d.pick("top_p", o.top_p, DEFAULT_TOP_P)
        try:
            params = SamplingParams(
                # Ollama's sampler: greedy at 0 and below; top_p only inside (0, 1)
                temperature=max(d.pick("temperature", o.temperature, DEFAULT_TEMPERATURE), 0.0),
                top_k=min(top_k, self.vocab_size),
                top_p=top_p if 0.0 < top_p < 1.0 else 1.0,
                min_p=d.pick("min_p", o.min_p, 0.0),
                seed=o.seed if o.seed is not None and o.seed >= 0 else None,
                stop=list(o.stop) if o.stop else None,
                repetition_penalty=repetition, presence_penalty=presence, frequency_penalty=frequency,
                penalty_window=window,
                max_tokens=None, logprobs=logprobs, structured_outputs=structured_outputs)
        except ParamError as e:
            raise bad_request(f"option {e.message}", f"options.{e.field}" if e.field else None) from None
        return RequestOptions(params, num_ctx, num_predict)

    def _num_ctx(self, num_ctx: int | None) -> int:
        if num_ctx is None:
            return self.max_model_len
        if num_ctx < 1:
            raise bad_request(f"option num_ctx must be at least 1, got {num_ctx}", "options.num_ctx")
        if num_ctx > self.max_model_len:  # clients (Open WebUI) send large ones; Ollama clamps to the model's
            if "num_ctx" not in self._logged:
                self._logged.add("num_ctx")
                log.info("ollama option num_ctx %d is larger than this server's context of %d tokens (tokenmill serve "
                         "--max-model-len): requests get %d; logged once", num_ctx, self.max_model_len,
                         self.max_model_len)
            return self.max_model_len
        return num_ctx

    @staticmethod
    def _num_predict(num_predict: int | None) -> int | None:
        """None (until the context ends) for -1, -2 and 0: Ollama's runners stop on num_predict only when it is
        positive."""
        return None if num_predict is None or num_predict <= 0 else num_predict

    @staticmethod
    def _penalties(o: Options) -> tuple[float, float, float, int | None]:
        """(repetition, presence, frequency, window) penalties: the last repeat_last_n tokens (Ollama's default
        64), -1 the whole context (window None); 0 turns all three off, as in llama.cpp."""
        repetition = 1.0 if o.repeat_penalty is None else o.repeat_penalty
        presence, frequency = o.presence_penalty or 0.0, o.frequency_penalty or 0.0
        window = DEFAULT_REPEAT_LAST_N if o.repeat_last_n is None else o.repeat_last_n
        if window == 0:
            return 1.0, 0.0, 0.0, None
        if window < -1:
            raise bad_request(f"option repeat_last_n must be -1 (the whole context), 0 (off) or positive, got {window}",
                              "options.repeat_last_n")
        return repetition, presence, frequency, None if window == -1 else window

    def _note_fixed(self, o: Options) -> None:
        """Log, once per option, that a placement option (or num_keep) is not this request's to change."""
        for name in (*PLACEMENT_OPTIONS, "num_keep"):
            if getattr(o, name) is None or name in self._logged:
                continue
            self._logged.add(name)
            if name == "num_keep":
                log.info("ollama option num_keep has no effect here: the context never shifts (a prompt that does "
                         "not fit is a 400), so no tokens need keeping; logged once")
            else:
                log.info("ollama option %s is fixed when the server starts (tokenmill serve's flags); requests "
                         "cannot change it and their value is not applied; logged once", name)
