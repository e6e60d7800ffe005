"""A build's rejects: refused when they are not the build's own (the manifest records their
sha256), and the same bytes, rejects and manifest, from a moved copy of the inputs or the same
inputs named by another path (issue 54, item 9)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from treeprep.build import BuildConfig, build
from treeprep.errors import ShardError
from treeprep.rejects import summarize_rejects

SAMPLE = Path(__file__).resolve().parents[2] / "sample_data"
PART = "storage/part/msg_a4f10c001ffeQ1/prt_a1b2c3d4e002Zq8Lr2Tn5Vb0aZ.json"


def _opencode_with_bad_part(root: Path, part: str = "[1]") -> Path:
    """sample_data/opencode copied under ``root``, one part file not an object: a reject of its
    call whose reason names the part file, a file the session is read with."""
    folder = root / "logs" / "opencode"
    shutil.copytree(SAMPLE / "opencode", folder)
    (folder / PART).write_text(part)
    return root / "logs"


def _built(out: Path) -> tuple[bytes, bytes]:
    return (out / "rejects.jsonl").read_bytes(), (out / "manifest.json").read_bytes()


def test_moved_inputs_reject_with_the_same_bytes(tmp_path: Path) -> None:
    outs = []
    for where in ("first", "elsewhere/second"):
        inputs = _opencode_with_bad_part(tmp_path / where)
        out = tmp_path / f"out-{len(outs)}"
        build(BuildConfig(inputs=[str(inputs)], out=str(out)))
        outs.append(_built(out))
    rejects, manifest = outs[0]
    assert b"storage/part/msg_a4f10c001ffeQ1/prt_a1b2c3d4e002" in rejects  # names the part file
    assert str(tmp_path).encode() not in rejects + manifest
    assert outs[0] == outs[1]


def test_a_relative_input_path_rejects_with_the_same_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: built as ``logs`` from the folder above, the part file's reason read
    ``/abs/cwd/opencode/storage/part/...`` (the adapter names it by its absolute path, and only
    the root as given, ``logs/``, was cut from it)."""
    inputs = _opencode_with_bad_part(tmp_path / "a")
    build(BuildConfig(inputs=[str(inputs)], out=str(tmp_path / "absolute")))
    monkeypatch.chdir(tmp_path / "a")
    build(BuildConfig(inputs=["logs"], out=str(tmp_path / "relative")))
    monkeypatch.chdir(inputs)
    build(BuildConfig(inputs=[os.curdir], out=str(tmp_path / "here")))
    want = _built(tmp_path / "absolute")
    assert str(tmp_path).encode() not in want[0]
    assert _built(tmp_path / "relative") == want
    assert _built(tmp_path / "here") == want


def test_the_manifest_records_the_rejects_sha256(tmp_path: Path) -> None:
    inputs = _opencode_with_bad_part(tmp_path)
    build(BuildConfig(inputs=[str(inputs)], out=str(tmp_path / "a")))
    rejects, manifest = _built(tmp_path / "a")
    assert json.loads(manifest)["rejects_sha256"] == hashlib.sha256(rejects).hexdigest()
    build(BuildConfig(inputs=[str(SAMPLE / "claude-code")], out=str(tmp_path / "none")))
    rejects, manifest = _built(tmp_path / "none")
    # nothing rejected: no digest written (the count, 0, is the check), so the bytes are those
    # of a manifest written before the digest existed
    assert rejects == b"" and "rejects_sha256" not in json.loads(manifest)
    assert summarize_rejects(str(tmp_path / "none")).records_rejected == 0


def test_rejects_of_another_build_are_refused(tmp_path: Path) -> None:
    inputs = _opencode_with_bad_part(tmp_path)
    build(BuildConfig(inputs=[str(inputs)], out=str(tmp_path / "a")))
    build(BuildConfig(inputs=[str(SAMPLE / "pi")], out=str(tmp_path / "b")))
    s = summarize_rejects(str(tmp_path / "a"))
    assert s.records_rejected == sum(t.count for t in s.by_reason.values()) > 0
    shutil.copy(tmp_path / "b" / "rejects.jsonl", tmp_path / "a" / "rejects.jsonl")
    with pytest.raises(ShardError, match="not this build's rejects file"):
        summarize_rejects(str(tmp_path / "a"))


def test_rejects_of_another_build_with_as_many_rejects_are_refused(tmp_path: Path) -> None:
    """The count alone passed these: another build's rejects of the same number, and an edit."""
    for name, part in (("a", "[1]"), ("b", "5")):
        inputs = _opencode_with_bad_part(tmp_path / f"in-{name}", part)
        build(BuildConfig(inputs=[str(inputs)], out=str(tmp_path / name)))
    a, b = tmp_path / "a", tmp_path / "b"
    n = summarize_rejects(str(a)).records_rejected
    assert summarize_rejects(str(b)).records_rejected == n > 0
    assert (a / "rejects.jsonl").read_bytes() != (b / "rejects.jsonl").read_bytes()
    own = (a / "rejects.jsonl").read_bytes()
    shutil.copy(b / "rejects.jsonl", a / "rejects.jsonl")
    with pytest.raises(ShardError, match="is not this build's rejects file: its sha256") as e:
        summarize_rejects(str(a))
    assert str(a / "rejects.jsonl") in str(e.value) and "\n" not in str(e.value)
    (a / "rejects.jsonl").write_bytes(own.replace(b"got array", b"got a list"))
    with pytest.raises(ShardError, match="is not this build's rejects file: its sha256"):
        summarize_rejects(str(a))
    (a / "rejects.jsonl").write_bytes(b"not json\n" + own)  # named as another file, not bad JSON
    with pytest.raises(ShardError, match="is not this build's rejects file: its sha256"):
        summarize_rejects(str(a))
    (a / "rejects.jsonl").write_bytes(own)
    assert summarize_rejects(str(a)).records_rejected == n


def test_a_manifest_without_the_digest_is_checked_by_the_count(tmp_path: Path) -> None:
    """A manifest written before ``rejects_sha256`` existed loads; its rejects are checked by
    their number."""
    from treeprep.schemas.manifest import load_manifest

    inputs = _opencode_with_bad_part(tmp_path)
    a = tmp_path / "a"
    build(BuildConfig(inputs=[str(inputs)], out=str(a)))
    doc = json.loads((a / "manifest.json").read_text())
    del doc["rejects_sha256"]
    (a / "manifest.json").write_text(json.dumps(doc, indent=2))
    assert load_manifest(str(a)).rejects_sha256 is None
    own = (a / "rejects.jsonl").read_bytes()
    (a / "rejects.jsonl").write_bytes(own.replace(b"got array", b"got a list"))
    assert summarize_rejects(str(a)).records_rejected > 0  # an edit of the same count: unseen
    (a / "rejects.jsonl").write_bytes(own + own)
    with pytest.raises(ShardError, match="not this build's rejects file"):
        summarize_rejects(str(a))
