"""Loading a causal LM that runs tree attention: a preset (random weights) or a local folder.

No model code is copied. treeprep registers one attention function
(:func:`~treeprep.trainer.attention.hf_tree_attention`) with transformers' ``AttentionInterface``
under the name ``"treeprep"`` and sets the model's ``attn_implementation`` to it; linear-attention
layers of hybrid families run node by node from their parent's state (:mod:`.hybrid`). A folder is
loaded with ``local_files_only=True`` and without transformers' hub kernels: nothing is ever
downloaded. Pickled weights (``pytorch_model.bin``) are read by transformers with
``torch.load(weights_only=True)``; one that holds more than tensors (code to run) is refused in
one line (:func:`pickle_refusal`).
"""

from __future__ import annotations

import glob
import os
import pickle
import re

import torch

from treeprep.errors import TreeprepError
from treeprep.io.paths import regular_folder
from treeprep.trainer.attention.hf import ATTN_NAME, register_attention
from treeprep.trainer.models.hybrid import install_linear_attention
from treeprep.trainer.models.presets import PRESETS


def load_model(
    spec: str,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    attn: str = "auto",
    seed: int = 0,
    vocab_size: int | None = None,
) -> torch.nn.Module:
    """A causal LM running tree attention: a preset name (random weights) or a local HF folder.

    ``attn`` is the default backend for this model (``auto``, ``dense``, ``nodes``, ``flex``,
    ``flash``), stored as ``model.treeprep_attn`` and overridable per call. ``vocab_size``
    overrides a preset's vocabulary (ignored for folders).
    """
    if spec in PRESETS:
        model = model_from_config(PRESETS[spec].hf_config(vocab_size), dtype=dtype, seed=seed)
    elif os.path.isdir(spec):
        import transformers as tf

        register_attention()
        if not os.path.exists(os.path.join(spec, "config.json")):
            raise TreeprepError(f"{spec}: not a model folder (no config.json)")
        if os.path.exists(os.path.join(spec, "adapter_config.json")):
            raise TreeprepError(
                f"{spec}: a LoRA adapter beside its base (transformers would load both, and the "
                "run would train the base under a frozen adapter); give --model its base folder, "
                "or merge the adapter first: treeprep export-model RUN --merge -o DIR"
            )
        regular_folder(spec, "the model folder")  # a FIFO in it would hang the load
        try:
            # use_kernels=False: 5.25 turns hub kernels on by default, which downloads kernels on
            # a GPU and re-kernelizes on every train()/eval() (dropping hybrid.py's forwards)
            model = tf.AutoModelForCausalLM.from_pretrained(
                spec,
                dtype=dtype,
                attn_implementation=ATTN_NAME,
                local_files_only=True,
                use_kernels=False,
            )
        except pickle.UnpicklingError as e:
            raise TreeprepError(pickle_refusal(spec, e)) from None
        except (OSError, ValueError, KeyError) as e:
            raise TreeprepError(f"{spec}: cannot load the model: {e}") from e
        install_linear_attention(model)
    else:
        raise TreeprepError(
            f"unknown model {spec!r}: expected a model folder or one of {', '.join(PRESETS)}"
        )
    model.to(device)
    # nn.Module's __setattr__ stub takes only Tensor | Module values; a module takes any attribute
    model.treeprep_attn = attn  # type: ignore[assignment]
    model.treeprep_spec = spec if spec in PRESETS else os.path.abspath(spec)  # type: ignore[assignment]
    return model


def pickle_refusal(folder: str, e: BaseException) -> str:
    """One line for a pickled weights file that ``torch.load(weights_only=True)`` refused (it
    would have run code, or named a type outside tensors and plain values): which file, what it
    tried to load, that nothing of it ran, and what to do instead."""
    files = sorted(glob.glob(os.path.join(glob.escape(folder), "*.bin")))
    names = ", ".join(os.path.basename(f) for f in files) or "a pickled weights file"
    found = re.search(r"unsupported GLOBAL (\S+)", str(e))
    what = found.group(1) if found else "a type that is not a tensor or a plain value"
    return (
        f"{folder}: refused to load {names}: a pickle that asks for {what} (it could run code); "
        "nothing of it ran. Load a copy saved as safetensors (model.safetensors) from a source "
        "you trust"
    )


def model_from_config(
    config: object, *, dtype: torch.dtype = torch.float32, seed: int = 0
) -> torch.nn.Module:
    """A random-weight causal LM of a transformers ``config`` (seeded), running tree attention."""
    import transformers as tf

    register_attention()
    config._attn_implementation = ATTN_NAME  # type: ignore[attr-defined]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = tf.AutoModelForCausalLM.from_config(
            config, attn_implementation=ATTN_NAME, dtype=dtype
        )
    install_linear_attention(model)
    return model
