"""The step contract and the worker seams: what crosses from the engine to the workers is plain,
picklable data with no live Request; the workers' per-request state is dropped through the contract;
engines in one process do not share random state; linear methods report the bytes they hold."""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pytest
import torch

from tokenmill import LLM, SamplingParams
from tokenmill.engine.request import Request
from tokenmill.executor.executor import Executor
from tokenmill.sampling_params import StructuredOutputsParams
from tokenmill.scheduler_output import ModelRunnerOutput, SchedulerOutput

PLAIN = (str, int, float, bool, type(None))


def assert_plain(obj: object, where: str = "") -> None:
    """Only builtins and dataclasses of builtins, all the way down (and numpy arrays of numbers: the
    grammar bitmask)."""
    assert not isinstance(obj, (Request, torch.Tensor)), f"{where}: {type(obj).__name__} crosses the contract"
    if isinstance(obj, PLAIN) or (isinstance(obj, np.ndarray) and obj.dtype.kind in "iuf"):
        return
    if isinstance(obj, (list, tuple, set, frozenset)):
        for i, x in enumerate(obj):
            assert_plain(x, f"{where}[{i}]")
    elif isinstance(obj, dict):
        for k, v in obj.items():
            assert_plain(k, f"{where}.key")
            assert_plain(v, f"{where}[{k!r}]")
    elif dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            assert_plain(getattr(obj, f.name), f"{where}.{f.name}")
    else:
        raise AssertionError(f"{where}: {type(obj).__name__} is not plain data")


class PicklingExecutor(Executor):
    """Sends every step through pickle, as a multi-process executor would, and checks what it carries."""

    def __init__(self, inner: Executor) -> None:
        self.inner = inner
        self.num_steps = 0
        self.num_finished_sent = 0

    def num_kv_blocks(self) -> int:
        return self.inner.num_kv_blocks()

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        assert_plain(scheduler_output, "SchedulerOutput")
        self.num_steps += 1
        self.num_finished_sent += len(scheduler_output.finished_req_ids)
        out = self.inner.execute_model(pickle.loads(pickle.dumps(scheduler_output)))
        assert_plain(out, "ModelRunnerOutput")
        return pickle.loads(pickle.dumps(out))


PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time", "1, 2, 3, 4, 5,", "Name a colour:"]


def test_contract_is_picklable_plain_data_and_changes_nothing(llm: LLM) -> None:
    eng = llm.engine
    params = [SamplingParams(temperature=0, max_tokens=12), SamplingParams(temperature=0.8, seed=3, max_tokens=10, n=2),
              SamplingParams(temperature=0, max_tokens=8, stop=["\n"], logprobs=2),
              SamplingParams(temperature=0.7, seed=11, max_tokens=9, presence_penalty=0.5, logit_bias={13: 2.0},
                             min_tokens=4),
              SamplingParams(temperature=0.9, seed=5, max_tokens=30, n=2, structured_outputs=StructuredOutputsParams(
                  json={"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}},
                        "required": ["colour"]}))]
    direct = llm.generate(PROMPTS, params)
    real = eng.executor
    proxy = PicklingExecutor(real)
    eng.executor = proxy
    try:
        via_pickle = llm.generate(PROMPTS, params)
    finally:
        eng.executor = real
    assert proxy.num_steps > 0
    for a, b in zip(direct, via_pickle):
        assert [o.token_ids for o in a.outputs] == [o.token_ids for o in b.outputs]
        assert [o.text for o in a.outputs] == [o.text for o in b.outputs]
    # every sequence that ran was told finished to the workers, and they kept nothing of it
    assert proxy.num_finished_sent == sum(len(o.outputs) for o in via_pickle)
    assert real.worker.runner.requests == {}  # type: ignore[attr-defined]


def test_aborted_requests_leave_no_worker_state(llm: LLM) -> None:
    eng = llm.engine
    eng.add_request("to-abort", "Tell me a long story", SamplingParams(max_tokens=50, ignore_eos=True))
    eng.step()
    eng.step()
    assert "to-abort" in eng.executor.worker.runner.requests  # type: ignore[attr-defined]
    eng.abort_request("to-abort")
    assert eng.executor.worker.runner.requests == {}  # type: ignore[attr-defined]
    assert eng.block_manager.usage == 0


def test_engines_in_one_process_do_not_reseed_each_other(llm: LLM) -> None:
    """Unseeded sampling draws from the engine's own generator (EngineConfig.seed), so building or
    using another engine changes nothing, and torch's global generator is left alone."""
    p = SamplingParams(temperature=1.0, max_tokens=12)
    fresh = lambda: LLM(progress=False, kv_cache_memory=32 * 2**20, max_model_len=256, dtype="float32", seed=5)
    a = fresh()
    state = torch.random.get_rng_state()
    first = a.generate(PROMPTS[:2], p)
    assert torch.equal(torch.random.get_rng_state(), state), "sampling touched torch's global generator"
    b = fresh()  # a second engine with the same seed: the same draws, whatever the first did
    llm.generate(PROMPTS[:1], p)  # and a third engine sampling in between
    second = b.generate(PROMPTS[:2], p)
    assert [o.outputs[0].token_ids for o in first] == [o.outputs[0].token_ids for o in second]


@pytest.mark.parametrize("method", ["unquantized", "int8"])
def test_linear_methods_hold_the_bytes_they_report(method: str) -> None:
    from tokenmill.layers.linear import Linear, get_linear_method

    m = get_linear_method(method)
    layer = Linear(64, 96, m, shards={"a": 32, "b": 64})
    for shard, rows in (("a", 32), ("b", 64)):
        layer.weight.weight_loader(layer.weight, torch.randn(rows, 64), shard)  # type: ignore[attr-defined]
    layer.finish_loading()
    held = sum(t.numel() * t.element_size() for t in (layer.weight, layer.scales) if t is not None)
    assert held == m.weight_bytes(96, 64, 4)
    assert layer(torch.randn(3, 64)).shape == (3, 96)


def test_gguf_reader_hands_quantized_blocks_through(default_model_path: str) -> None:
    """With keep_quantized, the reader yields the file's own blocks (rows permuted like the dequantised
    tensor), which dequantise to exactly what it yields otherwise."""
    from gguf.quants import dequantize
    import numpy as np

    from tokenmill.loader.gguf import GGUFFile
    from tokenmill.loader.model_config import ModelConfig
    from tokenmill.loader.weights import GGUFQuantized, gguf_weights

    gf = GGUFFile(default_model_path)
    cfg = ModelConfig.from_gguf(gf.metadata, set(gf.tensors), gf.quantization())
    want = {"model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.down_proj.weight"}
    raw = dict(gguf_weights(gf, cfg, False, keep_quantized=lambda name, t: name in want))
    plain = dict(gguf_weights(gf, cfg, False))
    for name in want:
        q = raw[name]
        assert isinstance(q, GGUFQuantized) and q.data.dtype == np.uint8
        assert q.ggml_type.name != "F32"
        deq = torch.from_numpy(dequantize(q.data, q.ggml_type)).reshape(q.shape)
        assert torch.equal(deq, plain[name])
    assert all(isinstance(t, torch.Tensor) for n, t in raw.items() if n not in want)
