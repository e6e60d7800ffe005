"""The on-disk models' base: unknown keys refused, late fields left out while at their default."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from treeprep.schemas.base import FileModel


class _Grown(FileModel):
    name: str
    added_later: int = 0
    _omit_default = ("added_later",)


def test_a_late_field_at_its_default_is_left_out_and_older_files_load() -> None:
    assert _Grown(name="a").model_dump_json() == '{"name":"a"}'
    assert _Grown(name="a", added_later=3).model_dump_json() == '{"name":"a","added_later":3}'
    assert _Grown.model_validate_json('{"name":"a"}').added_later == 0


def test_an_unknown_key_is_an_error_not_ignored() -> None:
    with pytest.raises(ValidationError, match="nmae"):
        _Grown.model_validate_json('{"name":"a","nmae":"b"}')
