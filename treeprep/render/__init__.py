"""Rendering: records to token sequences with a model's chat template.

``renderer`` (record -> :class:`~treeprep.sequence.Sequence`, the contract), ``encoder`` (the piece
cache that tokenizes unique text once), ``template`` (jinja in its sandbox, the direct call, port
verification), ``native`` (Python ports of known templates), ``builtin`` (the byte-level ChatML
tokenizer used when no tokenizer folder is given).
"""

from treeprep.render.encoder import CachedEncoder
from treeprep.render.renderer import Renderer, normalize_message

__all__ = ["CachedEncoder", "Renderer", "normalize_message"]
