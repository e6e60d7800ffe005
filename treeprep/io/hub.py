"""Hugging Face hub ids (``Qwen/Qwen3-1.7B``) as local folders, from the local HF cache only.

``--model`` and ``--tokenizer`` take a local folder, or a hub id whose snapshot is already in the
local Hugging Face cache (``HF_HUB_CACHE``, else ``HF_HOME/hub``, else
``~/.cache/huggingface/hub``): :func:`local_folder` finds it with ``huggingface_hub``'s own cache
lookup (``snapshot_download(local_files_only=True)``), so a revision the cache's ``refs`` name is
the one read. Nothing is downloaded here: a hub id missing from the cache is an error that says
how to fetch it (``hf download ID``), so a run never starts a multi-gigabyte download by surprise
and tests never reach the network.
"""

from __future__ import annotations

import os
import re

from treeprep.errors import TreeprepError

#: what a hub id looks like: ``name`` or ``owner/name`` (letters, digits, ``-``, ``_``, ``.``)
_HUB_ID = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9._-]*/)?[A-Za-z0-9][A-Za-z0-9._-]*$")


def looks_like_hub_id(spec: str) -> bool:
    """``spec`` could name a hub repository (and is not a path that exists)."""
    return bool(_HUB_ID.match(spec)) and not os.path.exists(spec) and ".." not in spec


def _cache_dir() -> str | None:
    """The cache named by the environment now (huggingface_hub reads it once, at import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return os.path.join(os.environ["HF_HOME"], "hub")
    return None


def local_folder(spec: str, what: str = "--model") -> str:
    """``spec`` itself when it is a path that exists or cannot be a hub id; else the folder of
    the hub id's snapshot in the local HF cache. A hub id that is not cached is a
    :class:`TreeprepError` naming ``what`` and the download command."""
    if not looks_like_hub_id(spec):
        return spec
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError as e:  # a dependency of tokenizers and transformers, so normally there
        raise TreeprepError(f"{what} {spec}: hub ids need huggingface_hub ({e})") from e
    try:
        return str(snapshot_download(spec, local_files_only=True, cache_dir=_cache_dir()))
    except (LocalEntryNotFoundError, OSError, ValueError) as e:
        where = _cache_dir() or "the default Hugging Face cache"
        raise TreeprepError(
            f"{what} {spec}: not a local folder, and not in the local Hugging Face cache "
            f"({where}); download it first (`hf download {spec}`) or pass its folder"
        ) from e
