"""The contract between the data half (treeprep) and the GPU half (treeprep.trainer).

Three kinds of things live here and nothing else:

* canonical input records (pydantic v2): :class:`ChatCall` and :class:`TokenRollout`, what every
  format adapter produces, and :class:`Reject`, what happens to input that cannot be used;
* the versioned Arrow schema of a tree shard (:data:`TREE_SCHEMA`, :data:`SCHEMA_VERSION`);
* the build manifest (:class:`Manifest`), written last so that its presence means "done".

This package imports pydantic and pyarrow only: both halves depend on it, neither on the other.
"""

from treeprep.schemas.manifest import Counts, InputEntry, Manifest, ShardEntry, TokenizerIdentity
from treeprep.schemas.records import (
    BRANCH_REASONS,
    ChatCall,
    ContentPart,
    FunctionCall,
    Message,
    Provenance,
    Reject,
    TokenRollout,
    ToolCall,
)
from treeprep.schemas.shard import SCHEMA_VERSION, TREE_SCHEMA

__all__ = [
    "BRANCH_REASONS",
    "ChatCall",
    "Counts",
    "ContentPart",
    "FunctionCall",
    "InputEntry",
    "Manifest",
    "Message",
    "Provenance",
    "Reject",
    "SCHEMA_VERSION",
    "ShardEntry",
    "TREE_SCHEMA",
    "TokenRollout",
    "TokenizerIdentity",
    "ToolCall",
]
