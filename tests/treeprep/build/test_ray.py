"""``--engine ray``: the same bytes as the local engine, resume, rejects and errors.

One local Ray (``ray.init(num_cpus=2)``) serves the whole module; every test that needs it is
marked ``ray`` and skipped where Ray is not installed (``pip install -e ".[ray]"``).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from treeprep.build import BuildConfig, build
from treeprep.build.ray import plan_shards
from treeprep.cli.app import app
from treeprep.errors import TooManyErrors, TreeprepError
from treeprep.shards import ShardWriter
from treeprep.trie import build_tree

ROOT = Path(__file__).resolve().parents[3]
SAMPLE = ROOT / "sample_data"
SHARED = ROOT / ".." / "shared" / "data"
QWEN3 = SHARED / "tokenizers" / "qwen3"
needs_shared = pytest.mark.skipif(not SHARED.exists(), reason="../shared/data is absent")


@pytest.fixture(scope="module")
def local_ray():
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, logging_level="warning")
    yield ray
    if started:
        ray.shutdown()


def _outputs(out: Path) -> dict[str, bytes]:
    """Every file a build leaves outside its work folder, by relative path."""
    return {
        str(p.relative_to(out)): p.read_bytes()
        for p in sorted(out.rglob("*"))
        if p.is_file() and ".work" not in p.relative_to(out).parts
    }


def _assert_same_bytes(a: Path, b: Path) -> dict[str, bytes]:
    fa, fb = _outputs(a), _outputs(b)
    assert sorted(fa) == sorted(fb)
    for name in fa:
        assert fa[name] == fb[name], f"{name} differs"
    return fa


def test_shard_plan_is_shard_writers_rule(tmp_path: Path) -> None:
    """The driver's cut of the sorted trees matches where ShardWriter closes its shards."""
    trees = [build_tree([_seq(f"g{i:02d}", list(range(1, 2 + (i * 7) % 23)))]) for i in range(40)]
    for limit in (1, 5, 30, 64, 10_000):
        writer = ShardWriter(str(tmp_path / f"o{limit}"), limit)
        for t in trees:
            writer.add(t)
        writer.close()
        first = plan_shards([t.tokens_tree for t in trees], limit)
        sizes = [b - a for a, b in zip(first, [*first[1:], len(trees)], strict=True)]
        assert [e.trees for e in writer.entries] == sizes
        assert len(sizes) > 1 or limit == 10_000


def _seq(gid: str, tokens: list[int]):
    import numpy as np

    from treeprep.sequence import Sequence

    return Sequence(tokens=np.asarray(tokens, dtype=np.int32), loss_spans=[], group_id=gid)


@pytest.mark.long  # (the sample data on Ray by default: the dedup and normalized test)
@pytest.mark.ray
def test_sample_data_gives_the_same_bytes_as_the_local_engine(
    tmp_path: Path, local_ray, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)  # relative input paths, as on a command line
    common = {"inputs": ["sample_data"], "shard_tokens": 4096}
    m_local = build(BuildConfig(out=str(tmp_path / "local"), **common))
    m_ray = build(BuildConfig(out=str(tmp_path / "ray"), engine="ray", workers=2, **common))
    files = _assert_same_bytes(tmp_path / "local", tmp_path / "ray")
    assert m_ray == m_local
    # the comparison covers shard boundaries, rejects and the reconciled counts
    assert len(m_local.shards) > 2
    assert m_local.counts.records_rejected > 0
    rejects = [json.loads(x) for x in files["rejects.jsonl"].splitlines()]
    assert len(rejects) == m_local.counts.records_rejected
    c = m_ray.counts
    assert c.records_read == c.records_in_trees + len(rejects) + c.records_filtered


@pytest.mark.long
@pytest.mark.ray
@needs_shared
def test_real_logs_with_qwen3_by_file_url_give_the_same_bytes(tmp_path: Path, local_ray) -> None:
    """Inputs and output given as file:// URLs; the local build is given the plain paths."""
    # two of the real formats, in shards small enough that there are several
    logs = [(SHARED / "logs" / d).resolve() for d in ("swe-agent", "tau2-bench")]
    common = {"tokenizer": str(QWEN3), "shard_tokens": 1 << 16}
    m_local = build(BuildConfig(inputs=[str(p) for p in logs], out=str(tmp_path / "a"), **common))
    m_ray = build(
        BuildConfig(
            inputs=[p.as_uri() for p in logs],
            out=(tmp_path / "b").as_uri(),
            engine="ray",
            workers=2,
            **common,
        )
    )
    _assert_same_bytes(tmp_path / "a", tmp_path / "b")
    assert m_local.counts.trees > 10 and len(m_local.shards) > 1
    assert m_ray.counts == m_local.counts


class _Killed(Exception):
    pass


@pytest.mark.long
@pytest.mark.ray
def test_a_killed_driver_resumes_and_a_half_written_file_is_redone_whole(
    tmp_path: Path, local_ray
) -> None:
    files = []
    for i in range(4):
        rows = [
            {
                "group_id": f"g{i % 2}",
                "prompt_token_ids": [1, 2, i + 3],
                "generation_token_ids": [k],
            }
            for k in range(5)
        ]
        path = tmp_path / f"f{i}.jsonl"
        path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows) + b"{not json\n")
        files.append(str(path))
    build(BuildConfig(inputs=files, out=str(tmp_path / "clean"), shard_tokens=8))

    out = tmp_path / "out"

    def dies_after_first_file(stage: str, done: int, total: int) -> None:
        if stage == "render" and done >= 1:
            raise _Killed

    cfg = BuildConfig(inputs=files, out=str(out), engine="ray", workers=2, shard_tokens=8)
    with pytest.raises(_Killed):
        build(cfg, on_progress=dies_after_first_file)
    assert not (out / "manifest.json").exists()
    work = out / ".work"
    dirs = [d for d in work.iterdir() if d.is_dir()]  # the lock and the index are files
    finished = {d: (d / "done.json").stat().st_mtime_ns for d in dirs if _done(d)}
    assert finished
    donor = (next(iter(finished)) / "sequences.arrow").read_bytes()
    # a worker killed mid-file leaves its rows without a done.json: a file with every row twice
    unfinished = [d for d in dirs if not _done(d)]
    if not unfinished:  # every file finished before the kill took effect: undo one
        victim = next(iter(finished))
        (victim / "done.json").unlink()
        del finished[victim]
        unfinished = [victim]
    for d in unfinished:
        (d / "sequences.arrow").write_bytes(donor)
        (d / "sequences.arrow.tmp").write_bytes(b"half")

    starts: list[int] = []
    build(cfg, on_progress=lambda s, d, t: starts.append(d) if s == "render" and not starts else 0)
    assert starts == [len(finished)]  # the finished files were skipped ...
    for d, mtime in finished.items():  # ... and not rewritten
        assert (d / "done.json").stat().st_mtime_ns == mtime
    _assert_same_bytes(tmp_path / "clean", out)
    assert not any(p.name.endswith(".tmp") for p in out.rglob("*"))


def _done(work_dir: Path) -> bool:
    return (work_dir / "done.json").exists()


def _render_actor_pids() -> list[int]:
    """Render actors: Ray titles their processes ``ray::MapWorker(MapBatches(_RenderActor))``."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"_RenderActor" in f.read():
                    pids.append(int(pid))
        except OSError:
            pass
    return pids


@pytest.mark.long
@pytest.mark.ray
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds Ray's actor processes in /proc")
def test_killed_render_workers_are_retried_without_duplicate_rows(
    tmp_path: Path, local_ray
) -> None:
    files = []
    # enough files that rendering is still under way when the first is done (4 finished inside
    # one poll once rendering got faster)
    for i in range(12):
        path = tmp_path / f"f{i}.jsonl"
        rows = (
            {
                "group_id": f"g{k % 7}",
                "prompt_token_ids": list(range(1, 40 + i)),
                "generation_token_ids": [k % 256, i],  # ids of the built-in tokenizer
            }
            for k in range(2000)
        )
        path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
        files.append(str(path))
    clean = build(BuildConfig(inputs=files, out=str(tmp_path / "clean")))

    progress: list[tuple[int, int]] = []
    result: list = []
    cfg = BuildConfig(inputs=files, out=str(tmp_path / "out"), engine="ray", workers=2)

    def run() -> None:
        try:
            result.append(
                build(
                    cfg, on_progress=lambda s, d, n: progress.append((d, n)) if s == "render" else 0
                )
            )
        except BaseException as e:  # noqa: B036 - handed to the test thread
            result.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    killed: list[int] = []
    while thread.is_alive() and not killed:
        pids = _render_actor_pids()
        if pids and progress and 1 <= progress[-1][0] < progress[-1][1]:
            for pid in pids:  # every render actor, each in the middle of a file
                os.kill(pid, signal.SIGKILL)
            killed = pids
        time.sleep(0.02)
    thread.join()
    assert killed, "rendering finished before a worker could be killed"
    assert not isinstance(result[0], BaseException), result[0]
    assert result[0].counts == clean.counts
    _assert_same_bytes(tmp_path / "clean", tmp_path / "out")


@pytest.mark.ray
def test_errors_come_back_as_treeprep_errors(tmp_path: Path, local_ray) -> None:
    # rejects past --max-errors stop the build in the driver, as locally
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes((SAMPLE / "tokens.jsonl").read_bytes().splitlines()[0] + b"\n{nope\n" * 3)
    with pytest.raises(TooManyErrors, match="more than --max-errors 1"):
        build(BuildConfig(inputs=[str(bad)], out=str(tmp_path / "o1"), engine="ray", max_errors=1))
    # an error raised inside a Ray worker reaches the caller as itself, naming the file (the
    # command's main() prints TreeprepErrors and exits 1)
    tools = tmp_path / "tools.json"
    tools.write_text('{"not": "a list"}')
    args = [str(SAMPLE / "openai_chat.jsonl"), "-o", str(tmp_path / "o2"), "--tools", str(tools)]
    res = CliRunner().invoke(app, ["build", *args, "--engine", "ray"])
    assert res.exit_code == 1
    assert type(res.exception) is TreeprepError
    assert "tools.json:1: expected a JSON list of tool schemas" in str(res.exception)
    assert not os.path.exists(tmp_path / "o2" / "manifest.json")


@pytest.mark.ray
def test_deduplicated_and_normalized_builds_are_the_same_bytes_on_ray(
    tmp_path: Path, local_ray
) -> None:
    """One build, local and on Ray (one Ray build for both checks: each costs tens of seconds
    of worker start-up on two cores):

    * copies across files are left out alike by both engines, a kept row whose shared prefix
      was a dropped duplicate made whole by both (issue 27: dedup);
    * a file with calls counted as normalized beside files without: each file's counts come
      back alone (Arrow gives the other files' count keys as None), the manifests are the
      same bytes."""
    import orjson

    def call(g: str, i: int, more: bool = False) -> dict:
        msgs = [{"role": "user", "content": f"question {i}"}]
        if more:
            msgs += [
                {"role": "assistant", "content": f"answer {i}"},
                {"role": "user", "content": "more"},
            ]
        return {
            "group_id": g,
            "call_id": f"{g}-{i}-{more}",
            "messages": msgs,
            "completion": {"role": "assistant", "content": f"answer {i}"},
        }

    def thought(i: int, text: str) -> dict:
        return {
            "group_id": f"t{i}",
            "messages": [{"role": "user", "content": f"topic {i}"}],
            "completion": {"role": "assistant", "content": text},
        }

    def undeclared(i: int) -> dict:  # calls a tool its schemas lack: counted partial-tools
        cat = {"id": f"c{i}", "type": "function", "function": {"name": "cat", "arguments": "{}"}}
        return {
            **thought(i, ""),
            "tools": [{"type": "function", "function": {"name": "ls", "parameters": {}}}],
            "completion": {"role": "assistant", "content": "", "tool_calls": [cat]},
        }

    def write(name: str, rows: list[dict]) -> None:
        (logs / name).write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))

    logs = tmp_path / "logs"
    logs.mkdir()
    write("a.jsonl", [call("g", i) for i in range(3)])
    write("b.jsonl", [call("h", 0), call("h", 0, more=True), call("h", 7)])
    write("c.jsonl", [undeclared(i) for i in range(2)])
    for name in ("d", "e"):
        write(f"{name}.jsonl", [thought(i, f"note {i} of {name}") for i in range(3)])
    m = build(BuildConfig(inputs=[str(logs)], out=str(tmp_path / "local")))
    assert m.filtered == {"duplicate tokens": 1}
    assert m.normalized == {"partial-tools": 2, "round-trip": m.counts.records_in_trees}
    m_ray = build(
        BuildConfig(inputs=[str(logs)], out=str(tmp_path / "ray"), engine="ray", workers=2)
    )
    assert m_ray == m
    _assert_same_bytes(tmp_path / "local", tmp_path / "ray")
