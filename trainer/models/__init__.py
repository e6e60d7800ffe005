"""Models: presets and families (:mod:`.presets`, :mod:`.families`), loading (:mod:`.load`) and
running over trees (:mod:`.run`), hybrid linear attention (:mod:`.hybrid`) and the guard before
training (:mod:`.guard`), LoRA through peft (:mod:`.lora`).

Supported families are the keys of :data:`FAMILIES`; any decoder-only model whose attention goes
through transformers' ``ALL_ATTENTION_FUNCTIONS`` works the same way.
"""

from treeprep.trainer.models.families import FAMILIES, HANDLED_MIXERS, family_of
from treeprep.trainer.models.guard import ProbeReport, check_structure, guard_model, probe
from treeprep.trainer.models.load import load_model, model_from_config
from treeprep.trainer.models.lora import apply_lora, is_peft
from treeprep.trainer.models.presets import PRESETS, TINY_WINDOW, Preset, preset_dict
from treeprep.trainer.models.run import (
    decoder_hidden,
    output_head,
    run_decoder,
    tree_logits,
)

__all__ = [
    "FAMILIES",
    "HANDLED_MIXERS",
    "PRESETS",
    "TINY_WINDOW",
    "apply_lora",
    "is_peft",
    "Preset",
    "ProbeReport",
    "check_structure",
    "guard_model",
    "probe",
    "decoder_hidden",
    "family_of",
    "load_model",
    "model_from_config",
    "output_head",
    "preset_dict",
    "run_decoder",
    "tree_logits",
]
