"""The trained model out of a run: a Hugging Face folder that loads from any working directory.

A run's checkpoints (``RUN/checkpoints/step-N/``) are made for resuming and rotated by ``--keep``;
their ``model/`` folder has no tokenizer for a preset run, and a LoRA adapter there names its base
as the run spelled it. :func:`export_model` writes a folder that stands alone:

- **full runs**: the checkpoint's weights (safetensors, hard-linked where the file system allows,
  else copied), ``config.json``, ``generation_config.json``, and the tokenizer with its chat
  template: the model folder's own for a run on a model folder, the build's for a preset (the
  built-in byte tokenizer is written as a ``tokenizer.json`` folder), or ``tokenizer`` when given;
- **LoRA runs**: the peft adapter (``task_type`` ``CAUSAL_LM``) and the tokenizer. Its
  ``base_model_name_or_path`` names the base so that it survives a move: a folder of the Hugging
  Face hub cache by its hub id and revision, another folder by its absolute path, and a preset's
  random base, which exists nowhere else, as ``base`` (written into ``DIR/base``, and hard-linked
  beside the adapter: ``DIR`` is also a model folder with an embedded adapter). peft resolves
  that relative name against the working directory, not against ``DIR``, so such an export loads
  from anywhere with ``AutoModelForCausalLM.from_pretrained(DIR)`` (transformers loads the base
  that ``DIR`` holds and the adapter on it) or ``PeftModel.from_pretrained(
  AutoModelForCausalLM.from_pretrained("DIR/base"), "DIR")``, and with
  ``AutoPeftModelForCausalLM.from_pretrained(".")`` run inside ``DIR``; the other two load from
  anywhere with ``AutoPeftModelForCausalLM.from_pretrained(DIR)``;
- **merged** (``merge=True``, LoRA runs only): the base with the adapter merged into its weights
  (peft's ``merge_and_unload``), a full folder like the first case.

The loop writes ``RUN/final/`` this way at the end of every run that reaches its last step
(``merge_lora`` merges it); ``treeprep export-model RUN [--step N] -o DIR [--merge]`` writes any
checkpoint of a run. The folder is written under a temporary name and renamed; an existing ``DIR``
is replaced only when it is an earlier export (it holds :data:`MARKER`), never another folder.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any, cast

import torch

from treeprep.atomic import commit, make_dirs, writing
from treeprep.errors import TrainingError
from treeprep.trainer.models.presets import PRESETS
from treeprep.trainer.run import checkpoint as ckpt_mod

#: written last into every export: what it was made from (and the sign that DIR may be replaced)
MARKER = "treeprep_export.json"
#: the folder of a run's final export
FINAL_DIR = "final"
_ADAPTER_CONFIG = "adapter_config.json"
#: where a LoRA export of a preset run holds its base (random weights that exist nowhere else),
#: named by the adapter relative to the export, so the folder can move
BASE_DIR = "base"


def pick_checkpoint(run_dir: str, step: int | None = None) -> ckpt_mod.Checkpoint:
    """The run's checkpoint of ``step`` (default: its newest whole one), opened and verified."""
    found = ckpt_mod.list_checkpoints(run_dir)
    if not found:
        raise TrainingError(f"{run_dir}: no checkpoint to export (is it a run folder?)")
    if step is None:
        return ckpt_mod.open_checkpoint(found[-1][1])
    by_step = dict(found)
    if step not in by_step:
        have = ", ".join(str(s) for s, _ in found)
        raise TrainingError(f"{run_dir}: no checkpoint of step {step} (kept: {have})")
    return ckpt_mod.open_checkpoint(by_step[step])


def export_model(
    run_dir: str,
    out: str,
    *,
    step: int | None = None,
    merge: bool = False,
    tokenizer: str | None = None,
) -> str:
    """Write the model of ``run_dir``'s checkpoint ``step`` (default: the newest) to ``out`` as a
    standalone Hugging Face folder (module docstring); returns ``out``."""
    ckpt = pick_checkpoint(run_dir, step)
    cfg = ckpt.state.get("config") or {}
    lora = bool(cfg.get("lora_r"))
    if merge and not lora:
        raise TrainingError(f"{ckpt.path}: --merge is for LoRA runs; this run trained every weight")
    _check_target(out)
    tmp = f"{out.rstrip(os.sep)}.tmp-export"
    if os.path.exists(tmp):
        shutil.rmtree(tmp)
    try:
        with writing(out):
            make_dirs(tmp)
            if merge:
                _write_merged(ckpt, tmp)
            elif lora:
                _write_adapter(ckpt, cfg, tmp)
            else:
                _link_model_files(ckpt, tmp)
            _write_tokenizer(ckpt, cfg, tmp, tokenizer)
            _write_generation_config(tmp)
            marker = {
                "run": os.path.abspath(run_dir),
                "step": ckpt.step,
                "checkpoint": os.path.abspath(ckpt.path),
                "lora": lora,
                "merged": merge,
            }
            with open(os.path.join(tmp, MARKER), "w", encoding="utf-8") as f:
                json.dump(marker, f, indent=2)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _replace(tmp, out)
    return out


def _check_target(out: str) -> None:
    """``out`` may be new, empty, or an earlier export; anything else is refused."""
    if not os.path.exists(out):
        return
    if not os.path.isdir(out):
        raise TrainingError(f"{out}: exists and is not a folder; export elsewhere")
    if os.listdir(out) and not os.path.isfile(os.path.join(out, MARKER)):
        raise TrainingError(
            f"{out}: a folder that is not an earlier export (no {MARKER}); export into a new one"
        )


def _replace(tmp: str, out: str) -> None:
    """Rename ``tmp`` to ``out``; an earlier export at ``out`` goes once the new one is there."""
    old = f"{out.rstrip(os.sep)}.old-export"
    if os.path.exists(out):
        if os.path.exists(old):
            shutil.rmtree(old)
        os.replace(out, old)
    commit(tmp, out)
    if os.path.exists(old):
        shutil.rmtree(old)


def _link(src: str, dst: str) -> None:
    """A hard link (no second copy of the weights on disk), else a copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _link_model_files(ckpt: ckpt_mod.Checkpoint, tmp: str) -> None:
    """Every file of the checkpoint's ``model/`` folder (each one state.json lists)."""
    for rel in sorted(ckpt.state.get("files", {})):
        if rel.startswith("model/") and rel.count("/") == 1:
            _link(ckpt.listed(rel), os.path.join(tmp, rel.removeprefix("model/")))


def _base_spec(cfg: dict[str, Any], ckpt: ckpt_mod.Checkpoint) -> str:
    """The run's base model: a preset name or the absolute path of its folder."""
    spec = str(cfg.get("model", ""))
    if spec in PRESETS:
        return spec
    if not os.path.isdir(spec):
        raise TrainingError(
            f"{ckpt.path}: the run's base model {spec!r} is not a folder from here; export from "
            "the folder the run started in, or with the model folder in place"
        )
    return os.path.abspath(spec)


def _load_base(cfg: dict[str, Any], ckpt: ckpt_mod.Checkpoint) -> torch.nn.Module:
    """The run's base model as it trained it (a preset with the run's seed and vocabulary)."""
    from treeprep.trainer.data.reader import BuildReader, model_for_build
    from treeprep.trainer.models.load import load_model

    spec = _base_spec(cfg, ckpt)
    if spec not in PRESETS:
        return load_model(spec, attn="dense")
    reader = BuildReader(str(cfg.get("data", "")))
    return cast(
        torch.nn.Module,
        model_for_build(
            reader,
            spec,
            attn="dense",
            seed=int(cfg.get("seed", 0)),
            vocab_size=cfg.get("vocab_size"),
        ),  # fmt: skip
    )


def trained_model(ckpt: ckpt_mod.Checkpoint) -> torch.nn.Module:
    """The checkpoint's model as the run trained it (LoRA: the peft model with its adapter)."""
    from treeprep.trainer.models.lora import apply_lora

    cfg = ckpt.state.get("config") or {}
    lm = _load_base(cfg, ckpt)
    if cfg.get("lora_r"):
        lm = apply_lora(lm, r=int(cfg["lora_r"]), alpha=cfg.get("lora_alpha"),
                        targets=cfg.get("lora_targets"),
                        dropout=float(cfg.get("lora_dropout") or 0.0))  # fmt: skip
    ckpt_mod.load_model_weights(lm, ckpt)
    return lm


def _write_merged(ckpt: ckpt_mod.Checkpoint, tmp: str) -> None:
    merged = cast(Any, trained_model(ckpt)).merge_and_unload()
    ckpt_mod.save_plain(merged, tmp)


def _write_adapter(ckpt: ckpt_mod.Checkpoint, cfg: dict[str, Any], tmp: str) -> None:
    """The adapter files, naming the base so that the folder can move (:func:`_base_name`; a
    preset's base written into it), for ``AutoPeftModelForCausalLM`` (``task_type``)."""
    _link_model_files(ckpt, tmp)
    spec = _base_spec(cfg, ckpt)
    if spec in PRESETS:
        base = os.path.join(tmp, BASE_DIR)
        ckpt_mod.save_plain(_load_base(cfg, ckpt), base)
        for name in sorted(os.listdir(base)):  # the base beside the adapter too (hard links)
            _link(os.path.join(base, name), os.path.join(tmp, name))
        spec = BASE_DIR
    path = os.path.join(tmp, _ADAPTER_CONFIG)
    with open(path, encoding="utf-8") as f:
        adapter = json.load(f)
    adapter["base_model_name_or_path"], revision = _base_name(spec)
    if revision is not None:
        adapter["revision"] = revision
    adapter["task_type"] = "CAUSAL_LM"
    os.remove(path)  # a hard link to the checkpoint's file: never written through
    with open(path, "w", encoding="utf-8") as f:
        json.dump(adapter, f, indent=2)


def _base_name(spec: str) -> tuple[str, str | None]:
    """(``base_model_name_or_path``, ``revision``) of a base: a folder of the Hugging Face hub
    cache (``.../models--ORG--NAME/snapshots/REV``) by its hub id and revision, which resolve
    on any machine; another folder by its absolute path; :data:`BASE_DIR` (a preset's base,
    inside the export) as it is.

    >>> _base_name("/home/u/.cache/huggingface/hub/models--Qwen--Qwen3-0.6B/snapshots/abc1")
    ('Qwen/Qwen3-0.6B', 'abc1')
    >>> _base_name("base")
    ('base', None)
    """
    if spec == BASE_DIR:
        return spec, None
    snapshots, rev = os.path.split(os.path.normpath(spec))
    repo, name = os.path.split(snapshots)
    if name == "snapshots" and os.path.basename(repo).startswith("models--"):
        return os.path.basename(repo).removeprefix("models--").replace("--", "/"), rev
    return spec, None


def _write_tokenizer(
    ckpt: ckpt_mod.Checkpoint, cfg: dict[str, Any], tmp: str, tokenizer: str | None
) -> None:
    """The tokenizer and chat template: ``tokenizer`` when given, else the model folder's (already
    among the checkpoint's files), else the build's."""
    from treeprep.schemas.tokenizer import TOKENIZER_FILES

    if tokenizer is None and os.path.isfile(os.path.join(tmp, "tokenizer.json")):
        return
    source = tokenizer or _build_tokenizer_dir(cfg, ckpt)
    if source is None:
        from treeprep.render.builtin import load_builtin

        load_builtin().save_pretrained(tmp)
        return
    if not os.path.isfile(os.path.join(source, "tokenizer.json")):
        raise TrainingError(f"{source}: not a tokenizer folder (no tokenizer.json)")
    for name in TOKENIZER_FILES:
        src, dst = os.path.join(source, name), os.path.join(tmp, name)
        if os.path.isfile(src):
            if os.path.lexists(dst):
                os.remove(dst)  # a hard link to the checkpoint's file: never written through
            shutil.copy2(src, dst)


def _build_tokenizer_dir(cfg: dict[str, Any], ckpt: ckpt_mod.Checkpoint) -> str | None:
    """The folder of the tokenizer the run's build was made with; None for the built-in one."""
    from treeprep.schemas.tokenizer import BUILTIN_NAME as BUILTIN
    from treeprep.trainer.data.reader import BuildReader

    tok = BuildReader(str(cfg.get("data", ""))).manifest.tokenizer
    if tok.name == BUILTIN:
        return None
    if tok.path and os.path.isdir(tok.path):
        return tok.path
    raise TrainingError(
        f"{ckpt.path}: the build's tokenizer {tok.name!r} is not at {tok.path!r} any more; give "
        "its folder with --tokenizer"
    )


def _write_generation_config(tmp: str) -> None:
    """``generation_config.json`` from the model's config where the folder has none."""
    if os.path.isfile(os.path.join(tmp, "generation_config.json")):
        return
    if not os.path.isfile(os.path.join(tmp, "config.json")):
        return  # a LoRA adapter: generation follows its base
    from transformers import AutoConfig, GenerationConfig

    GenerationConfig.from_model_config(AutoConfig.from_pretrained(tmp)).save_pretrained(tmp)
