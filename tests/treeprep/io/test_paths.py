"""Inputs and outputs as local paths or file:// URLs; other filesystems refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from treeprep.build import BuildConfig, build
from treeprep.errors import TreeprepError
from treeprep.io.paths import local_path, local_paths


def test_file_urls_become_local_paths_and_paths_stay_as_given(tmp_path: Path) -> None:
    assert local_path(tmp_path.as_uri()) == str(tmp_path)
    assert local_path((tmp_path / "a b.jsonl").as_uri()) == str(tmp_path / "a b.jsonl")
    assert local_paths(["sample_data", "./x/../y.jsonl"]) == ["sample_data", "./x/../y.jsonl"]


@pytest.mark.parametrize("url", ["s3://bucket/logs", "gs://bucket/logs", "HDFS://node/logs"])
def test_other_filesystems_are_refused_naming_the_url(url: str) -> None:
    with pytest.raises(TreeprepError, match=f"{url}: only local paths and file:// URLs"):
        local_path(url)


def test_a_build_refuses_a_remote_input_before_reading_anything(tmp_path: Path) -> None:
    with pytest.raises(TreeprepError, match="s3://bucket/logs: only local paths and file:// URLs"):
        build(BuildConfig(inputs=["s3://bucket/logs"], out=str(tmp_path / "o")))
    assert not (tmp_path / "o").exists()
