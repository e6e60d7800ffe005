"""Paths or URLs: where a build reads and writes, as pyarrow's filesystems name them.

A build's inputs and output may be given as local paths or as ``file://`` URLs (what a Ray job
spec or a cluster config tends to hold). Both resolve to local paths through
``pyarrow.fs.FileSystem.from_uri``, so a URL means exactly what pyarrow says it means. URLs of
other filesystems (``s3://``, ``gs://``) are refused with a clear error rather than half-supported:
stage 1 reads files through :mod:`treeprep.io`, which opens local files only.
"""

from __future__ import annotations

import pyarrow as pa

from treeprep.errors import TreeprepError


def local_path(path: str) -> str:
    """A local path, or a URL that names one (``file:///data/logs``), as a local path.

    >>> local_path("file:///tmp/logs")
    '/tmp/logs'
    >>> local_path("sample_data")
    'sample_data'
    """
    if "://" not in path:
        return path
    scheme = path.split("://", 1)[0].lower()
    if scheme != "file":  # refused before pyarrow might look up a bucket over the network
        raise TreeprepError(
            f"{path}: only local paths and file:// URLs are supported ({scheme}:// is not yet)"
        )
    import pyarrow.fs as pafs

    try:
        fs, inner = pafs.FileSystem.from_uri(path)
    except (pa.ArrowInvalid, ValueError, OSError) as e:
        raise TreeprepError(f"{path}: not a file URL pyarrow can open: {e}") from e
    if not isinstance(fs, pafs.LocalFileSystem):  # pragma: no cover - pyarrow's file:// is local
        raise TreeprepError(f"{path}: not a local filesystem ({fs.type_name})")
    return inner


def local_paths(paths: list[str]) -> list[str]:
    """:func:`local_path` of each."""
    return [local_path(p) for p in paths]
