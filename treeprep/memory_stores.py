"""Where the hand-off stores go, for ``train --dry-run``: GPU peak and host RAM per rank for both
places, and the longest path each one fits. Arithmetic only, on :mod:`treeprep.memory`.

With ``stores="gpu"`` the stores of a long path are the one part of a step's GPU memory that grows
with the session: per path token and full-attention layer, a key and a value and an accumulator
each (:func:`~treeprep.memory.handoff_bytes_per_path_token`). With ``stores="host"`` they live in
host RAM (pinned), and the GPU keeps what does not grow with the path: the windows it streams
(:func:`~treeprep.memory.stream_bytes`) and the linear-attention states; the part's mask index
vectors (a few int64 per prefix row) are all that still grows there. So

* with gpu stores the longest path is set by the GPU: the largest path whose predicted peak fits
  ``gpu_memory``;
* with host stores it is set by the host: the largest path whose stores fit each rank's share of
  the node's RAM (``host_memory``), as long as the GPU peak (nearly flat in the path) fits.

The path is one chain of parts (an agent session), stored rows = path less the last part
(:func:`~treeprep.memory.handoff_bytes`); side branches that the stack holds add their rows
on top, as the build's own figure (:meth:`~treeprep.dry_run.BuildFacts.stored_rows`) shows.

``stores="auto"`` takes gpu where the run fits the GPU with it, else host, where the attention
backend reads the prefix in place (:func:`~treeprep.modes.reads_prefix_in_place`; host stores
stream it a window at a time).
"""

from __future__ import annotations

from dataclasses import replace

from treeprep.dry_run import BuildFacts, dry_run
from treeprep.errors import TreeprepError
from treeprep.flops import ModelShape
from treeprep.memory import Gpu, MemorySetup, peak, terms
from treeprep.modes import Stores, reads_prefix_in_place

#: the longest path searched (tokens)
MAX_PATH = 2**31


def longest_path(
    m: ModelShape,
    s: MemorySetup,
    *,
    budget: int,
    gpu_memory: int,
    host_memory: int | None = None,
) -> int:
    """The longest root-to-leaf path (one chain of parts of ``budget``) whose step fits
    ``gpu_memory`` per GPU and, with host stores, ``host_memory`` of host RAM per rank (None: no
    bound); 0 when not even one part fits."""

    def fits(path: int) -> bool:
        t = terms(m, s, budget=budget, path=path)
        if peak(t, checkpointing=s.activation_checkpointing) > gpu_memory:
            return False
        return host_memory is None or t["host_stores"] <= host_memory

    if not fits(budget):
        return 0
    lo, hi = budget, 2 * budget
    while hi < MAX_PATH and fits(hi):
        lo, hi = hi, 2 * hi
    if hi >= MAX_PATH and fits(MAX_PATH):
        return MAX_PATH
    while hi - lo > 1:  # fits(lo), not fits(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def dry_run_stores(
    m: ModelShape,
    s: MemorySetup,
    b: BuildFacts,
    gpu: Gpu,
    *,
    gpu_memory: int | None = None,
    host_memory: int | None = None,
    budget: int | None = None,
    checkpointing_given: bool = False,
) -> dict:
    """:func:`~treeprep.dry_run.dry_run` with the stores where ``s.stores`` says (auto: gpu where
    it fits, else host), plus ``store_places``: for gpu and host stores at the run's budget and
    checkpointing, the GPU peak and host RAM per rank (``host_memory`` is per rank), whether it
    fits, and the longest path that fits."""
    places = [Stores.gpu, Stores.host] if s.stores == Stores.auto else [s.stores]
    if not reads_prefix_in_place(s.attn):  # a backend that joins the prefix: no host stores
        if s.stores == Stores.host:
            raise TreeprepError(f"stores host streams the prefix with attn nodes, not {s.attn}")
        places = [Stores.gpu]
    for place in places:
        out = dry_run(m, replace(s, stores=place), b, gpu, gpu_memory=gpu_memory, budget=budget,
                      checkpointing_given=checkpointing_given)  # fmt: skip
        if out["fits"]:
            break
    mem = out["gpu_memory_bytes"]
    chosen = replace(
        s,
        activation_checkpointing=out["activation_checkpointing"],
        part_graph=out["part_graph"],
    )
    compared: dict[str, dict] = {}
    for where in (Stores.gpu, Stores.host):
        sp = replace(chosen, stores=where)
        d = dry_run(m, sp, b, gpu, gpu_memory=mem, budget=out["budget"], checkpointing_given=True)
        # the parts' host stores: the peak's terms may be a micro-batch of whole trees, which
        # stores nothing, where its GPU peak is the larger one
        host = terms(m, sp, budget=out["budget"], path=b.longest_path,
                     tree_tokens=b.largest_tree_tokens,
                     stored_rows=b.stored_rows(out["budget"]))["host_stores"]  # fmt: skip
        bound = host_memory if where == Stores.host else None
        compared[str(where)] = {
            "gpu_peak_bytes": d["predicted_peak_bytes"],
            "host_bytes": host,
            "fits": bool(d["fits"] and (bound is None or host <= bound)),
            "longest_path": longest_path(
                m, sp, budget=out["budget"], gpu_memory=mem, host_memory=bound
            ),
        }
    return {
        **out,
        "stores": str(place),
        "stores_source": "auto" if s.stores == Stores.auto else "given",
        "host_memory_bytes": host_memory,
        "store_places": compared,
    }


__all__ = ["MAX_PATH", "dry_run_stores", "longest_path"]
