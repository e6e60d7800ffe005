"""treeprep.build.config: the build config checks its fields and hands workers their options."""

from __future__ import annotations

import pickle

import pytest

from treeprep.build.config import BuildConfig, FileOptions
from treeprep.errors import TreeprepError


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("workers", 0, "workers must be >= 1, got 0"),
        ("max_errors", -1, "max_errors must be >= 0, got -1"),
        ("shard_tokens", 0, "shard_tokens must be >= 1, got 0"),
        ("max_record_bytes", 0, "max_record_bytes must be >= 1, got 0"),
        ("engine", "spark", "engine 'spark'; expected one of local, ray"),
        ("workers", None, "workers must be an integer, got None"),
        ("shard_tokens", 2.5, "shard_tokens must be an integer, got 2.5"),
    ],
)
def test_build_config_names_the_bad_field(field: str, value: object, message: str) -> None:
    with pytest.raises(TreeprepError) as e:
        BuildConfig(inputs=["x"], out="o", **{field: value})  # type: ignore[arg-type]
    assert str(e.value) == message


def test_build_config_accepts_no_error_limit_and_the_limits_themselves() -> None:
    cfg = BuildConfig(inputs=["x"], out="o", max_errors=None, workers=1, shard_tokens=1)
    assert cfg.max_errors is None
    assert BuildConfig(inputs=["x"], out="o", max_errors=0).max_errors == 0


def test_file_options_are_the_configs_render_options_and_pickle() -> None:
    cfg = BuildConfig(
        inputs=["x"],
        out="o",
        format="openai",
        group_by="session",
        system_prompt="sys.txt",
        tools="tools.json",
        native_templates=False,
        chat_template="t.jinja",
        date="2026-01-02",
        max_record_bytes=123,
        workers=4,
    )
    opts = cfg.file_options()
    assert opts == FileOptions(
        format="openai",
        group_by="session",
        system_prompt="sys.txt",
        tools="tools.json",
        native_templates=False,
        max_record_bytes=123,
        chat_template="t.jinja",
        date="2026-01-02",
    )
    assert pickle.loads(pickle.dumps(opts)) == opts  # handed to pool processes and Ray actors
