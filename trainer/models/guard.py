"""The guard before any training: a model that treeprep cannot train exactly is refused.

Two checks, both cheap, made in the mode training runs in (:func:`guard_model` sets it first:
transformers 5.25 re-kernelizes on ``train()``/``eval()``, and a probe taken in another mode cannot
see what the switch removes):

* **Structure.** Every module whose class name marks it as a token mixer (attention, linear
  attention, state-space, convolution mixers, recurrences) must be one that
  :data:`~treeprep.trainer.models.families.HANDLED_MIXERS` lists: attention layers that go through
  transformers' attention interface (which treeprep replaces) or linear-attention layers that
  :mod:`.hybrid` runs node by node. An unknown mixer is refused by name, whatever the probe says:
  it may be exact on a small tree by luck (say, a window longer than the probe). Every
  linear-attention layer must still run :mod:`.hybrid`'s per-node forward, with transformers' hub
  kernels off; otherwise the refusal names the layer and the installed releases.
* **Probe.** A small random tree (tens of tokens, a few branches, the model's own vocabulary) runs
  once in the tree layout and once per sequence alone; every decoder layer's output on every
  sequence's tokens must agree to ``tol`` (relative L2, float32 rounding is about 1e-7), with every
  ``nn.Dropout`` in eval mode for the two forwards (dropout is random: LoRA's ``--lora-dropout``
  would make any two forwards differ; the rest of the model keeps the training mode). The
  refusal names the layers that disagree, first one first. One forward each, no backward: well
  under a second for a 0.6B model on a GPU. A forward that fails inside an interface treeprep
  implements (the attention function, the linear-attention cache) is refused naming the installed
  transformers and torch (:mod:`.upstream`), never with an ``AttributeError``.

The linear reference runs the same code on one-path trees; ``treeprep verify`` and the tests
compare against plain transformers and against gradients, which the probe does not replace.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import torch

from treeprep.errors import ModelRefused
from treeprep.trainer.models.families import HANDLED_MIXERS
from treeprep.trainer.models.hybrid import hub_kernels_on, linear_layers, runs_tree_forward
from treeprep.trainer.models.upstream import upstream_refusal, upstream_versions

_MIXER = re.compile(r"(Attention|Attn|DeltaNet|Mamba|Mixer|SSM|Ssm|Rwkv|RWKV|Retention|Hyena)")
#: relative L2 difference per layer above which the probe refuses
PROBE_TOL = 1e-5


@dataclass
class ProbeReport:
    """Per decoder layer, the relative L2 difference tree vs linear (worst over sequences)."""

    tokens_tree: int
    tokens_linear: int
    layers: list[tuple[str, float]] = field(default_factory=list)
    tol: float = PROBE_TOL

    @property
    def failing(self) -> list[tuple[str, float]]:
        return [(n, d) for n, d in self.layers if not d <= self.tol]

    @property
    def worst(self) -> float:
        return max((d for _, d in self.layers), default=0.0)

    @property
    def ok(self) -> bool:
        return not self.failing


def unhandled_mixers(model: torch.nn.Module) -> list[str]:
    """Names of token-mixing modules that treeprep does not handle (inside handled ones ignored)."""
    bad: list[str] = []
    handled_prefixes: list[str] = []
    for name, mod in model.named_modules():
        cls = type(mod).__name__
        if any(name.startswith(p + ".") for p in handled_prefixes):
            continue
        if cls in HANDLED_MIXERS:
            handled_prefixes.append(name)
            continue
        if _MIXER.search(cls) and not isinstance(mod, torch.nn.Linear | torch.nn.Embedding):
            bad.append(f"{name} ({cls})")
    return bad


def check_structure(model: torch.nn.Module) -> None:
    """Refuse a model with a token mixer treeprep does not handle, or not running tree attention."""
    bad = unhandled_mixers(model)
    if bad:
        shown = ", ".join(bad[:4]) + (f" and {len(bad) - 4} more" if len(bad) > 4 else "")
        raise ModelRefused(
            f"model refused: token-mixing modules treeprep does not handle: {shown}. Supported "
            "mixers are listed in treeprep/trainer/models/families.py"
        )
    impl = getattr(model.config, "_attn_implementation", None)
    if any(HANDLED_MIXERS[type(m).__name__] == "attention" for m in _mixers(model)) and (
        impl != "treeprep"
    ):
        raise ModelRefused(f"model refused: attention runs {impl!r}, not tree attention")
    check_linear_forwards(model)


def check_linear_forwards(model: torch.nn.Module) -> None:
    """Refuse a hybrid model whose linear-attention layers no longer run the per-node forward
    (something replaced it after loading, such as a re-kernelizing ``train()``), or that has
    transformers' hub kernels on (they replace functions the layer hands its cache to)."""
    layers = linear_layers(model)
    if not layers:
        return
    mode = "training" if model.training else "eval"
    if hub_kernels_on(model):
        raise ModelRefused(
            f"model refused: transformers' hub kernels are on ({upstream_versions()}); they "
            "replace the linear-attention code treeprep runs per node. Load the model with "
            "treeprep.trainer.models.load_model (use_kernels=False)"
        )
    names = {id(m): n for n, m in model.named_modules()}
    lost = [f"{names[id(m)]} ({type(m).__name__})" for m in layers if not runs_tree_forward(m)]
    if lost:
        shown = ", ".join(lost[:4]) + (f" and {len(lost) - 4} more" if len(lost) > 4 else "")
        raise ModelRefused(
            f"model refused: in {mode} mode under {upstream_versions()}, linear-attention layers "
            f"no longer run treeprep's per-node forward: {shown}. Something replaced it after "
            "loading (an upstream release that re-kernelizes on train()/eval()?); training would "
            "scan siblings as one sequence"
        )


def check_part_checkpointing(model: torch.nn.Module) -> None:
    """Refuse hand-off parts under reentrant activation checkpointing.

    A reentrant checkpoint runs the layer's forward without a graph and rebuilds it inside the
    backward, so a part's own keys and values have no gradient path when its descendants'
    gradients must join them: those gradients were dropped (tiny-qwen3, parts of 5 against the
    whole tree: 0.79 relative error). Non-reentrant checkpointing (transformers' default, and
    what ``treeprep train`` turns on) is exact. A checkpoint function without ``use_reentrant``
    takes torch's default, reentrant, and is refused too."""
    for name, mod in model.named_modules():
        fn = getattr(mod, "_gradient_checkpointing_func", None)
        if fn is None or not (getattr(mod, "gradient_checkpointing", False) and mod.training):
            continue  # (transformers checkpoints in training mode only)
        if getattr(fn, "keywords", {}).get("use_reentrant", True) is not False:
            raise ModelRefused(
                f"model refused: reentrant activation checkpointing (in {name or 'the root'}) "
                "loses the gradients hand-off parts hand back; enable it with "
                "gradient_checkpointing_kwargs={'use_reentrant': False}"
            )


def _mixers(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in model.modules() if type(m).__name__ in HANDLED_MIXERS]


def _probe_rows(vocab: int, seed: int) -> list[dict]:
    from treeprep.sequence import Sequence
    from treeprep.trie import build_tree

    rng = np.random.default_rng(seed)
    root = rng.integers(0, vocab, 10)
    a = np.concatenate([root, rng.integers(0, vocab, 8)])
    seqs = [
        np.concatenate([root[:6], rng.integers(0, vocab, 7)]),  # branch inside the root node
        a,
        np.concatenate([a, rng.integers(0, vocab, 6)]),  # a chain continuing a
        np.concatenate([a[:14], rng.integers(0, vocab, 5)]),  # a second child mid-way
    ]
    tree = build_tree([Sequence("probe", s, [(1, len(s))]) for s in seqs])
    return [tree.to_row()]


def _decoder_layers(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    dec = cast(Any, model).get_decoder()  # nn.Module's stub: Tensor | Module
    layers = getattr(dec, "layers", None)
    if layers is None:
        raise ModelRefused("model refused: its decoder has no .layers to probe")
    out = []
    for i, layer in enumerate(layers):
        kinds = sorted({HANDLED_MIXERS.get(type(m).__name__, "") for m in layer.modules()} - {""})
        out.append((f"layers.{i} ({'+'.join(kinds) or 'no mixer'})", layer))
    return out


def _layer_outputs(model: torch.nn.Module, batch: object) -> list[torch.Tensor]:
    from treeprep.trainer.models.run import decoder_hidden

    layers = _decoder_layers(model)
    got: list[torch.Tensor] = []

    def hook(mod: torch.nn.Module, args: object, out: object) -> None:
        t = out[0] if isinstance(out, tuple) else out
        assert isinstance(t, torch.Tensor)
        got.append(t[0].detach().float())

    hs = [layer.register_forward_hook(hook) for _, layer in layers]
    try:
        with torch.no_grad():
            dev = batch.device  # type: ignore[attr-defined]
            decoder_hidden(model, batch, "dense" if dev.type == "cpu" else None)
    except (AttributeError, TypeError) as e:
        raise upstream_refusal(
            "the model's tree forward (the attention function or linear-attention cache "
            "treeprep implements)",
            e,
        ) from None
    finally:
        for h in hs:
            h.remove()
    return got


def probe(model: torch.nn.Module, *, seed: int = 0, tol: float = PROBE_TOL) -> ProbeReport:
    """Run the probe (see the module docstring) in the model's current mode; returns the
    per-layer report (raises only :class:`ModelRefused`, for a forward that fails upstream)."""
    from treeprep.trainer.batch.tree_batch import TreeBatch

    dev = next(model.parameters()).device
    # nn.Module's __getattr__ stub types a transformers model's attributes as Tensor | Module
    vocab = int(cast(Any, model).config.vocab_size)
    rows = _probe_rows(vocab, seed)
    tree = TreeBatch.from_trees(rows, device=dev)
    lin = TreeBatch.from_trees(rows, layout="linear", device=dev)
    drops = [m for m in model.modules() if isinstance(m, torch.nn.Dropout) and m.training]
    for m in drops:
        m.eval()
    try:
        t_out = _layer_outputs(model, tree)
        l_out = _layer_outputs(model, lin)
    finally:
        for m in drops:
            m.train()
    idx = _linear_to_tree(tree, lin)
    names = [n for n, _ in _decoder_layers(model)]
    rep = ProbeReport(tree.num_tokens, lin.num_tokens, tol=tol)
    for name, a, b in zip(names, t_out, l_out, strict=True):
        ta = a.index_select(0, idx)
        d = float((ta - b).double().norm() / b.double().norm().clamp_min(1e-30))
        rep.layers.append((name, d))
    return rep


def _linear_to_tree(tree: object, lin: object) -> torch.Tensor:
    """For every token of the linear layout, its row in the tree layout (same ids, same depths:
    the linear layout's sequences are root-to-node paths of the tree)."""
    tpar = tree.node_parent.tolist()  # type: ignore[attr-defined]
    ts, tl = tree.node_start.tolist(), tree.node_length.tolist()  # type: ignore[attr-defined]
    ids = tree.input_ids.tolist()  # type: ignore[attr-defined]
    # each linear sequence is one root-to-node path: walk the tree by token ids
    children: dict[int, list[int]] = {}
    roots: list[int] = []
    for n, p in enumerate(tpar):
        (children.setdefault(p, []) if p >= 0 else roots).append(n)
    out: list[int] = []
    lids = lin.input_ids.tolist()  # type: ignore[attr-defined]
    lpos = lin.position_ids.tolist()  # type: ignore[attr-defined]
    i = 0
    while i < len(lids):
        assert lpos[i] == 0
        cands, node, k = roots, -1, 0
        while i < len(lids) and (lpos[i] != 0 or node < 0):
            if node < 0 or k == tl[node]:
                nxt = [c for c in cands if ids[ts[c]] == lids[i]]
                if not nxt:
                    raise RuntimeError("probe: linear sequence is not a path of the tree")
                node, k = nxt[0], 0
                cands = children.get(node, [])
            assert ids[ts[node] + k] == lids[i]
            out.append(ts[node] + k)
            k += 1
            i += 1
    return torch.as_tensor(out, device=tree.input_ids.device)  # type: ignore[attr-defined]


def guard_model(
    model: torch.nn.Module, *, run_probe: bool = True, seed: int = 0, training: bool = True
) -> ProbeReport | None:
    """The guard: puts ``model`` in the mode it will run in (``training``; it stays there), then
    structure always, then the probe unless ``run_probe`` is False. Raises :class:`ModelRefused`
    naming the unhandled modules, the layers that lost their tree forward, the layers that
    disagree, or the releases whose interface changed."""
    model.train(training)
    check_structure(model)
    if not run_probe:
        return None
    rep = probe(model, seed=seed)
    if not rep.ok:
        bad = ", ".join(f"{n} rel {d:.1e}" for n, d in rep.failing[:6])
        raise ModelRefused(
            f"model refused: tree and linear layouts disagree (tolerance {rep.tol:g}); first "
            f"disagreeing layers: {bad}. Training it on trees would give wrong gradients"
        )
    return rep
