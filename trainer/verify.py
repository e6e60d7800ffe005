"""The tree's gradients against a per-sequence reference: the check behind ``treeprep verify``.

The same model and trees, run twice: once as treeprep trains them (the packed tries, the restored
weights of :mod:`treeprep.trainer.objective`; with ``budget``, as hand-off parts), and once as
plain transformers would, by :mod:`treeprep.trainer.reference`: every sequence alone through the
model's own forward and causal mask, its token losses from the plain next-token shift, combined
with the normalizer and advantages of the loss mode written from their definitions. The two
share no objective code, so the check covers the objective (a wrong normalizer, advantage sum or
clip coefficient) as well as the layout (a tree-mask or part-prefix off-by-one). The report keeps
the names ``linear`` for the reference side (``loss_linear``, ``tokens_linear``: what a
linearizing trainer feeds). The tree's loss must equal the reference's and every parameter's
gradient must match. Differences are reported per parameter group (embeddings, each layer's
attention, MLP and norms, the final norm, the LM head) as the worst element-wise absolute
difference and the relative L2 difference ``||g_tree - g_lin|| / ||g_lin||``; the check passes
when every group's relative difference is at most ``tol`` (1e-5 in float32 is a real test:
measured differences are about 3e-7 to 9e-7, and a wrong weight on one token shows up well above
it).

Two float32 results can differ by more than ``tol`` without treeprep being wrong: the reference
runs the model's own per-sequence code, and some of it rounds far more than 1e-5 (transformers'
chunked gated-delta-rule of Qwen3.5 rounds at 1e-5 to 3e-3 relative with larger-initialized
weights). So when a float32 check goes over ``tol``, the truth decides: a float64 copy of the
model runs the reference, and each group's tree and reference float32 gradients are measured
against it (``rel_tree64``, ``rel_lin64``, the same relative L2). The group still passes when the
tree is within ``tol`` of float64 or no further from it than the reference is; it fails only when
treeprep is worse than the reference, and the report says so (:attr:`VerifyReport.reason`). The
float64 run costs about one more forward and backward in float64 and a copy of the weights, and
runs only when needed (``reference64=True`` always runs it).

A float64 model (``--precision float64``), and the float64 reference, run in float64 throughout:
transformers casts to float32 in RMSNorm, the rotary angles and Qwen3.5's gated delta rule
whatever the dtype, and MoE experts through grouped_mm, which has no float64 kernel;
:func:`~treeprep.trainer.models.float64.keep_float64` keeps those casts in float64 and runs the
experts through their eager loop (the same hooks that ``train --precision float64`` runs
under), so tree and reference agree to float64 rounding (about 1e-15, MoE presets included), and
the report names the module classes it patched (:attr:`VerifyReport.float64_kept`).

:func:`verify_build` is the whole command: a :class:`VerifyConfig` names a build, a model and the
objective; it reads the first ``groups`` trees of the build (skipping, and naming, those whose
linear layout is over ``max_tokens``), loads the model checked against the build
(:func:`~treeprep.trainer.data.reader.model_for_build`, the same check as training: a model folder
of another tokenizer is refused) and returns the :class:`VerifyReport` with what it skipped.
"""

from __future__ import annotations

import contextlib
import copy
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from treeprep.errors import TreeprepError
from treeprep.modes import Attn, PartGraph, coerce_modes
from treeprep.trainer.batch.tree_batch import TreeBatch
from treeprep.trainer.config import LossConfig
from treeprep.trainer.data.reader import BuildReader, model_for_build
from treeprep.trainer.models.float64 import keep_float64
from treeprep.trainer.objective.loss import tree_loss
from treeprep.trainer.parts.schedule import run_parts
from treeprep.trainer.reference import reference_gradients


@dataclass
class GroupDiff:
    name: str
    numel: int
    max_abs: float
    rel: float
    grad_norm: float
    #: relative L2 distance of the tree's (and of the linear layout's) gradient to a float64 run
    #: of the linear layout; None when no float64 reference ran
    rel_tree64: float | None = None
    rel_lin64: float | None = None

    def passes(self, tol: float) -> bool:
        """Tree and linear agree within ``tol``, or the tree is within ``tol`` of float64, or no
        further from float64 than the linear reference."""
        if self.rel <= tol:
            return True
        if self.rel_tree64 is None or self.rel_lin64 is None:
            return False
        return self.rel_tree64 <= max(tol, self.rel_lin64)


@dataclass
class VerifyReport:
    loss_tree: float
    loss_linear: float
    tokens_tree: int
    tokens_linear: int
    targets_tree: int
    targets_linear: int
    tol: float
    groups: list[GroupDiff] = field(default_factory=list)
    #: the loss of a float64 run of the linear layout; None when none ran
    loss_64: float | None = None
    #: the module classes whose float32 casts a float64 run kept in float64, and the MoE
    #: experts it ran eagerly (``"... (eager)"``)
    #: (:func:`~treeprep.trainer.models.float64.keep_float64`): empty for a float32 model
    float64_kept: list[str] = field(default_factory=list)
    #: the linear loss's terms' absolute values summed (its rounding scale; 0: unknown)
    loss_mass: float = 0.0

    @property
    def worst_rel(self) -> float:
        return max((g.rel for g in self.groups), default=0.0)

    @property
    def worst_abs(self) -> float:
        return max((g.max_abs for g in self.groups), default=0.0)

    @property
    def loss_rel(self) -> float:
        """The losses' difference relative to the loss's magnitude: the sum of its terms'
        absolute values (an RL loss whose terms cancel rounds at that scale, not its own)."""
        scale = max(abs(self.loss_linear), self.loss_mass, 1e-30)
        return abs(self.loss_tree - self.loss_linear) / scale

    def _loss_ok(self) -> bool:
        if self.loss_rel <= self.tol:
            return True
        if self.loss_64 is None:
            return False
        d = max(abs(self.loss_64), self.loss_mass, 1e-30)
        tree, lin = abs(self.loss_tree - self.loss_64) / d, abs(self.loss_linear - self.loss_64) / d
        return tree <= max(self.tol, lin)

    @property
    def ok(self) -> bool:
        return self._loss_ok() and all(g.passes(self.tol) for g in self.groups)

    @property
    def reason(self) -> str:
        """Why the check passed or failed, in one line."""
        bad = [g for g in self.groups if not g.passes(self.tol)]
        over = [g for g in self.groups if g.rel > self.tol]
        if bad and bad[0].rel_tree64 is not None:
            g = max(bad, key=lambda g: g.rel)
            return (
                f"treeprep is worse than the reference: {g.name}'s tree gradient is "
                f"{g.rel_tree64:.2e} from float64, the per-sequence reference's {g.rel_lin64:.2e}"
            )
        if bad or not self._loss_ok():
            what = f"{bad[0].name} differs by {bad[0].rel:.2e}" if bad else "the loss differs"
            return f"tree and linear disagree beyond {self.tol:g}: {what}"
        if over:
            g = max(over, key=lambda g: g.rel)
            return (
                f"tree vs linear is over {self.tol:g} ({g.name} {g.rel:.2e}), but the float32 "
                f"reference is {g.rel_lin64:.2e} from float64 and the tree {g.rel_tree64:.2e}: "
                "the reference's rounding, not a treeprep error"
            )
        return f"every group within {self.tol:g}"

    def to_dict(self) -> dict:
        return {
            "ok": self.ok,
            "tol": self.tol,
            "loss_tree": self.loss_tree,
            "loss_linear": self.loss_linear,
            "loss_rel": self.loss_rel,
            "tokens_tree": self.tokens_tree,
            "tokens_linear": self.tokens_linear,
            "targets_tree": self.targets_tree,
            "targets_linear": self.targets_linear,
            "worst_rel": self.worst_rel,
            "worst_abs": self.worst_abs,
            "loss_64": self.loss_64,
            "float64_kept": self.float64_kept,
            "loss_mass": self.loss_mass,
            "reason": self.reason,
            "groups": [g.__dict__ for g in self.groups],
        }


_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.([a-z_]+)")


def param_group(name: str) -> str:
    """``model.layers.3.self_attn.q_proj.weight`` -> ``layers.3.self_attn``; norms merged."""
    m = _LAYER.search(name)
    if m:
        part = m.group(2)
        if part.endswith("layernorm") or part.endswith("norm"):
            part = "norms"
        return f"layers.{m.group(1)}.{part}"
    parts = [p for p in name.split(".") if p not in ("model", "weight", "bias")]
    return parts[0] if parts else name


def _grads(model: torch.nn.Module, batch: TreeBatch, loss: str, attn: str | None, **kw: Any):
    """The tree layout's loss and gradients (by parameter name)."""
    model.zero_grad(set_to_none=True)
    out = tree_loss(model, batch, loss=loss, attn=attn, **kw)  # type: ignore[arg-type]
    out.loss.backward()
    grads = {}
    for n, p in model.named_parameters():
        grads[n] = torch.zeros_like(p) if p.grad is None else p.grad.detach().clone()
    model.zero_grad(set_to_none=True)
    return float(out.loss.detach()), grads


def _grads_parts(
    model: torch.nn.Module,
    rows: Sequence[Any],
    whole: TreeBatch,
    budget: int,
    mode: str,
    loss: str,
    attn: str | None,
    adv_norm: str,
    stores: str = "gpu",
    **kw: Any,
):
    """The tree layout one tree at a time, every tree over ``budget`` run as hand-off parts
    (their stores where ``stores`` says), with the whole batch's normalizers (so the sum is the
    same loss)."""
    n_tok, n_seq, n_traj = whole.totals()
    dev = whole.device
    model.zero_grad(set_to_none=True)
    total = 0.0
    cfg = LossConfig(loss, **kw)  # type: ignore[arg-type]
    for row in rows:
        b = TreeBatch.from_trees(
            [row],
            norm=whole.norm,  # type: ignore[arg-type]
            total_tokens=n_tok,
            total_sequences=n_seq,
            total_trajectories=n_traj,
            adv_norm=adv_norm,
            device=dev,
        )
        if b.num_tokens > budget:
            out = run_parts(
                model, b, cfg, budget=budget, mode=mode, attn=attn or "auto", stores=stores
            )
            total += float(out.loss)
        else:
            o = tree_loss(model, b, loss=loss, attn=attn, **kw)  # type: ignore[arg-type]
            o.loss.backward()
            total += float(o.loss.detach())
    grads = {}
    for n, p in model.named_parameters():
        grads[n] = torch.zeros_like(p) if p.grad is None else p.grad.detach().clone()
    model.zero_grad(set_to_none=True)
    return total, grads


def verify_gradients(
    model: torch.nn.Module,
    rows: Sequence[Any],
    *,
    loss: str = "sft",
    norm: str = "token-mean",
    adv_norm: str = "grpo",
    attn: str | None = None,
    tol: float = 1e-5,
    budget: int | None = None,
    part_graph: PartGraph | str = PartGraph.recompute,
    reference64: bool | None = None,
    share_prefixes: bool = False,
    stores: str = "gpu",
    **loss_kw: Any,
) -> VerifyReport:
    """Compare the gradients of ``loss`` on ``rows`` in the tree layout with the per-sequence
    reference (:mod:`treeprep.trainer.reference`). With a
    ``budget``, trees larger than it run as hand-off parts (:mod:`treeprep.trainer.parts`),
    each keeping its graph or recomputing it as ``part_graph`` says (recompute or keep).
    ``loss_kw`` are :func:`~treeprep.trainer.objective.loss.tree_loss`'s objective knobs (clip
    range, KL,
    entropy). Differences are measured in float64 whatever the model's dtype. ``reference64``:
    run the float64 reference (module docstring) always (True), never (False), or when a model
    that is not float64 is over ``tol`` (None). ``share_prefixes``: the tree side merges the
    trees' common prefixes into one forest (:mod:`treeprep.pack.share`). ``stores``: where the
    parts keep their stores (:class:`~treeprep.modes.Stores`)."""
    dev = next(model.parameters()).device
    kw: dict[str, Any] = {"norm": norm, "adv_norm": adv_norm, "device": dev}
    tree = TreeBatch.from_trees(rows, layout="tree", share_prefixes=share_prefixes, **kw)
    objective = {"loss": loss, "norm": norm, "adv_norm": adv_norm, **loss_kw}
    is64 = next(model.parameters()).dtype == torch.float64
    kept: set[str] = set()
    with keep_float64(model, kept) if is64 else contextlib.nullcontext():  # float64 throughout
        if budget is not None:
            lt, gt = _grads_parts(
                model, rows, tree, budget, part_graph, loss, attn, adv_norm, stores, **loss_kw
            )
        else:
            lt, gt = _grads(model, tree, loss, attn, **loss_kw)
        ref = reference_gradients(model, rows, **objective)
    rep = VerifyReport(
        loss_tree=lt,
        loss_linear=ref.loss,
        tokens_tree=tree.num_tokens,
        tokens_linear=ref.tokens,
        targets_tree=tree.num_targets,
        targets_linear=ref.targets,
        tol=tol,
        loss_mass=ref.mass,
        float64_kept=sorted(kept),
    )
    diffs = _diffs(gt, ref.grads)
    rep.groups = [
        GroupDiff(name, numel, mx, _rel(d2, n2), n2**0.5) for name, (numel, mx, d2, n2) in diffs
    ]
    if reference64 or (reference64 is None and not is64 and not rep.ok):
        m64 = copy.deepcopy(model).double()
        with keep_float64(m64, set()):
            ref64 = reference_gradients(m64, rows, **objective)
        del m64
        rep.loss_64 = ref64.loss
        to_tree, to_lin = dict(_diffs(gt, ref64.grads)), dict(_diffs(ref.grads, ref64.grads))
        for g in rep.groups:
            g.rel_tree64 = _rel(to_tree[g.name][2], to_tree[g.name][3])
            g.rel_lin64 = _rel(to_lin[g.name][2], to_lin[g.name][3])
    return rep


def _rel(d2: float, n2: float) -> float:
    return (d2**0.5) / (n2**0.5) if n2 > 0 else (0.0 if d2 == 0 else float("inf"))


def _diffs(
    got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]
) -> list[tuple[str, tuple[int, float, float, float]]]:
    """Per parameter group: (elements, worst absolute difference, squared L2 of the difference,
    squared L2 of ``want``), in float64."""
    acc: dict[str, list[float]] = {}
    for n in got:
        a, b = got[n].double(), want[n].double()
        g = acc.setdefault(param_group(n), [0, 0.0, 0.0, 0.0])
        g[0] += a.numel()
        g[1] = max(g[1], float((a - b).abs().max()) if a.numel() else 0.0)
        g[2] += float(((a - b) ** 2).sum())
        g[3] += float((b**2).sum())
    return [(k, (int(v[0]), v[1], v[2], v[3])) for k, v in acc.items()]


# --------------------------------------------------------------------------------------------
# the command: a build, a model, an objective
# --------------------------------------------------------------------------------------------


@dataclass
class VerifyConfig:
    """What ``treeprep verify`` checks (module docstring)."""

    #: the build folder
    build: str
    #: a preset name or a local model folder
    model: str
    #: trees to check, in shard order
    groups: int = 4
    #: the objective: :func:`~treeprep.trainer.objective.loss.tree_loss`'s ``loss``, ``norm``,
    # ``adv_norm``
    #: and knobs (clip range, KL, entropy, chunk), as :func:`verify_gradients` takes them
    objective: dict[str, Any] = field(default_factory=dict)
    #: float32, or float64 (weights, coefficients and loss)
    precision: str = "float32"
    attn: Attn = Attn.auto
    #: the largest relative L2 difference allowed
    tol: float = 1e-5
    #: skip trees whose linear layout has more tokens than this
    max_tokens: int = 65536
    device: str = "cpu"
    #: seed of a preset's random weights
    seed: int = 0
    #: run every tree over this many tokens as hand-off parts (the tree side)
    budget: int | None = None
    #: what a hand-off part keeps of its graph while its descendants run
    part_graph: PartGraph = PartGraph.recompute

    def __post_init__(self) -> None:
        coerce_modes(self, TreeprepError, prefix="--")
        if self.groups < 1:
            raise TreeprepError(f"--groups must be >= 1, got {self.groups}")
        if self.precision not in ("float32", "float64"):
            raise TreeprepError(f"--precision {self.precision!r}: expected float32 or float64")
        if self.budget is not None and self.budget < 1:
            raise TreeprepError(f"--budget must be >= 1, got {self.budget}")


@dataclass
class VerifyRun:
    """What :func:`verify_build` did: the report, the trees checked and those skipped."""

    report: VerifyReport
    trees: list[str]
    skipped: list[str]


def select_rows(reader: BuildReader, groups: int, max_tokens: int) -> tuple[list[dict], list[str]]:
    """The first ``groups`` trees of the build within ``max_tokens`` linear tokens, and the names
    of those skipped on the way."""
    from treeprep.schemas.shard import open_shard, shard_path

    rows: list[dict] = []
    skipped: list[str] = []
    for name in reader.shard_names:
        table = open_shard(shard_path(reader.out_dir, name))
        for i, n in enumerate(table.column("tokens_linear").to_pylist()):
            if len(rows) >= groups:
                return rows, skipped
            row = table.slice(i, 1).to_pylist()[0]
            if n > max_tokens:
                skipped.append(f"{row['group_id']} ({n:,} linear tokens)")
                continue
            rows.append(row)
    return rows, skipped


def verify_build(cfg: VerifyConfig, *, log: Callable[[str], None] | None = None) -> VerifyRun:
    """Verify ``cfg.build`` with ``cfg.model`` (module docstring); ``log`` hears the progress."""
    say = log or (lambda _: None)
    reader = BuildReader(cfg.build)
    rows, skipped = select_rows(reader, cfg.groups, cfg.max_tokens)
    for s in skipped:
        say(f"skipped {s}: over --max-tokens")
    if not rows:
        raise TreeprepError(
            f"{cfg.build}: no tree within --max-tokens {cfg.max_tokens:,} to verify"
        )
    say(f"loading {cfg.model} ...")
    dtype = torch.float64 if cfg.precision == "float64" else torch.float32
    model = model_for_build(
        reader, cfg.model, dtype=dtype, device=cfg.device, attn=cfg.attn, seed=cfg.seed
    )
    o = cfg.objective
    split = "" if cfg.budget is None else f", hand-off parts of <= {cfg.budget:,} tokens"
    what = f"{o.get('loss', 'sft')}, {o.get('norm', 'token-mean')}, attention {cfg.attn}"
    say(f"verifying {len(rows)} trees: {what}{split} (part graph: {cfg.part_graph}) ...")
    rep = verify_gradients(
        model, rows, attn=cfg.attn, tol=cfg.tol, budget=cfg.budget, part_graph=cfg.part_graph,
        **cfg.objective,
    )  # fmt: skip
    return VerifyRun(rep, [r["group_id"] for r in rows], skipped)
