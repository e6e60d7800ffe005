"""``treeprep export``: every input sequence back out of the trees, one JSON line each.

Each line holds ``group_id``, ``agent_id``, ``call_id``, ``input_ids`` and ``loss_mask`` (and
``logprobs``, ``reward``, ``advantage`` when present). Duplicates merged in the trie come out as
many times as they went in, so ``export(build(x)) == x`` as a multiset. The file is written
atomically.
"""

from __future__ import annotations

import os

import orjson

from treeprep.atomic import writing
from treeprep.shards import iter_trees


def export_sequences(out_dir: str, dest: str, *, groups: list[str] | None = None) -> int:
    """Write every sequence of the build in ``out_dir`` to ``dest`` (JSONL). Returns the count."""
    n = 0
    tmp = dest + ".tmp"
    with writing(dest, tmp):
        with open(tmp, "wb") as f:
            for tree in iter_trees(out_dir, groups=groups):
                for rec in tree.iter_sequences():
                    f.write(orjson.dumps(rec))
                    f.write(b"\n")
                    n += 1
        os.replace(tmp, dest)
    return n
