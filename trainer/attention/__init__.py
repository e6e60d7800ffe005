"""Tree attention: one rule (:mod:`.mask`), the backends as one table (:data:`BACKENDS`, their
facts in :data:`treeprep.modes.ATTN_FACTS`), one transformers glue (:mod:`.hf`), per-layer extras
(:mod:`.options`: windows, soft-capping, sinks).

See :mod:`.backends` for the interface and the choice, :mod:`.mask` for the rule and the metadata,
``docs/extending.md`` for adding a backend.
"""

from treeprep.trainer.attention.backends import (
    BACKENDS,
    DENSE_MAX_TOKENS,
    Backend,
    choose_backend,
    tree_attention,
)
from treeprep.trainer.attention.flash import flash_available
from treeprep.trainer.attention.hf import ATTN_NAME, hf_tree_attention, register_attention
from treeprep.trainer.attention.mask import Chains, TreeMask, build_chains, tree_mask_mod, visible
from treeprep.trainer.attention.options import PLAIN, LayerOptions

__all__ = [
    "ATTN_NAME",
    "BACKENDS",
    "Backend",
    "DENSE_MAX_TOKENS",
    "LayerOptions",
    "PLAIN",
    "Chains",
    "TreeMask",
    "build_chains",
    "choose_backend",
    "flash_available",
    "hf_tree_attention",
    "register_attention",
    "tree_attention",
    "tree_mask_mod",
    "visible",
]
