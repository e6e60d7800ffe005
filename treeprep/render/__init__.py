"""Rendering: records to token sequences with a model's chat template.

``renderer`` (record -> :class:`~treeprep.sequence.Sequence`, the contract), ``messages`` (a
record's messages as the template sees them), ``identity`` (the tokenizer a renderer loads and
the identity it records), ``encoder`` (the piece cache that tokenizes unique text once),
``template`` (jinja in its sandbox, the direct call, port verification), ``native`` (Python ports
of known templates), ``builtin`` (the byte-level ChatML tokenizer used when no tokenizer folder is
given).
"""

from treeprep.render.encoder import CachedEncoder
from treeprep.render.messages import normalize_message
from treeprep.render.renderer import Renderer

__all__ = ["CachedEncoder", "Renderer", "normalize_message"]
