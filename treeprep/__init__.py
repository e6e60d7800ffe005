"""treeprep: agent logs to token prefix trees, and exact tree training.

This package is the CPU pipeline (read logs, render and tokenize, build tries, write shards, stats,
packing). It stays light on import: ``import treeprep.trainer`` runs this file first, so nothing
heavy (polars, transformers) is imported here.
"""

__version__ = "0.1.0"
