"""The command line's own errors: one line under the right command's usage, exit 2."""

from __future__ import annotations

import pytest

from tokenmill import cli


def test_an_unknown_flag_is_named_with_its_commands_usage(capsys) -> None:
    """`tokenmill serve --bogus` says so under serve's usage (argparse reports a subcommand's unknown flag
    with the top level's, which lists no serve flag at all), before anything loads."""
    for argv, prog in ((["serve", "--bogus-flag"], "tokenmill serve"),
                       (["bench", "serve", "--bogus-flag"], "tokenmill bench serve"),
                       (["--bogus-flag"], "tokenmill")):
        with pytest.raises(SystemExit) as e:
            cli.main(argv)
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert f"{prog}: error: unrecognized arguments: --bogus-flag" in err, err
        assert err.startswith(f"usage: {prog} ")


# -- vLLM's flags (entrypoints/vllm_flags.py) ------------------------------------------------------------
@pytest.mark.parametrize("flags, says", [
    (["-tp", "2"], "--tensor-parallel-size 2: tokenmill runs a model on one device per process"),
    (["--pipeline-parallel-size", "4"], "--pipeline-parallel-size 4"),
    (["--kv-cache-dtype", "fp8"], "--kv-cache-dtype fp8: only auto"),
    (["--no-enable-chunked-prefill"], "set --max-num-batched-tokens to --max-model-len"),
    (["--enable-prefix-caching", "--no-prefix-caching"], "contradict"),
    (["--gpu-memory-utilization", "0"], "--gpu-memory-utilization must be in (0, 1]"),
    (["--swap-space", "-1"], "--swap-space must not be negative"),
])
def test_vllm_flags_that_ask_for_what_is_not_done_stop_serve_at_once(flags, says, capsys) -> None:
    assert cli.main(["serve", *flags]) == 2  # before listening or loading anything
    assert says in capsys.readouterr().err


def test_vllm_flags_that_mean_something_here_are_applied(caplog) -> None:
    import logging

    from tokenmill.entrypoints.server.config import ServerConfig
    from tokenmill.entrypoints.vllm_flags import apply_vllm_args

    args = cli.build_parser().parse_args(
        ["serve", "--model", "a.gguf", "--no-enable-prefix-caching", "--disable-log-requests", "-tp", "1",
         "--enable-chunked-prefill", "--kv-cache-dtype", "auto", "--trust-remote-code", "--enforce-eager",
         "--enable-auto-tool-choice", "--disable-log-stats", "--swap-space", "4", "--gpu-memory-utilization", "0.8",
         "--enable-server-load-tracking"])
    with caplog.at_level(logging.INFO, logger="tokenmill"):
        apply_vllm_args(args)
    assert args.model == ["a.gguf"]
    cfg = cli.engine_config_from_args(args, "a.gguf")
    assert cfg.enable_prefix_caching is False and cfg.gpu_memory_utilization == 0.8
    assert ServerConfig.from_args(args).log_requests is False
    said = caplog.text
    for flag in ("--trust-remote-code", "--enforce-eager", "--enable-auto-tool-choice", "--disable-log-stats",
                 "--swap-space", "--enable-server-load-tracking"):
        assert flag in said, flag
    # the default: prefix caching on, request lines logged; --enable-prefix-caching keeps it on
    args = cli.build_parser().parse_args(["serve", "a.gguf", "--enable-prefix-caching", "--model", "a.gguf"])
    apply_vllm_args(args)
    assert args.model == ["a.gguf"] and cli.engine_config_from_args(args, "a.gguf").enable_prefix_caching
    assert ServerConfig.from_args(args).log_requests is True


def test_gpu_memory_utilization_arithmetic_and_its_refusal_on_cpu() -> None:
    from tokenmill import LLM
    from tokenmill.memory_plan import CUDA_ACTIVATION_BYTES, kv_bytes_for_gpu_share

    G = 2**30
    # 80 GiB card, 1 GiB held by others, 16 GiB of weights: 0.9 * 80 - 1 - 16 - activations
    assert kv_bytes_for_gpu_share(0.9, 80 * G, 79 * G, 16 * G) == int(0.9 * 80 * G) - 17 * G - CUDA_ACTIVATION_BYTES
    with pytest.raises(ValueError, match="leaves nothing for the KV cache"):
        kv_bytes_for_gpu_share(0.2, 80 * G, 79 * G, 16 * G)
    with pytest.raises(ValueError, match="on CPU the KV cache is --kv-cache-memory"):
        LLM(device="cpu", gpu_memory_utilization=0.9, progress=False)


def test_vllm_gpt_oss_parser_names_are_taken() -> None:
    """vLLM's `--reasoning-parser openai_gptoss` and `--tool-call-parser openai` (gpt-oss's harmony format,
    which a harmony chat template turns on by itself) reach the server's config."""
    from tokenmill.entrypoints.server.config import ServerConfig

    args = cli.build_parser().parse_args(["serve", "a.gguf", "--reasoning-parser", "openai_gptoss",
                                          "--tool-call-parser", "openai"])
    config = ServerConfig.from_args(args)
    assert (config.reasoning_parser, config.tool_call_parser) == ("openai_gptoss", "openai")
