"""Every mode of treeprep, spelled once: one :class:`~enum.StrEnum` per choice a user makes.

The pipeline, the trainer and the CLI all import their modes from here (this module imports only
the standard library, so the torch-free CLI and the memory model may use it too). typer lists a
mode's choices in ``--help`` and refuses anything else; a Python caller may pass the plain string
(``loss="grpo"``), which the config coerces with :meth:`Mode.of`, the one check of a mode value:
it names the field and the choices. A member is a ``str`` (``Loss.sft == "sft"``) and prints and
serializes as its value, so ``config.json`` and plan files hold the plain strings.

Names: ``Cut`` is how ``pack`` runs a tree over the budget (``handoff``: one slot whose parts hand
their keys and values over; ``prefix``: cut into parts that each recompute their prefix), and
``PartGraph`` what a hand-off part keeps of its graph for the backward (``recompute``: nothing,
recompute the part; ``keep``: the graphs of the parts on the depth-first stack).
"""

from __future__ import annotations

import dataclasses
import typing
from enum import StrEnum
from typing import Any, Self


class Mode(StrEnum):
    """A mode: a str whose choices are the members' values."""

    def __repr__(self) -> str:
        return repr(self.value)

    @classmethod
    def choices(cls) -> tuple[str, ...]:
        return tuple(m.value for m in cls)

    @classmethod
    def of(
        cls, value: Any, field: str, error: type[Exception] = ValueError, prefix: str = ""
    ) -> Self:
        """``value`` as a member of this mode, or ``error`` naming ``field`` and the choices."""
        try:
            return cls(value)
        except ValueError:
            choices = ", ".join(cls.choices())
            raise error(f"{prefix}{field} {value!r}; expected one of {choices}") from None


def coerce_modes(obj: Any, error: type[Exception] = ValueError, prefix: str = "") -> None:
    """Turn every field of the dataclass ``obj`` typed with a :class:`Mode` (or ``Mode | None``)
    into its member; a value outside the mode raises ``error`` (see :meth:`Mode.of`)."""
    for name, mode in _mode_fields(type(obj)).items():
        value = getattr(obj, name)
        if value is not None:
            # object.__setattr__: frozen dataclasses too
            object.__setattr__(obj, name, mode.of(value, name, error, prefix))


_FIELDS: dict[type, dict[str, type[Mode]]] = {}


def _mode_fields(cls: type) -> dict[str, type[Mode]]:
    """The fields of dataclass ``cls`` typed with a Mode (``Mode`` or ``Mode | None``)."""
    if cls not in _FIELDS:
        hints = typing.get_type_hints(cls)
        found: dict[str, type[Mode]] = {}
        for f in dataclasses.fields(cls):
            hint = hints[f.name]
            args = typing.get_args(hint) or (hint,)
            modes = [a for a in args if isinstance(a, type) and issubclass(a, Mode)]
            if modes:
                found[f.name] = modes[0]
        _FIELDS[cls] = found
    return _FIELDS[cls]


# --------------------------------------------------------------------------------------------
# the objective (trainer.objective.loss, trainer.batch.advantages, trainer.batch)
# --------------------------------------------------------------------------------------------


class Loss(Mode):
    """The objective (trainer.objective.loss); each loss's facts are its :data:`LOSS_FACTS` row."""

    sft = "sft"
    ppo = "ppo"
    grpo = "grpo"
    gspo = "gspo"


#: the default eps of the clip range [1 - clip_eps, 1 + clip_eps_high] of the clipped losses
CLIP_EPS = 0.2


@dataclasses.dataclass(frozen=True)
class LossFacts:
    """What the trainer, the reference and the CLI know of a loss without computing it: every
    question outside the objective's own module asks this row, never the loss's name."""

    #: trains on advantages: every trained sequence needs an advantage (or its group's rewards),
    #: the build is scanned for unrewarded trees, the RL metrics and clip range apply; False:
    #: the negative log-likelihood, weighted by the norm's coefficients
    rl: bool
    #: the importance ratio is one per sequence (GSPO's length-normalised sequence ratio), so the
    #: advantage is per sequence and a tree cut into parts needs a pre-pass that gathers each
    #: sequence's log-prob; False: one ratio per target (a plain sum over targets)
    sequence_ratio: bool = False
    #: ``--cp > 1`` may split a sequence's targets over ranks (the loss is a sum of per-target
    #: terms, each computed where its target lies)
    context_parallel: bool = True


#: one row per member of :class:`Loss`
LOSS_FACTS: dict[str, LossFacts] = {
    Loss.sft: LossFacts(rl=False),
    Loss.ppo: LossFacts(rl=True),
    Loss.grpo: LossFacts(rl=True),
    Loss.gspo: LossFacts(rl=True, sequence_ratio=True, context_parallel=False),
}


class Norm(Mode):
    """How the loss is aggregated over the step (trainer.batch)."""

    sum = "sum"
    sequence_mean = "sequence-mean"
    token_mean = "token-mean"
    trajectory_mean = "trajectory-mean"


class AdvNorm(Mode):
    """How rewards become advantages over a group's trajectories."""

    grpo = "grpo"
    dr_grpo = "dr-grpo"
    rloo = "rloo"
    none = "none"


class Unrewarded(Mode):
    """What an RL loss does with trees that have no advantage and no reward for some trajectory
    (trainer.data.rewarded): refuse the run, or skip those trees, counted in the log and the
    summary."""

    refuse = "refuse"
    skip = "skip"


class KlEstimator(Mode):
    k3 = "k3"
    k1 = "k1"


# --------------------------------------------------------------------------------------------
# how a run executes
# --------------------------------------------------------------------------------------------


class Layout(Mode):
    """tree (packed tries) or linear (every sequence on its own: the baseline)."""

    tree = "tree"
    linear = "linear"


class Attn(Mode):
    """The attention backend; ``auto`` picks one by device and size
    (:func:`~treeprep.trainer.attention.backends.choose_backend`). Each backend's facts are its
    :data:`ATTN_FACTS` row, its run function its ``treeprep.trainer.attention.BACKENDS`` row."""

    auto = "auto"
    dense = "dense"
    nodes = "nodes"
    flex = "flex"
    flash = "flash"


@dataclasses.dataclass(frozen=True)
class AttnFacts:
    """What the trainer and the memory model know of an attention backend, without torch (the
    trainer's ``Backend`` record adds the run function and the availability check)."""

    #: device types it runs forward and backward on
    devices: tuple[str, ...]
    #: device types it runs the forward on only (no backward there)
    forward_devices: tuple[str, ...] = ()
    #: attends the handed-over prefix where it lies, segment by segment or streamed from host
    #: stores (``stores="host"`` needs it); False: attends one joined [prefix; own] copy, which
    #: autograd keeps for the backward
    reads_prefix_in_place: bool = False
    #: holds a [T, P+T] matrix per call (the mask, and the scores on SDPA's math path), which the
    #: memory model does not count
    keeps_scores: bool = False
    #: computes in the inputs' dtype, float64 included (False: in bf16, casting back)
    float64: bool = True


#: one row per backend (every member of :class:`Attn` but ``auto``)
ATTN_FACTS: dict[str, AttnFacts] = {
    Attn.dense: AttnFacts(devices=("cpu", "cuda"), keeps_scores=True),
    Attn.nodes: AttnFacts(devices=("cpu", "cuda"), reads_prefix_in_place=True),
    Attn.flex: AttnFacts(devices=("cuda",), forward_devices=("cpu",)),
    Attn.flash: AttnFacts(devices=("cuda",), float64=False),
}


def reads_prefix_in_place(attn: str) -> bool:
    """Whether backend ``attn`` reads the prefix in place (``auto`` does: it picks ``nodes`` for
    a part with a prefix under host stores); an unknown name does not."""
    facts = ATTN_FACTS.get(attn)
    return attn == Attn.auto or (facts is not None and facts.reads_prefix_in_place)


class Optimizer(Mode):
    adamw = "adamw"
    sgd = "sgd"


class LrSchedule(Mode):
    """The learning rate's shape after the linear warmup: cosine or linear down to
    ``lr * min_lr_ratio`` at the last step, or constant at ``lr``."""

    cosine = "cosine"
    linear = "linear"
    constant = "constant"


class Precision(Mode):
    """auto: bf16 autocast on CUDA, float32 on CPU; float16: fp16 autocast with a grad scaler,
    for CUDA cards without bf16; float64 for verification runs."""

    auto = "auto"
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"
    float64 = "float64"


class Parallel(Mode):
    ddp = "ddp"
    fsdp = "fsdp"


class Cut(Mode):
    """How a tree larger than the budget runs: one slot of hand-off parts, or cut into parts
    that each recompute their prefix (every root-to-leaf path must then fit the budget)."""

    handoff = "handoff"
    prefix = "prefix"


class PartGraph(Mode):
    """What a hand-off part keeps of its graph: recompute the part for its backward (bounded
    memory), or keep the graphs of the parts on the depth-first stack."""

    recompute = "recompute"
    keep = "keep"


class Accumulate(Mode):
    """Gradient accumulators of the handed-over keys and values: the stored value's dtype
    (model), or float32 (bf16 runs)."""

    model = "model"
    float32 = "float32"


class Stores(Mode):
    """Where hand-off parts keep their stored keys and values and their gradient accumulators:
    in device memory (gpu), in a host pool (host: pinned on CUDA, streamed to the device a
    window at a time), or host where the stores would not fit the device (auto)."""

    gpu = "gpu"
    host = "host"
    auto = "auto"


class Head(Mode):
    """Where the FLOP estimate runs the LM head: on the trained targets, or every fed token."""

    targets = "targets"
    all = "all"


class Engine(Mode):
    """Who runs a build: this machine's process pool, or Ray Data."""

    local = "local"
    ray = "ray"


class Gpu(Mode):
    """The GPU ``train --dry-run`` predicts for (treeprep.memory.GPUS)."""

    h100 = "h100"
    h200 = "h200"


class Redact(Mode):
    """What a build redacts before rendering: nothing, or secrets (API keys, tokens, private
    keys) found by detect-secrets (the ``redact`` extra)."""

    off = "off"
    secrets = "secrets"


class ReasoningMerge(Mode):
    """How a build fits turns that carry text, reasoning and tool calls together into a template
    that takes only some of them (gpt-oss): leave them (the template's error rejects the call),
    drop the reasoning of history turns (a completion keeps what the model said), or fold the text
    into the reasoning (analysis), completion included."""

    off = "off"
    drop = "drop"
    fold = "fold"


class Server(Mode):
    """The inference server that served the logged calls: how it hands a message of several text
    parts to the chat template (:mod:`treeprep.render.text_parts`): vLLM joins them with a
    newline, SGLang with a space, each unless the template loops over the parts itself; llama.cpp
    with a newline unless the template renders only parts."""

    vllm = "vllm"
    sglang = "sglang"
    llama_cpp = "llama.cpp"


class Harmony(Mode):
    """The Harmony library vLLM rendered gpt-oss's prompts with (``--server vllm``): oss-harmony
    from vLLM 0.31 on, openai-harmony before. They put a tool result's recipient in different
    places of its header (:mod:`treeprep.render.harmony_headers`)."""

    oss = "oss-harmony"
    openai = "openai-harmony"


class DisabledThinking(Mode):
    """The effort vLLM's Messages endpoint sends for an Anthropic request that turns thinking off
    (``--anthropic-disabled-thinking-effort``, 0.34): ``auto`` probes the template for it
    (``none`` unless the template ignores it, then ``low``), the others are sent as they are."""

    auto = "auto"
    none = "none"
    low = "low"
    medium = "medium"
    high = "high"
    xhigh = "xhigh"
    max = "max"


class ParallelCalls(Mode):
    """How a build renders an assistant turn of several tool calls: as logged (a template that
    shows only the first, gpt-oss's, rejects the call), or split into consecutive single-call
    turns (:mod:`treeprep.render.parallel`)."""

    off = "off"
    split_turns = "split"  # (a member named split would hide str.split)


class ExportFormat(Mode):
    """What ``treeprep export`` writes: JSON lines, a Parquet file, or a folder that
    ``datasets.load_from_disk`` opens."""

    jsonl = "jsonl"
    parquet = "parquet"
    hf = "hf"


class ReportTo(Mode):
    """An experiment tracker ``train --report-to`` sends each step's metrics to (an optional
    extra of the same name: ``pip install -e ".[wandb]"`` in a checkout)."""

    tensorboard = "tensorboard"
    wandb = "wandb"
    mlflow = "mlflow"
    trackio = "trackio"
