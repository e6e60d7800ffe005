"""``treeprep build``: log files in, one token trie per group out, as zstd Arrow shards.

The build runs in two stages, so that it streams, resumes and parallelises without holding the
input in memory:

1. **Render, per input file** (in parallel across files with ``workers``). The file's format is
   detected (or forced), its records are read, each record is rendered to a token
   :class:`~treeprep.sequence.Sequence` with the model's chat template, and the sequences are
   streamed into an uncompressed Arrow IPC work file under ``OUT/.work/``; unusable records go to a
   per-file rejects list. A file's work is keyed by the hash of its bytes, the format, the options
   and the tokenizer identity, and its ``done.json`` is written last: a build killed half-way and
   run again skips every file that finished and redoes only the rest.
2. **Group, build tries, write shards** (in the main process). The work files are memory-mapped;
   only their ``group_id`` columns are read up front. Groups are processed in sorted order, one at a
   time: their rows are gathered, inserted into a trie (:func:`treeprep.trie.build_tree`) and
   appended to the current shard, which is written (temporary name, then rename) once it holds
   ``shard_tokens`` tokens. Memory is bounded by the largest group plus one shard's buffer.

Finally ``rejects.jsonl`` and ``manifest.json`` are written, the manifest last: its presence means
the build is whole. No timestamps or absolute paths are recorded, so the same inputs give the same
bytes. Counts reconcile: ``records_read == records_in_trees + records_rejected``.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.ipc as ipc

from treeprep import __version__
from treeprep.errors import InputError, TooManyErrors, TreeprepError
from treeprep.schemas import SCHEMA_VERSION, Manifest, Reject
from treeprep.schemas.manifest import Counts, InputEntry, ShardEntry
from treeprep.sequence import Sequence
from treeprep.shards import write_shard
from treeprep.trie import Tree, build_tree

#: Progress callback: (stage, done, total). Stages: "render" (files), "trees" (groups).
Progress = Callable[[str, int, int], None]

WORK_SCHEMA = pa.schema(
    [
        ("group_id", pa.string()),
        ("tokens", pa.list_(pa.int32())),
        ("loss_spans", pa.list_(pa.int32())),
        ("logprobs", pa.list_(pa.float32())),
        ("reward", pa.float64()),
        ("advantage", pa.float64()),
        ("agent_id", pa.string()),
        ("call_id", pa.string()),
        ("source", pa.string()),
        ("source_format", pa.string()),
        ("branch_reason", pa.string()),
    ]
)
_WORK_BATCH = 512


@dataclass
class BuildConfig:
    """What ``treeprep build`` does. Paths are kept as given (they go into the manifest)."""

    #: files, folders or globs; plain, ``.gz`` or ``.zst``
    inputs: list[str]
    #: the output folder (created; an earlier build's shards there are replaced)
    out: str
    #: a Hugging Face tokenizer folder; None uses the built-in byte-level ChatML tokenizer
    tokenizer: str | None = None
    #: force one input format for every file instead of detecting it per file
    format: str | None = None
    #: a record field whose value is the group id (default: the format's own group id)
    group_by: str | None = None
    #: processes rendering input files in parallel
    workers: int = 1
    #: stop with an error once more records than this are rejected (None: never)
    max_errors: int | None = None
    #: a file whose text is the system prompt, for formats whose logs hold none
    system_prompt: str | None = None
    #: a JSON file with a list of tool (function) schemas, for formats whose logs hold none
    tools: str | None = None
    #: render with a verified Python port of the chat template where there is one (False: jinja)
    native_templates: bool = True
    #: a shard is closed once it holds this many tree tokens
    shard_tokens: int = 32 * 1024 * 1024
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.inputs:
            raise TreeprepError("no inputs given")
        if self.workers < 1:
            raise TreeprepError(f"workers must be >= 1, got {self.workers}")
        if self.max_errors is not None and self.max_errors < 0:
            raise TreeprepError(f"max_errors must be >= 0, got {self.max_errors}")
        if self.shard_tokens < 1:
            raise TreeprepError(f"shard_tokens must be >= 1, got {self.shard_tokens}")


# --------------------------------------------------------------------------------------------
# stage 1: one input file -> work file of sequences + rejects
# --------------------------------------------------------------------------------------------


@dataclass
class _FileJob:
    path: str
    explicit: bool
    key: str
    work_dir: str
    sha256: str
    size: int


@dataclass
class _FileResult:
    path: str
    format: str
    records_read: int
    records_rejected: int
    sequences: int
    skipped: bool = False


_worker_state: dict = {}


def _worker_init(tokenizer: str | None, cfg_dict: dict, renderer=None) -> None:
    from treeprep.render import Renderer

    _worker_state["renderer"] = (
        renderer
        if renderer is not None
        else Renderer.load(tokenizer, native_templates=cfg_dict.get("native_templates", True))
    )
    _worker_state["cfg"] = cfg_dict


def _read_options(cfg: dict):
    from treeprep.formats import ReadOptions

    system_prompt = None
    tools = None
    if cfg.get("system_prompt"):
        try:
            with open(cfg["system_prompt"], encoding="utf-8") as f:
                system_prompt = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise TreeprepError(f"{cfg['system_prompt']}: cannot read system prompt: {e}") from e
    if cfg.get("tools"):
        try:
            with open(cfg["tools"], "rb") as f:
                tools = orjson.loads(f.read())
        except (OSError, orjson.JSONDecodeError) as e:
            raise TreeprepError(f"{cfg['tools']}: cannot read tools JSON: {e}") from e
        if isinstance(tools, dict) and "tools" in tools:
            tools = tools["tools"]
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            raise TreeprepError(f"{cfg['tools']}:1: expected a JSON list of tool schemas")
    return ReadOptions(system_prompt=system_prompt, tools=tools, group_by=cfg.get("group_by"))


def _default_group(path: str, group_by_folder: bool) -> str:
    return (os.path.dirname(path) or ".") if group_by_folder else path


def _process_file(job: _FileJob) -> _FileResult:
    """Stage 1 for one file, in a worker.

    Writes ``sequences.arrow``, ``rejects.jsonl`` and, last, ``done.json`` under ``job.work_dir``.
    """
    from treeprep.formats import FormatSpec, detect_format, get_format
    from treeprep.io import read_head
    from treeprep.render import RenderError

    renderer = _worker_state["renderer"]
    cfg = _worker_state["cfg"]
    os.makedirs(job.work_dir, exist_ok=True)
    rejects: list[dict] = []
    n_read = 0
    n_seq = 0

    spec: FormatSpec | None
    if cfg.get("format"):
        spec = get_format(cfg["format"])
    else:
        spec = detect_format(job.path, read_head(job.path))
    if spec is None:
        if not job.explicit:
            result = _FileResult(job.path, "", 0, 0, 0, skipped=True)
            _finish_file(job, result, [])
            return result
        rejects.append(
            Reject(
                file=job.path,
                line=0,
                reason="unrecognised input format (pass --format to force one)",
            ).model_dump(exclude_none=True)
        )
        result = _FileResult(job.path, "unknown", 1, 1, 0)
        _finish_file(job, result, rejects)
        return result

    seq_path = os.path.join(job.work_dir, "sequences.arrow")
    tmp = seq_path + ".tmp"
    buf: list[Sequence] = []
    opts = _read_options(cfg)
    with pa.OSFile(tmp, "wb") as sink, ipc.new_file(sink, WORK_SCHEMA) as writer:

        def flush() -> None:
            if buf:
                writer.write_batch(_sequences_to_batch(buf))
                buf.clear()

        items = spec.read(job.path, opts)
        while True:
            try:
                item = next(items)
            except StopIteration:
                break
            except InputError as e:  # the rest of the file is unusable
                n_read += 1
                rejects.append(
                    Reject(file=e.file, line=e.line, reason=e.reason, format=spec.name).model_dump(
                        exclude_none=True
                    )
                )
                break
            n_read += 1
            if isinstance(item, Reject):
                if item.format is None:
                    item.format = spec.name
                rejects.append(item.model_dump(exclude_none=True))
                continue
            gid = item.group_id or _default_group(job.path, spec.group_by_folder)
            if not item.source_file:
                item.source_file = job.path
            if not item.source_format:
                item.source_format = spec.name
            try:
                seq = renderer.render(item, group_id=gid, order=n_seq)
            except RenderError as e:
                rejects.append(
                    Reject(
                        file=item.source_file,
                        line=item.source_line,
                        reason=str(e),
                        format=spec.name,
                        call_id=item.call_id,
                    ).model_dump(exclude_none=True)
                )
                continue
            buf.append(seq)
            n_seq += 1
            if len(buf) >= _WORK_BATCH:
                flush()
        flush()
    os.replace(tmp, seq_path)
    result = _FileResult(job.path, spec.name, n_read, len(rejects), n_seq)
    _finish_file(job, result, rejects)
    return result


def _finish_file(job: _FileJob, result: _FileResult, rejects: list[dict]) -> None:
    rej_path = os.path.join(job.work_dir, "rejects.jsonl")
    with open(rej_path + ".tmp", "wb") as f:
        for r in rejects:
            f.write(orjson.dumps(r, option=orjson.OPT_SORT_KEYS) + b"\n")
    os.replace(rej_path + ".tmp", rej_path)
    done = os.path.join(job.work_dir, "done.json")
    with open(done + ".tmp", "w", encoding="utf-8") as f:
        json.dump(asdict(result), f)
    os.replace(done + ".tmp", done)


def _sequences_to_batch(seqs: list[Sequence]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "group_id": [s.group_id for s in seqs],
            "tokens": [s.tokens for s in seqs],
            "loss_spans": [np.asarray(s.loss_spans, dtype=np.int32).reshape(-1) for s in seqs],
            "logprobs": [s.logprobs for s in seqs],
            "reward": [s.reward for s in seqs],
            "advantage": [s.advantage for s in seqs],
            "agent_id": [s.agent_id for s in seqs],
            "call_id": [s.call_id for s in seqs],
            "source": [s.source for s in seqs],
            "source_format": [s.source_format for s in seqs],
            "branch_reason": [s.branch_reason for s in seqs],
        },
        schema=WORK_SCHEMA,
    )


class _WorkFiles:
    """Stage 1's work files, memory-mapped, with the mapped pages given back now and then.

    A group's rows are read as zero-copy slices of the mapped file (``Table.take`` would first
    concatenate every chunk of the table, touching and copying the whole file for each group).
    Pages a map has touched stay resident, and counted in the process's RSS, until the map is
    closed, so once ``release_bytes`` of rows have been read every map is closed between two groups
    and reopened (a footer read) when next needed. Peak memory is then bounded by
    ``release_bytes`` plus one group, whatever the input size.
    """

    def __init__(self, release_bytes: int = 256 << 20) -> None:
        self.paths: list[str] = []
        self._open: dict[int, tuple[pa.MemoryMappedFile, pa.Table]] = {}
        self._read = 0
        self.release_bytes = release_bytes

    def add(self, path: str) -> int:
        self.paths.append(path)
        return len(self.paths) - 1

    def table(self, i: int) -> pa.Table:
        if i not in self._open:
            src = pa.memory_map(self.paths[i], "r")
            self._open[i] = (src, ipc.open_file(src).read_all())
        return self._open[i][1]

    def rows(self, i: int, rows: np.ndarray) -> pa.Table:
        """Rows ``rows`` (ascending) of work file ``i``: slices of the map, valid until release."""
        table = self.table(i)
        cuts = np.flatnonzero(np.diff(rows) != 1) + 1
        parts = [table.slice(int(r[0]), len(r)) for r in np.split(rows, cuts)]
        out = parts[0] if len(parts) == 1 else pa.concat_tables(parts)
        self._read += 4 * sum(len(c.values) for c in out.column("tokens").chunks)
        return out

    def maybe_release(self) -> None:
        """Close every map if enough has been read since the last release (call between groups,
        when no slice handed out is in use any more)."""
        if self._read >= self.release_bytes:
            self.release()

    def release(self) -> None:
        sources = [src for src, _ in self._open.values()]
        self._open.clear()  # drop the tables (and their buffers) before closing the maps
        for src in sources:
            src.close()
        self._read = 0


def _rows_to_sequences(table: pa.Table) -> list[Sequence]:
    out = []
    tokens = table.column("tokens")
    spans = table.column("loss_spans").to_pylist()
    lps = table.column("logprobs")
    cols = {
        k: table.column(k).to_pylist()
        for k in (
            "group_id",
            "reward",
            "advantage",
            "agent_id",
            "call_id",
            "source",
            "source_format",
            "branch_reason",
        )
    }
    for i in range(table.num_rows):
        t = tokens[i].values.to_numpy(zero_copy_only=False)
        lp = lps[i]
        sp = spans[i]
        out.append(
            Sequence(
                group_id=cols["group_id"][i],
                tokens=t,
                loss_spans=list(zip(sp[0::2], sp[1::2], strict=True)),
                logprobs=None if not lp.is_valid else lp.values.to_numpy(zero_copy_only=False),
                reward=cols["reward"][i],
                advantage=cols["advantage"][i],
                agent_id=cols["agent_id"][i],
                call_id=cols["call_id"][i],
                source=cols["source"][i],
                source_format=cols["source_format"][i],
                branch_reason=cols["branch_reason"][i],
            )
        )
    return out


# --------------------------------------------------------------------------------------------
# the build
# --------------------------------------------------------------------------------------------


def _job_key(sha: str, cfg: BuildConfig, tok_sha: str, explicit: bool) -> str:
    h = hashlib.sha256()
    for part in (
        sha,
        cfg.format or "",
        cfg.group_by or "",
        tok_sha,
        _file_digest(cfg.system_prompt),
        _file_digest(cfg.tools),
        str(explicit),
        str(SCHEMA_VERSION),
        __version__,
    ):
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:32]


def _file_digest(path: str | None) -> str:
    if not path:
        return ""
    from treeprep.io import file_sha256

    try:
        return file_sha256(path)
    except OSError as e:
        raise TreeprepError(f"{path}: cannot read: {e}") from e


def _run_stage1(
    jobs: list[_FileJob], cfg: BuildConfig, on_progress: Progress | None, renderer
) -> Iterator[_FileResult]:
    todo = [j for j in jobs if not os.path.exists(os.path.join(j.work_dir, "done.json"))]
    done_before = len(jobs) - len(todo)
    if on_progress:
        on_progress("render", done_before, len(jobs))
    cfg_dict = {
        "format": cfg.format,
        "group_by": cfg.group_by,
        "system_prompt": cfg.system_prompt,
        "tools": cfg.tools,
        "native_templates": cfg.native_templates,
    }
    n = done_before
    if cfg.workers > 1 and len(todo) > 1:
        procs = min(cfg.workers, len(todo))
        if "fork" in mp.get_all_start_methods():
            # forked workers inherit the loaded renderer (importing transformers and loading a
            # tokenizer costs seconds per process); the tokenizers library disables its own thread
            # pool in a forked child, which it announces unless told so beforehand
            _worker_init(cfg.tokenizer, cfg_dict, renderer)
            pool_ctx = mp.get_context("fork")
            saved = os.environ.get("TOKENIZERS_PARALLELISM")
            os.environ["TOKENIZERS_PARALLELISM"] = "false"
            try:
                pool = pool_ctx.Pool(procs)
            finally:
                if saved is None:
                    del os.environ["TOKENIZERS_PARALLELISM"]
                else:
                    os.environ["TOKENIZERS_PARALLELISM"] = saved
        else:
            pool = mp.get_context("spawn").Pool(
                procs, initializer=_worker_init, initargs=(cfg.tokenizer, cfg_dict)
            )
        with pool:
            for res in pool.imap_unordered(_process_file, todo):
                n += 1
                if on_progress:
                    on_progress("render", n, len(jobs))
                yield res
    else:
        _worker_init(cfg.tokenizer, cfg_dict, renderer)
        for job in todo:
            res = _process_file(job)
            n += 1
            if on_progress:
                on_progress("render", n, len(jobs))
            yield res


def build(cfg: BuildConfig, *, on_progress: Progress | None = None) -> Manifest:
    """Run a whole build (see the module docstring). Returns the manifest it wrote."""
    from treeprep.io import expand_inputs, file_sha256
    from treeprep.render import Renderer

    renderer = Renderer.load(cfg.tokenizer, native_templates=cfg.native_templates)
    identity = renderer.identity
    out = cfg.out
    work_root = os.path.join(out, ".work")
    shard_dir = os.path.join(out, "shards")
    os.makedirs(work_root, exist_ok=True)
    os.makedirs(shard_dir, exist_ok=True)
    # an older manifest must not describe shards this build is about to replace
    manifest_path = os.path.join(out, "manifest.json")
    if os.path.exists(manifest_path):
        os.remove(manifest_path)

    files = expand_inputs(cfg.inputs)
    jobs: list[_FileJob] = []
    for path, explicit in files:
        try:
            sha = file_sha256(path)
            size = os.path.getsize(path)
        except OSError as e:
            raise InputError(path, 0, f"cannot read: {e}") from e
        key = _job_key(sha, cfg, identity.sha256, explicit)
        jobs.append(_FileJob(path, explicit, key, os.path.join(work_root, key), sha, size))

    # ---- stage 1
    results: dict[str, _FileResult] = {}
    n_rejected = 0
    for res in _run_stage1(jobs, cfg, on_progress, renderer):
        results[res.path] = res
        n_rejected += res.records_rejected
        if cfg.max_errors is not None and n_rejected > cfg.max_errors:
            raise TooManyErrors(
                f"{n_rejected} records rejected, more than --max-errors {cfg.max_errors}; "
                f"last file: {res.path} (see {os.path.join(work_root, '*', 'rejects.jsonl')})"
            )
    for job in jobs:
        if job.path not in results:
            with open(os.path.join(job.work_dir, "done.json"), encoding="utf-8") as f:
                results[job.path] = _FileResult(**json.load(f))
    n_rejected = sum(r.records_rejected for r in results.values())
    if cfg.max_errors is not None and n_rejected > cfg.max_errors:
        raise TooManyErrors(
            f"{n_rejected} records rejected, more than --max-errors {cfg.max_errors}"
        )

    # ---- stage 2: group rows across work files, in sorted group order
    work = _WorkFiles()
    group_rows: dict[str, list[tuple[int, np.ndarray]]] = {}
    for job in jobs:
        res = results[job.path]
        p = os.path.join(job.work_dir, "sequences.arrow")
        if res.skipped or res.sequences == 0 or not os.path.exists(p):
            continue
        ti = work.add(p)
        gids = work.table(ti).column("group_id").to_numpy(zero_copy_only=False)
        order = np.argsort(gids, kind="stable")
        sorted_g = gids[order]
        bounds = np.flatnonzero(sorted_g[1:] != sorted_g[:-1]) + 1
        for seg in np.split(order, bounds):
            if len(seg):
                group_rows.setdefault(str(gids[seg[0]]), []).append((ti, np.sort(seg)))
    work.release()

    for name in os.listdir(shard_dir):  # shards of an earlier build are replaced
        os.remove(os.path.join(shard_dir, name))

    counts = Counts()
    shards: list[ShardEntry] = []
    pending: list[Tree] = []
    pending_tokens = 0

    def flush() -> None:
        nonlocal pending, pending_tokens
        if not pending:
            return
        name = f"shard-{len(shards):05d}.arrow"
        size, sha = write_shard(pending, os.path.join(shard_dir, name))
        shards.append(
            ShardEntry(
                path=f"shards/{name}",
                bytes=size,
                sha256=sha,
                trees=len(pending),
                tokens_tree=sum(t.tokens_tree for t in pending),
                tokens_linear=sum(t.tokens_linear for t in pending),
            )
        )
        pending = []
        pending_tokens = 0

    gids_sorted = sorted(group_rows)
    for gi, gid in enumerate(gids_sorted):
        seqs: list[Sequence] = []
        for ti, rows in group_rows[gid]:
            seqs.extend(_rows_to_sequences(work.rows(ti, rows)))
        tree = build_tree(seqs, gid)
        del seqs  # views into the maps: gone before the maps may be released
        work.maybe_release()
        counts.trees += 1
        counts.sequences += int(tree.seq_count.sum())
        counts.nodes += tree.num_nodes
        counts.tokens_linear += tree.tokens_linear
        counts.tokens_tree += tree.tokens_tree
        pending.append(tree)
        pending_tokens += tree.tokens_tree
        if pending_tokens >= cfg.shard_tokens:
            flush()
        if on_progress:
            on_progress("trees", gi + 1, len(gids_sorted))
    flush()
    work.release()

    # work of inputs that are no longer part of this build is dropped; the rest stays for reruns
    keep = {os.path.basename(j.work_dir) for j in jobs}
    for name in os.listdir(work_root):
        if name not in keep:
            shutil.rmtree(os.path.join(work_root, name), ignore_errors=True)

    # ---- rejects, then the manifest
    rej_path = os.path.join(out, "rejects.jsonl")
    with open(rej_path + ".tmp", "wb") as rej_out:
        for job in jobs:
            p = os.path.join(job.work_dir, "rejects.jsonl")
            if os.path.exists(p):
                with open(p, "rb") as rej_in:
                    shutil.copyfileobj(rej_in, rej_out)
    os.replace(rej_path + ".tmp", rej_path)

    inputs: list[InputEntry] = []
    formats: dict[str, int] = {}
    skipped: list[str] = []
    for job in jobs:
        res = results[job.path]
        if res.skipped:
            skipped.append(job.path)
            continue
        inputs.append(
            InputEntry(
                path=job.path,
                bytes=job.size,
                sha256=job.sha256,
                format=res.format,
                records_read=res.records_read,
                records_rejected=res.records_rejected,
            )
        )
        counts.records_read += res.records_read
        counts.records_rejected += res.records_rejected
        formats[res.format] = formats.get(res.format, 0) + res.records_read
    counts.records_in_trees = counts.sequences
    if counts.records_read != counts.records_in_trees + counts.records_rejected:
        raise TreeprepError(
            f"internal error: counts do not reconcile: read {counts.records_read}, "
            f"in trees {counts.records_in_trees}, rejected {counts.records_rejected}"
        )
    manifest = Manifest(
        schema_version=SCHEMA_VERSION,
        treeprep_version=__version__,
        tokenizer=identity,
        group_by=cfg.group_by or "group_id",
        inputs=inputs,
        counts=counts,
        shards=shards,
        formats=dict(sorted(formats.items())),
        skipped_files=skipped,
    )
    with open(manifest_path + ".tmp", "w", encoding="utf-8") as f:
        f.write(manifest.model_dump_json(indent=2))
        f.write("\n")
    os.replace(manifest_path + ".tmp", manifest_path)
    return manifest
