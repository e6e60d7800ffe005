"""treeprep.build.files: stage 1 for one file, down to its last line of defence against a buggy
adapter."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import treeprep.formats as formats_mod
from treeprep.build.config import FileOptions
from treeprep.build.files import FileWorker
from treeprep.build.workfiles import FileJob
from treeprep.formats import ReadOptions
from treeprep.formats.base import FormatSpec
from treeprep.schemas import Reject


def test_stage1_turns_an_adapter_bug_into_a_counted_reject(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def buggy(path: str, opts: ReadOptions) -> Iterator[Any]:
        yield Reject(file=path, line=1, reason="a bad first line")
        raise TypeError("'int' object is not iterable")

    spec = FormatSpec(name="buggy", sniff=lambda p, h: True, read=buggy)
    monkeypatch.setattr(formats_mod, "get_format", lambda name: spec)
    src = tmp_path / "in.jsonl"
    src.write_text("{}\n{}\n")
    sha = hashlib.sha256(src.read_bytes()).hexdigest()  # the bytes read are the bytes hashed
    job = FileJob(str(src), True, "k", str(tmp_path / "w"), sha, 6, name="in.jsonl")
    from treeprep.render import Renderer

    worker = FileWorker(FileOptions(format="buggy"), renderer=Renderer.load(None))
    result = worker.process(job)
    assert (result.records_read, result.records_rejected, result.sequences) == (2, 2, 0)
    rejects = [json.loads(x) for x in (tmp_path / "w" / "rejects.jsonl").read_text().splitlines()]
    assert rejects[1]["reason"] == (
        "internal error in adapter buggy: TypeError: 'int' object is not iterable"
    )


def test_a_build_renders_with_the_server_s_defaults_and_effort_map(tmp_path: Path) -> None:
    """``--default-chat-template-kwargs`` and ``--reasoning-effort-map`` reach every call's
    render: the request's effort ``xhigh`` mapped to ``max``, the default ``mode`` kept under
    the request's own ``style``."""
    from treeprep.build import BuildConfig, build
    from treeprep.render import Renderer
    from treeprep.shards import iter_trees

    rec = {"request": {"model": "m", "messages": [{"role": "user", "content": "Hi"}],
                       "output_config": {"effort": "xhigh"},
                       "chat_template_kwargs": {"style": "terse"}},
           "response": {"id": "r", "type": "message", "stop_reason": "end_turn",
                        "content": [{"type": "text", "text": "Done."}]}}  # fmt: skip
    log = tmp_path / "a.jsonl"
    log.write_text(json.dumps(rec) + "\n")
    template = tmp_path / "t.jinja"
    template.write_text(
        "[{{ reasoning_effort }}|{{ mode }}|{{ style }}]{% for m in messages %}<{{ m.role }}>"
        "{{ m.content }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    options = FileOptions(
        chat_template=str(template),
        reasoning_effort_map='{"xhigh": "max"}',
        default_chat_template_kwargs='{"mode": "fast", "style": "long"}',
    )
    build(BuildConfig(inputs=[str(log)], out=str(tmp_path / "o"), file=options))
    ((seq,),) = [list(t.iter_sequences()) for t in iter_trees(str(tmp_path / "o"))]
    prompt = Renderer.load(None).decode(seq["input_ids"][: seq["loss_mask"].index(1)])
    assert prompt == "[max|fast|terse]<user>Hi<assistant>"
