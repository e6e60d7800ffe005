"""``treeprep train BUILD --model M --dry-run``: the run's peak memory per rank and step time,
predicted by :mod:`treeprep.dry_run` (on :mod:`treeprep.memory`) from the model's config and the
build's longest path.

Loads no weights and writes nothing: a preset of :mod:`treeprep.flops` or a local folder's
``config.json`` gives the shape without torch; a trainer preset (``tiny-qwen3``) is read from its
fields (that imports the trainer's preset table, not a model). Prints a table, or with ``--json``
``predicted_peak_bytes``, the suggested budget and checkpointing, ``predicted_step_seconds`` and
the terms.

The dry run takes the memory model's typed setup of the command's options
(:func:`memory_setup`, a :class:`~treeprep.memory.MemorySetup`, whose fields mirror
``TrainConfig``'s), its own options, and which options were given (:func:`dry_run_cmd`). Not the
``TrainConfig`` itself: importing ``treeprep.trainer.config`` imports torch (the trainer's
package does), seconds the dry run does not spend.

Both store places are compared (:mod:`treeprep.memory_stores`): the GPU peak and host RAM per
rank with the hand-off stores on the GPU and in host memory, and the longest path each fits in
``--gpu-memory`` and, for host stores, ``--host-memory`` (per node, shared by up to
:data:`RANKS_PER_NODE` ranks).

    treeprep train OUT --model qwen3-8b --world-size 8 --parallel fsdp --gpu-memory 80GiB \\
        --host-memory 1TiB --dry-run --json
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, replace
from typing import Any

import typer

from treeprep.dry_run import BuildFacts
from treeprep.errors import TreeprepError
from treeprep.flops import ModelShape, load_model
from treeprep.memory import GPUS, MemorySetup, shape_from_preset
from treeprep.memory_stores import dry_run_stores
from treeprep.modes import Accumulate, Attn, Gpu, Optimizer, Parallel, PartGraph, Precision, Stores

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}  # fmt: skip


#: GPUs of one node: ``--host-memory`` is shared by this many ranks (fewer when the world is)
RANKS_PER_NODE = 8


def parse_bytes(text: str, option: str = "--gpu-memory") -> int:
    """``80GiB``, ``141GB``, ``85899345920`` -> bytes."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise TreeprepError(f"{option} {text!r}: expected a size such as 80GiB or 141GB")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def model_shape(spec: str) -> ModelShape:
    """A flops preset, a config.json (or its folder), or a trainer preset's fields."""
    try:
        return load_model(spec)
    except TreeprepError:
        from treeprep.trainer.models.presets import PRESETS

        if spec not in PRESETS:
            raise
        return shape_from_preset(asdict(PRESETS[spec]), name=spec)


def memory_setup(
    *,
    precision: Precision,
    optimizer: Optimizer,
    momentum: float,
    world_size: int,
    activation_checkpointing: bool,
    handoff_accumulate: Accumulate,
    part_graph: PartGraph,
    keep_tokens: int | None,
    chunk: int,
    entropy_coef: float,
    stores: Stores,
    cp: int,
    attn: Attn,
) -> MemorySetup:
    """The memory setup of the train command's options: a GPU run (precision auto is bf16),
    the optimizer's states per parameter; the parallelism is set per try by
    :func:`dry_run_cmd`."""
    if world_size < 1:
        raise TreeprepError("--world-size must be >= 1")
    states = 2 if optimizer == Optimizer.adamw else int(bool(momentum))
    return MemorySetup(
        precision=Precision.bfloat16 if precision == Precision.auto else precision,
        autocast=True,
        world_size=world_size,
        parallel=Parallel.ddp,
        optimizer_states=states,
        activation_checkpointing=activation_checkpointing,
        handoff_accumulate=handoff_accumulate,
        part_graph=part_graph,
        keep_tokens=keep_tokens,
        chunk=chunk,
        entropy=bool(entropy_coef),
        stores=stores,
        cp=cp,
        attn=attn,
    )


def dry_run_cmd(
    setup: MemorySetup,
    *,
    build: str,
    model: str,
    budget: int,
    parallel: Parallel,
    gpu: Gpu,
    gpu_memory: str | None,
    host_memory: str | None,
    given: frozenset[str],
    command_line: dict[str, list[str]],
    as_json: bool,
) -> None:
    """The ``--dry-run`` branch of ``treeprep train``: ``setup`` (:func:`memory_setup`), the
    options the dry run reads besides, ``given``, the names of the options set (on the command
    line, in a config file; :func:`treeprep.cli.train_options.given`: the budget, parallelism
    and stores not among them are the dry run's to choose) and ``command_line``, those set on
    the command line, spelled (carried into the command it suggests)."""
    mem = parse_bytes(gpu_memory) if gpu_memory else None
    host = None
    if host_memory:  # per node -> per rank
        host = parse_bytes(host_memory, "--host-memory") // min(setup.world_size, RANKS_PER_NODE)
    shape = model_shape(model)
    facts = BuildFacts.of(build)
    chosen = "parallel" in given
    for par in [parallel] if chosen else [Parallel.ddp, Parallel.fsdp]:
        out = dry_run_stores(
            shape,
            replace(setup, parallel=par),
            facts,
            GPUS[gpu.value],
            gpu_memory=mem,
            host_memory=host,
            budget=budget if "budget" in given else None,
            checkpointing_given=setup.activation_checkpointing,
            stores_given="stores" in given,
        )
        if out["fits"]:
            break
    out = {"model": shape.name, "world_size": setup.world_size, "parallel": par.value,
           "parallel_source": "given" if chosen else "suggested", "cp": setup.cp,
           "handoff_accumulate": setup.handoff_accumulate.value, **out}  # fmt: skip
    rest = [w for name, words in command_line.items() if name not in _PLANNED for w in words]
    out["command"] = next_command(out, build, model, rest)
    if as_json:
        typer.echo(json.dumps(out, indent=2))
        return
    _print(out)


#: options the run's command line sets from the dry run's answer, or that only the dry run reads
_PLANNED = {"budget", "activation_checkpointing", "part_graph", "stores", "parallel", "cp",
            "dry_run", "world_size", "gpu", "gpu_memory", "host_memory", "as_json", "build",
            "model"}  # fmt: skip


def next_command(d: dict[str, Any], build_dir: str, model_spec: str, given: list[str]) -> str:
    """One command line to run next: the run as planned (torchrun for more than one rank,
    the budget, checkpointing, part graph, stores, parallelism and cp that fit, and ``given``,
    the other options given), or where nothing fits, the dry run to try next."""
    import shlex

    ws, build = d["world_size"], shlex.quote(build_dir)
    rest = [shlex.quote(w) for w in given]
    model = ["--model", shlex.quote(model_spec)]
    if not d["fits"]:
        if ws == 1 or d["parallel"] == "ddp":
            more = ["--world-size", str(max(ws, RANKS_PER_NODE)), "--parallel", "fsdp"]
        elif d["stores"] == "gpu" and d["stores_source"] != "auto":
            more = ["--world-size", str(ws), "--stores", "auto"]
        else:
            more = ["--world-size", str(2 * ws), "--parallel", "fsdp"]
        if d["cp"] > 1:
            more += ["--cp", str(d["cp"])]
        return shlex.join(["treeprep", "train", build_dir, "--model", model_spec, "--dry-run",
                           *more])  # fmt: skip
    if ws == 1:
        head = ["treeprep", "train", build]
    else:
        nodes = -(-ws // RANKS_PER_NODE)
        head = ["torchrun", "--nproc-per-node", str(min(ws, RANKS_PER_NODE))]
        head += ["--nnodes", str(nodes)] if nodes > 1 else []
        head += ["-m", "treeprep.cli", "train", build]
    planned = ["--budget", str(d["budget"])]
    planned += ["--activation-checkpointing"] if d["activation_checkpointing"] else []
    planned += ["--part-graph", d["part_graph"]] if d["part_graph"] != "recompute" else []
    planned += ["--stores", "host"] if d["stores"] == "host" else []
    planned += ["--parallel", d["parallel"]] if ws > 1 else []
    planned += ["--cp", str(d["cp"])] if d["cp"] > 1 else []
    return " ".join([*head, *model, *planned, *rest])


def _gib(n: int | float) -> str:
    return f"{n / 2**30:,.2f} GiB"


def _print(d: dict[str, Any]) -> None:
    from rich.console import Console

    from treeprep.cli.tables import metrics_table

    verdict = "fits" if d["fits"] else "does NOT fit"
    cp = f", cp {d['cp']}" if d["cp"] > 1 else ""
    t = metrics_table(
        f"treeprep train --dry-run: {d['model']} x {d['world_size']} ({d['parallel']}{cp}) on "
        f"{d['gpu']}, {verdict} in {_gib(d['gpu_memory_bytes'])}"
    )
    for k, v in d["terms"].items():
        if k != "host_stores":  # host RAM, not a GPU term: the store rows below give it
            t.add_row(k, _gib(v))
    t.add_row("predicted_peak", _gib(d["predicted_peak_bytes"]))
    why = "given"
    if d["budget_source"] == "suggested":
        why = "the fastest step that fits" if d["fits"] else "nothing fits: the smallest tried"
    t.add_row("budget", f"{d['budget']:,} ({why})")
    t.add_row("activation_checkpointing", str(d["activation_checkpointing"]))
    t.add_row("part_graph", d["part_graph"])
    split = (
        f" (a rank feeds 1/{d['cp']} of a part, stores 1/{d['cp']} of the KV heads)"
        if d["cp"] > 1
        else ""
    )
    t.add_row("cp", f"{d['cp']}{split}")
    sb = d["suggested_budget"]
    ck = " --activation-checkpointing" if d["suggested_activation_checkpointing"] else ""
    if sb is not None and d["suggested_part_graph"] != d["part_graph"]:
        ck += f" --part-graph {d['suggested_part_graph']}"
    t.add_row("suggested", "nothing fits" if sb is None else f"--budget {sb:,}{ck}")
    t.add_row("stores", f"{d['stores']} ({d['stores_source']})")
    for where, c in d["store_places"].items():
        t.add_row(f"{where} stores", _place_row(where, c, d["cp"]))
    if d["host_memory_bytes"] is not None:
        t.add_row("host memory per rank", _gib(d["host_memory_bytes"]))
    t.add_row("longest_path", f"{d['build']['longest_path']:,} tokens")
    t.add_row("handoff per path token", f"{d['handoff_bytes_per_path_token']:,} B")
    t.add_row("predicted_step_seconds", f"{d['predicted_step_seconds']:,.2f}")
    t.add_row("predicted_epoch_seconds", f"{d['predicted_epoch_seconds']:,.1f}")
    a = d["assumptions"]
    t.add_row("assumed", f"{a['mfu']:.0%} of {a['peak_flops'] / 1e12:,.0f} TFLOP/s; {a['step']}")
    out = Console()
    out.print(t)
    word = "run" if d["fits"] else "nothing fits; try"
    out.print(f"{word}: {d['command']}", soft_wrap=True, highlight=False, markup=False)


def _place_row(where: str, c: dict[str, Any], cp: int) -> str:
    """One store place: its peak and host RAM, and the longest session, with the budget,
    checkpointing and cp those figures hold at."""
    fits = "fits" if c["fits"] else "does NOT fit"
    ck = "checkpointing" if c["activation_checkpointing"] else "no checkpointing"
    at = f"at budget {c['budget']:,}, {ck}, cp {cp}"
    if c["longest_path"] is None:
        longest = "longest path: set by host RAM, give --host-memory (per node, e.g. 1TiB)"
    else:
        longest = f"longest path that fits {c['longest_path']:,} tokens"
    return (
        f"GPU {_gib(c['gpu_peak_bytes'])}, host {_gib(c['host_bytes'])} per rank ({fits}) "
        f"{at}; {longest}"
    )
