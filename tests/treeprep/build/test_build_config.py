"""treeprep.build.config: the build config checks its fields and hands workers their options."""

from __future__ import annotations

import pickle

import pytest

from treeprep.build.config import BuildConfig, FileOptions
from treeprep.errors import TreeprepError
from treeprep.modes import Redact


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("workers", 0, "workers must be >= 1, got 0"),
        ("max_errors", -1, "max_errors must be >= 0, got -1"),
        ("shard_tokens", 0, "shard_tokens must be >= 1, got 0"),
        ("engine", "spark", "engine 'spark'; expected one of local, ray"),
        ("workers", None, "workers must be an integer, got None"),
        ("shard_tokens", 2.5, "shard_tokens must be an integer, got 2.5"),
        ("file", {"format": "openai"}, "file must be a FileOptions, got {'format': 'openai'}"),
    ],
)
def test_build_config_names_the_bad_field(field: str, value: object, message: str) -> None:
    with pytest.raises(TreeprepError) as e:
        BuildConfig(inputs=["x"], out="o", **{field: value})  # type: ignore[arg-type]
    assert str(e.value) == message


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("max_record_bytes", 0, "max_record_bytes must be >= 1, got 0"),
        ("max_record_bytes", 1.5, "max_record_bytes must be an integer, got 1.5"),
        ("redact", "all", "redact 'all'; expected one of off, secrets"),
        ("since", "last tuesday", "since 'last tuesday': expected an ISO 8601 date or time"),
        (
            "default_chat_template_kwargs",
            "[1]",
            "--default-chat-template-kwargs: expected a JSON object, got '[1]'",
        ),
        (
            "reasoning_effort_map",
            '{"high": 1}',
            "--reasoning-effort-map: expected an object of strings",
        ),
        (
            "reasoning_effort_map",
            '{"huge": "max"}',
            "--reasoning-effort-map: unknown efforts ['huge']; expected some of none, minimal, "
            "low, medium, high, xhigh, max (vLLM refuses others)",
        ),
    ],
)
def test_file_options_name_the_bad_field(field: str, value: object, message: str) -> None:
    with pytest.raises(TreeprepError) as e:
        FileOptions(**{field: value})  # type: ignore[arg-type]
    assert str(e.value) == message


def test_build_config_accepts_no_error_limit_and_the_limits_themselves() -> None:
    cfg = BuildConfig(inputs=["x"], out="o", max_errors=None, workers=1, shard_tokens=1)
    assert cfg.max_errors is None
    assert BuildConfig(inputs=["x"], out="o", max_errors=0).max_errors == 0


def test_the_worker_gets_the_configs_own_file_options_and_they_pickle() -> None:
    opts = FileOptions(
        format="openai",
        group_by="session",
        system_prompt="sys.txt",
        native_templates=False,
        max_record_bytes=123,
        map=["messages=turns"],  # type: ignore[arg-type]  (a list given: kept as a tuple)
        redact="secrets",  # type: ignore[arg-type]
    )
    cfg = BuildConfig(inputs=["x"], out="o", file=opts, workers=4)
    assert cfg.file is opts  # composition: the same value, no copy to keep in step
    assert opts.map == ("messages=turns",) and opts.redact is Redact.secrets
    assert opts.read_format() == "openai"  # a forced format wins over the map's
    assert pickle.loads(pickle.dumps(opts)) == opts  # handed to pool processes and Ray actors
    assert FileOptions(map=("messages=turns",)).read_format() == "trajectory-dataset"
    assert FileOptions().read_format() is None


def test_an_effort_map_is_vllm_s_and_bad_json_is_named() -> None:
    with pytest.raises(TreeprepError, match="--reasoning-effort-map is vLLM's option; --server "
                       "sglang has none"):  # fmt: skip
        FileOptions(reasoning_effort_map='{"xhigh": "max"}', server="sglang")  # type: ignore[arg-type]
    with pytest.raises(TreeprepError, match=r"--default-chat-template-kwargs: expected a JSON "
                       r"object, got '\{enable' \(Expecting"):  # fmt: skip
        FileOptions(default_chat_template_kwargs="{enable")
    with pytest.raises(TreeprepError, match="--anthropic-disabled-thinking-effort is vLLM's "
                       "option; --server llama.cpp has none"):  # fmt: skip
        FileOptions(anthropic_disabled_thinking_effort="low", server="llama.cpp")  # type: ignore[arg-type]
    kwargs = FileOptions(default_chat_template_kwargs='{"enable_thinking": false}')
    assert kwargs.server_settings() == ({"enable_thinking": False}, None, "auto")


def test_sglang_version_is_sglang_s_and_read_as_a_version() -> None:
    assert FileOptions(server="sglang", sglang_version="0.5.9").sglang() == (0, 5, 9)
    assert FileOptions().sglang() == (0, 5, 23)
    with pytest.raises(TreeprepError, match="--sglang-version is SGLang's; --server vllm"):
        FileOptions(sglang_version="0.5.9")
    with pytest.raises(TreeprepError, match="expected a version such as 0.5.23, got 'new'"):
        FileOptions(server="sglang", sglang_version="new")
