"""OpenCode parts and fields we cannot read are rejects, never dropped (issue 54 items 3, 9): a
part of an unknown ``type`` once vanished with the user's request from every prompt, and fields
of the wrong JSON type were read as absent."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from treeprep.formats import ReadOptions
from treeprep.formats.opencode import FORMAT, PART_TYPES
from treeprep.schemas import ChatCall, Reject

SAMPLES = Path(__file__).resolve().parents[3] / "sample_data" / "opencode"
EXPORT = SAMPLES / "export-ses_5b2e9d8c7ffeRt6Uy1Io0Pa3sD.json"
STORAGE = SAMPLES / "storage"
SESSION = "session/4b0ea68d7af9a6031a7ffda7ad66e0cb83315750/ses_5b2f1c3d4ffeQm8Lr2Tn5Vb0aZ.json"
USER_PART = "part/msg_a4f10c001ffeQ1/prt_a1b2c3d4e001Zq8Lr2Tn5Vb0aZ.json"
KNOWN = ", ".join(PART_TYPES)


def _items(path: Path) -> list[Any]:
    return list(FORMAT.read(str(path), ReadOptions()))


def _export(tmp_path: Path, edit) -> Path:  # type: ignore[no-untyped-def]
    doc = json.loads(EXPORT.read_text())
    edit(doc)
    path = tmp_path / EXPORT.name
    path.write_text(json.dumps(doc))
    return path


def _storage(tmp_path: Path, rel: str, **changes: object) -> Path:
    root = tmp_path / "storage"
    shutil.copytree(STORAGE, root)
    doc = json.loads((root / rel).read_text())
    doc.update(changes)
    (root / rel).write_text(json.dumps(doc))
    return root / SESSION


def test_the_samples_read_with_no_reject() -> None:
    for path in (EXPORT, STORAGE / SESSION):
        assert not any(isinstance(i, Reject) for i in _items(path))


@pytest.mark.parametrize(("kind", "got"), [(5, "int"), ("txt", "'txt'")])
def test_an_unknown_part_type_rejects_every_call_after_it(
    tmp_path: Path, kind: object, got: str
) -> None:
    path = _export(tmp_path, lambda d: d["messages"][0]["parts"][0].update(type=kind))
    items = _items(path)
    assert not any(isinstance(i, ChatCall) for i in items)  # every prompt holds the request
    why = f"messages[0].parts[0].type: expected one of {KNOWN}; got {got}"
    assert items[0].reason == why and items[0].call_id is None
    assert {i.reason for i in items[1:]} == {f"{why} (the prompts after it would miss it)"}


def test_an_unknown_part_type_in_storage_names_the_part_file(tmp_path: Path) -> None:
    items = _items(_storage(tmp_path, USER_PART, type="txt"))
    assert not any(isinstance(i, ChatCall) for i in items)
    part = tmp_path / "storage" / USER_PART
    assert items[0].reason == f"{part}:1: part.type: expected one of {KNOWN}; got 'txt'"


@pytest.mark.parametrize(
    ("rel", "field", "value", "why"),
    [
        (USER_PART, "ignored", "yes", "part.ignored: expected a boolean, got string"),
        (USER_PART, "synthetic", 1, "part.synthetic: expected a boolean, got int"),
        (
            "message/ses_5b2f1c3d4ffeQm8Lr2Tn5Vb0aZ/msg_a4f10c002ffeQ2.json",
            "finish",
            1,
            "message/ses_5b2f1c3d4ffeQm8Lr2Tn5Vb0aZ/msg_a4f10c002ffeQ2.json.info.finish: "
            "expected a string, got int",
        ),
    ],
)
def test_a_storage_field_of_the_wrong_type_is_a_reject(
    tmp_path: Path, rel: str, field: str, value: object, why: str
) -> None:
    items = _items(_storage(tmp_path, rel, **{field: value}))
    assert not any(isinstance(i, ChatCall) for i in items)
    assert items[0].reason.endswith(why), items[0].reason


def test_a_session_parent_of_the_wrong_type_is_refused(tmp_path: Path) -> None:
    from treeprep.errors import InputError

    with pytest.raises(InputError) as info:
        _items(_storage(tmp_path, SESSION, parentID=5))
    assert info.value.reason == "session parentID: expected a string, got int"


def test_a_compacted_time_of_the_wrong_type_is_a_reject(tmp_path: Path) -> None:
    def edit(d: dict[str, Any]) -> None:
        tool = next(p for p in d["messages"][1]["parts"] if p["type"] == "tool")
        tool["state"]["time"] = {"start": 1, "compacted": "yes"}

    rejects = [i for i in _items(_export(tmp_path, edit)) if isinstance(i, Reject)]
    assert rejects[0].reason.endswith(
        ".state.time.compacted: expected an integer or float, got string"
    )


def _set_part(doc: dict[str, Any], part: dict[str, Any]) -> None:
    """The summary step's text part (``messages[3].parts[1]``) replaced by ``part``."""
    doc["messages"][3]["parts"][1] = {"id": "prt_x", **part}


@pytest.mark.parametrize(
    ("part", "reason"),
    [
        ({"type": "reasoning", "text": 5}, "messages[3].parts[1].text: expected a string, got int"),
        ({"type": "text"}, "messages[3].parts[1].text: expected a string, got null"),
    ],
)
def test_a_reply_part_without_its_text_is_a_reject(
    tmp_path: Path, part: dict[str, Any], reason: str
) -> None:
    """A reasoning part's text is in ``text`` too, and must be a string."""
    rejects = [i for i in _items(_export(tmp_path, lambda d: _set_part(d, part)))
               if isinstance(i, Reject)]  # fmt: skip
    assert rejects[0].reason == reason


def test_a_step_reads_its_reasoning_from_text_and_skips_its_bounds(tmp_path: Path) -> None:
    path = _export(tmp_path, lambda d: _set_part(d, {"type": "reasoning", "text": "Summing up."}))
    summary = [i for i in _items(path) if isinstance(i, ChatCall)][3]
    assert summary.call_id.endswith("#0") and summary.completion.content == ""
    assert summary.completion.reasoning_content == "Summing up."
