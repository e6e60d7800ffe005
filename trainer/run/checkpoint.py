"""Checkpoints: written atomically, loadable by transformers as they are, resumable exactly.

Layout of ``RUN/checkpoints/step-00000042/``::

    model/              save_pretrained: config.json, model.safetensors (+ the model folder's
                        tokenizer files when it had some): AutoModelForCausalLM loads it as is;
                        for a LoRA run the peft adapter folder (adapter_config.json,
                        adapter_model.safetensors) that PeftModel.from_pretrained loads
    optimizer.pt        the optimizer state (unsharded), torch.save of tensors and numbers
    scheduler.pt        the learning-rate schedule, for information (the rate follows the step)
    scaler.pt           float16 runs: the grad scaler's state (its loss scale and growth count)
    rng-rank<R>.pt      each rank's random state (python, numpy, torch CPU, torch CUDA) as tensors
    state.json          step, epoch, position in the epoch, config, last metrics, and the sha256
                        of every other file: written last

Untrusted files never execute code: every ``.pt`` file holds only tensors, numbers, strings and
containers, and is read with ``torch.load(weights_only=True)``, which refuses a pickle that would
build any other object (the random states are stored as tensors and plain lists for this reason).
A checkpoint is also checked before it is used: ``state.json`` records the size and sha256 of
every file of the checkpoint, and :func:`open_checkpoint` verifies them, so a truncated file or a
flipped bit stops a resume with a :class:`CheckpointError` naming the file instead of a raw
traceback, an abort inside a native reader, or a silently different model.

Atomicity (nanochat's rule: write to a temporary name, rename, the marker last). Everything is
written into ``checkpoints/.tmp-step-00000042/``; ``state.json`` is written last inside it, files
are fsynced, and the folder is renamed to ``step-00000042`` in one ``os.replace``. A crash before
the rename leaves only a ``.tmp-*`` folder, which :func:`latest_checkpoint` ignores (and the next
save removes); a folder named ``step-*`` without ``state.json`` is never taken for a checkpoint.

With several ranks, rank 0 creates the temporary folder, every rank writes its own random state
into it, rank 0 writes the rest and renames after a barrier (the run folder must be on a file
system that every rank sees, as with any multi-node trainer).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch

from treeprep.atomic import fsync_path, write_failure
from treeprep.errors import CheckpointError, TreeprepError

_STEP_DIR = re.compile(r"^step-(\d{8})$")
#: the weights file of a peft adapter folder (LoRA runs save the adapter, not the base model)
ADAPTER_FILE = "adapter_model.safetensors"
STATE_FILE = "state.json"
#: a float16 run's grad scaler state
SCALER_FILE = "scaler.pt"


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


@contextlib.contextmanager
def _writing(path: str, remove: str | None = None) -> Iterator[None]:
    """A failed write under ``path`` (disk full, read-only run folder, permissions) becomes a
    CheckpointError naming the path and the cause (never torch's ``inline_container`` message or
    safetensors' error type); the half-written folder ``remove`` is dropped, the checkpoints
    already saved stay whole."""
    try:
        yield
    except TreeprepError:
        raise
    except Exception as e:
        err = _os_cause(e)
        if err is None:
            raise
        if remove is not None and os.path.isdir(remove):
            shutil.rmtree(remove, ignore_errors=True)
        elif remove is not None:
            with contextlib.suppress(OSError):
                os.remove(remove)
        where = getattr(err, "filename", None) or path
        raise CheckpointError(f"checkpoint not saved: {write_failure(where, err)}") from e


def _os_cause(e: BaseException) -> OSError | None:
    """The OSError behind ``e``: itself, one in its chain (torch's zip writer raises a
    RuntimeError while the file's OSError is handled), or safetensors' "(os error 28)" text."""
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, OSError):
            return seen
        m = re.search(r"os error (\d+)", str(seen))  # safetensors: "I/O error: ... (os error 28)"
        if m:
            return OSError(int(m.group(1)), str(seen))
        seen = seen.__cause__ or seen.__context__
    return None


def _torch_save(obj: Any, path: str) -> None:
    """``torch.save`` through a Python file, so that a full disk raises ``OSError`` (ENOSPC)
    rather than a ``RuntimeError`` of torch's zip writer without a cause."""
    try:
        with open(path, "wb") as f:
            torch.save(obj, f)
    except Exception as e:
        cause = _os_cause(e)
        if cause is None or cause.filename:
            raise
        raise OSError(cause.errno, cause.strerror or str(cause), path) from e


def _fsync_tree(path: str) -> None:
    for root, _dirs, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def _fsync_dir(path: str) -> None:
    """The pipeline's folder flush, where a folder that cannot be opened is passed over."""
    with contextlib.suppress(OSError):
        fsync_path(path)


def rng_state() -> dict[str, Any]:
    """This process's random state: python, numpy, torch CPU and (when present) CUDA, as
    tensors, ints and lists only (what ``torch.load(weights_only=True)`` reads back)."""
    version, mt, gauss = random.getstate()
    # numpy's stub allows the dict form too, which the legacy global MT19937 state never returns
    np_state = cast(tuple[str, np.ndarray, int, int, float], np.random.get_state())
    kind, keys, pos, has_gauss, cached = np_state
    st: dict[str, Any] = {
        "python": {"version": version, "state": torch.tensor(mt, dtype=torch.int64),
                   "gauss": gauss},
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": pos,
                  "has_gauss": has_gauss, "cached_gaussian": cached},
        "torch": torch.get_rng_state(),
    }  # fmt: skip
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def set_rng_state(st: dict[str, Any]) -> None:
    py, npy = st["python"], st["numpy"]
    random.setstate((py["version"], tuple(int(x) for x in py["state"].tolist()), py["gauss"]))
    keys = npy["keys"].numpy().astype(np.uint32)
    np.random.set_state(
        (npy["kind"], keys, int(npy["pos"]), int(npy["has_gauss"]), float(npy["cached_gaussian"]))
    )
    torch.set_rng_state(st["torch"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


def checkpoints_dir(run_dir: str) -> str:
    return os.path.join(run_dir, "checkpoints")


def list_checkpoints(run_dir: str) -> list[tuple[int, str]]:
    """Whole checkpoints of a run, (step, folder), oldest first."""
    root = checkpoints_dir(run_dir)
    if not os.path.isdir(root):
        return []
    out = []
    for name in os.listdir(root):
        m = _STEP_DIR.match(name)
        path = os.path.join(root, name)
        if m and os.path.isfile(os.path.join(path, STATE_FILE)):
            out.append((int(m.group(1)), path))
    return sorted(out)


def latest_checkpoint(run_dir: str) -> str | None:
    """The newest whole checkpoint of a run, or None."""
    cps = list_checkpoints(run_dir)
    return cps[-1][1] if cps else None


def begin_save(run_dir: str, step: int, is_main: bool) -> str:
    """The temporary folder of a checkpoint in the making (created, emptied, by rank 0)."""
    tmp = os.path.join(checkpoints_dir(run_dir), "." + "tmp-" + step_dir_name(step))
    if is_main:
        with _writing(checkpoints_dir(run_dir)):
            os.makedirs(checkpoints_dir(run_dir), exist_ok=True)
            for name in os.listdir(checkpoints_dir(run_dir)):
                if name.startswith(".tmp-"):  # leftovers of a crashed save
                    shutil.rmtree(os.path.join(checkpoints_dir(run_dir), name), ignore_errors=True)
            os.makedirs(tmp)
    return tmp


def save_rng(tmp: str, rank: int) -> None:
    path = os.path.join(tmp, f"rng-rank{rank}.pt")
    with _writing(path, remove=tmp if rank == 0 else path):  # rank 0 owns the folder
        _torch_save(rng_state(), path)


def save_main(
    tmp: str,
    *,
    model: torch.nn.Module,
    model_state: dict | None,
    optimizer_state: dict,
    scheduler_state: dict,
    state: dict[str, Any],
    tokenizer_dir: str | None,
    scaler_state: dict | None = None,
) -> None:
    """Rank 0's part: the model folder, optimizer, scheduler and (float16) grad scaler, then
    ``state.json`` last. A failed write is a CheckpointError naming the file and the cause; the
    temporary folder goes."""
    with _writing(tmp, remove=tmp):
        mdir = os.path.join(tmp, "model")
        save_plain(model, mdir, state_dict=model_state)
        if tokenizer_dir is not None:
            from treeprep.schemas.tokenizer import TOKENIZER_FILES

            for name in TOKENIZER_FILES:
                src = os.path.join(tokenizer_dir, name)
                if os.path.isfile(src):
                    shutil.copy2(src, os.path.join(mdir, name))
        _torch_save(optimizer_state, os.path.join(tmp, "optimizer.pt"))
        _torch_save(scheduler_state, os.path.join(tmp, "scheduler.pt"))
        if scaler_state is not None:
            _torch_save(scaler_state, os.path.join(tmp, SCALER_FILE))
        state = {**state, "files": checksum_files(tmp)}
        with open(os.path.join(tmp, STATE_FILE), "w", encoding="utf-8") as f:
            json.dump(state, f, indent=2)


def save_plain(model: torch.nn.Module, folder: str, state_dict: dict | None = None) -> None:
    """``save_pretrained`` into ``folder``, its config naming plain transformers' attention
    (``sdpa``), not treeprep's: the folder must load in plain transformers."""
    # nn.Module's __getattr__ stub types a transformers model's attributes as Tensor | Module
    hf = cast(Any, model)
    cfg = hf.config
    saved_attn = getattr(cfg, "_attn_implementation", None)
    try:
        cfg._attn_implementation = "sdpa"
    except (AttributeError, ValueError):
        pass
    try:
        hf.save_pretrained(folder, state_dict=state_dict)
    finally:
        if saved_attn is not None:
            try:
                cfg._attn_implementation = saved_attn
            except (AttributeError, ValueError):
                pass


def checksum_files(folder: str) -> dict[str, dict[str, Any]]:
    """``{relative path: {"bytes", "sha256"}}`` for every file under ``folder`` but state.json."""
    out: dict[str, dict[str, Any]] = {}
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(root, name)
            rel = os.path.relpath(path, folder).replace(os.sep, "/")
            if rel == STATE_FILE:
                continue
            with open(path, "rb") as f:
                sha = hashlib.file_digest(f, "sha256").hexdigest()
            out[rel] = {"bytes": os.path.getsize(path), "sha256": sha}
    return out


def verify_files(path: str, files: dict[str, Any]) -> None:
    """CheckpointError unless every file ``state.json`` lists is there, whole and unchanged."""
    if not isinstance(files, dict):
        raise CheckpointError(f"{path}/{STATE_FILE}: 'files' is not a table of checksums")
    for rel, want in sorted(files.items()):
        full = os.path.normpath(os.path.join(path, rel))
        if os.path.isabs(rel) or ".." in rel.split("/") or not isinstance(want, dict):
            raise CheckpointError(f"{path}/{STATE_FILE}: bad file entry {rel!r}")
        try:
            size = os.path.getsize(full)
            with open(full, "rb") as f:
                sha = hashlib.file_digest(f, "sha256").hexdigest()
        except OSError as e:
            raise CheckpointError(f"{full}: checkpoint file missing or unreadable ({e})") from e
        if size != want.get("bytes"):
            raise CheckpointError(
                f"{full}: checkpoint file is {size} bytes, state.json recorded "
                f"{want.get('bytes')} (truncated or replaced)"
            )
        if sha != want.get("sha256"):
            raise CheckpointError(
                f"{full}: checkpoint file does not match its sha256 in state.json (corrupted)"
            )


def finish_save(run_dir: str, tmp: str, step: int, keep: int | None) -> str:
    """fsync, rename the temporary folder into place, drop old checkpoints beyond ``keep``."""
    if not os.path.isfile(os.path.join(tmp, STATE_FILE)):
        raise CheckpointError(f"{tmp}: state.json missing; the checkpoint was not completed")
    with _writing(tmp, remove=tmp):
        return _publish(run_dir, tmp, step, keep)


def _publish(run_dir: str, tmp: str, step: int, keep: int | None) -> str:
    _fsync_tree(tmp)
    final = os.path.join(checkpoints_dir(run_dir), step_dir_name(step))
    if os.path.exists(final):  # a re-save of the same step: move the old one out of the way
        old = final + ".old"
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    _fsync_dir(checkpoints_dir(run_dir))
    if keep is not None and keep > 0:
        for _s, path in list_checkpoints(run_dir)[:-keep]:
            if path != final:  # the checkpoint just written is never the one dropped
                shutil.rmtree(path, ignore_errors=True)
    return final


#: what a run writes in its folder (an earlier run is recognised, and overwritten, by these)
RUN_FILES = (
    "final",
    "config.json",
    "config.toml",
    "metrics.jsonl",
    "checkpoints",
    "tensorboard",
    "trackers.json",
    "train.png",
)


def earlier_run(run_dir: str) -> list[str]:
    """The files of an earlier run in ``run_dir`` (empty: none)."""
    return [f for f in RUN_FILES if os.path.exists(os.path.join(run_dir, f))]


def clear_run(run_dir: str) -> None:
    """Delete an earlier run's files (:data:`RUN_FILES` only: nothing else in the folder)."""
    for f in earlier_run(run_dir):
        path = os.path.join(run_dir, f)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.remove(path)


@dataclass
class Checkpoint:
    """A whole checkpoint on disk."""

    path: str
    state: dict[str, Any]

    @property
    def step(self) -> int:
        return int(self.state["step"])

    @property
    def model_dir(self) -> str:
        return os.path.join(self.path, "model")

    def _load(self, name: str) -> Any:
        """A ``.pt`` file of the checkpoint, read without running any code it may hold."""
        p = os.path.join(self.path, name)
        try:
            return torch.load(p, map_location="cpu", weights_only=True)
        except Exception as e:  # an unpickling refusal, a truncated zip, a bad record
            raise CheckpointError(
                f"{p}: cannot be loaded safely (only tensors and plain values are accepted): "
                f"{str(e).splitlines()[0] if str(e) else type(e).__name__}"
            ) from e

    def optimizer_state(self) -> dict:
        return self._load("optimizer.pt")  # type: ignore[no-any-return]

    def scheduler_state(self) -> dict:
        return self._load("scheduler.pt")  # type: ignore[no-any-return]

    def scaler_state(self) -> dict | None:
        """The float16 grad scaler's state; None when the run had no scaler (another precision)
        or was saved before checkpoints held it."""
        if not os.path.isfile(os.path.join(self.path, SCALER_FILE)):
            return None
        return self._load(SCALER_FILE)  # type: ignore[no-any-return]

    def rng(self, rank: int) -> dict | None:
        name = f"rng-rank{rank}.pt"
        if not os.path.isfile(os.path.join(self.path, name)):
            return None
        return self._load(name)  # type: ignore[no-any-return]

    def listed(self, rel: str) -> str:
        """The path of a file ``state.json`` lists (and :func:`open_checkpoint` verified), or a
        CheckpointError: nothing unlisted is ever read as part of the checkpoint."""
        files = self.state.get("files", {})
        if not isinstance(files, dict) or rel not in files or ".." in rel.split("/"):
            raise CheckpointError(
                f"{self.path}: {rel!r} is not among the files state.json lists and verifies"
            )
        return os.path.join(self.path, *rel.split("/"))

    def weight_files(self) -> list[str]:
        """The verified weight files of the model folder: the peft adapter, the shards an index
        names (each a listed file inside ``model/``), or ``model.safetensors``."""
        files = self.state.get("files", {})
        has = {r.removeprefix("model/") for r in files if r.startswith("model/")}
        if ADAPTER_FILE in has:
            return [self.listed(f"model/{ADAPTER_FILE}")]  # a LoRA run: the peft adapter folder
        if "model.safetensors.index.json" not in has:
            return [self.listed("model/model.safetensors")]
        index = self.listed("model/model.safetensors.index.json")
        try:
            with open(index, encoding="utf-8") as f:
                names = sorted(set(json.load(f)["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise CheckpointError(f"{index}: unreadable weight index ({e})") from e
        for n in names:
            if not isinstance(n, str) or "/" in n or "\\" in n or n in ("", ".", ".."):
                raise CheckpointError(f"{index}: weight_map names {n!r}, not a file of model/")
        return [self.listed(f"model/{n}") for n in names]

    def model_state(self) -> dict[str, torch.Tensor]:
        """The saved weights (safetensors, only files state.json lists), as a CPU state dict."""
        from safetensors.torch import load_file

        sd: dict[str, torch.Tensor] = {}
        for p in self.weight_files():
            try:
                sd.update(load_file(p, device="cpu"))
            except Exception as e:  # safetensors raises its own error types
                raise CheckpointError(f"{p}: unreadable weights ({e})") from e
        return sd


#: file names that hold (or point at) weights: one that state.json does not list would be read by
#: transformers or peft in place of the verified ones
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack")


def _is_weights(name: str) -> bool:
    return name.endswith(_WEIGHT_SUFFIXES) or name.endswith(".index.json")


def refuse_unlisted(path: str, files: dict[str, Any]) -> None:
    """CheckpointError when the folder holds a weight or index file that state.json does not
    list (an added ``model.safetensors.index.json`` or adapter would win over the verified
    weights, in treeprep and in transformers)."""
    for root, dirs, names in os.walk(path):
        dirs.sort()
        for name in sorted(names):
            rel = os.path.relpath(os.path.join(root, name), path).replace(os.sep, "/")
            if rel != STATE_FILE and rel not in files and _is_weights(name):
                raise CheckpointError(
                    f"{os.path.join(root, name)}: a weights file that state.json does not list; "
                    "a checkpoint holds only the files it verifies (remove it, or use another "
                    "checkpoint)"
                )


def open_checkpoint(path: str) -> Checkpoint:
    """A checkpoint folder, or a run folder (its newest checkpoint)."""
    if os.path.isdir(checkpoints_dir(path)) and not os.path.isfile(os.path.join(path, STATE_FILE)):
        latest = latest_checkpoint(path)
        if latest is None:
            raise CheckpointError(f"{path}: the run has no whole checkpoint to resume from")
        path = latest
    sp = os.path.join(path, STATE_FILE)
    if not os.path.isfile(sp):
        raise CheckpointError(
            f"{path}: not a whole checkpoint (no {STATE_FILE}; a save may have been interrupted)"
        )
    try:
        with open(sp, encoding="utf-8") as f:
            state = json.load(f)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{sp}: unreadable checkpoint state ({e})") from e
    if not isinstance(state, dict):
        raise CheckpointError(f"{sp}: checkpoint state is not a JSON object")
    for k in ("step", "epoch", "epoch_step", "files"):
        if k not in state:
            raise CheckpointError(
                f"{sp}: checkpoint state has no {k!r}"
                + (" (made by an older treeprep without checksums)" if k == "files" else "")
            )
    verify_files(path, state["files"])
    refuse_unlisted(path, state["files"])
    return Checkpoint(path, state)


def load_model_weights(model: torch.nn.Module, ckpt: Checkpoint) -> None:
    """Copy a checkpoint's weights into ``model`` (strict: every key must match)."""
    sd = ckpt.model_state()
    if f"model/{ADAPTER_FILE}" in ckpt.state.get("files", {}):
        _load_adapter(model, sd, ckpt)
        return
    own = model.state_dict()
    missing = [k for k in own if k not in sd]
    tied = getattr(model.config, "tie_word_embeddings", False)
    if tied:  # save_pretrained drops the tied copy
        missing = [k for k in missing if not k.endswith("lm_head.weight")]
    extra = [k for k in sd if k not in own]
    if missing or extra:
        raise CheckpointError(
            f"{ckpt.model_dir}: weights do not match the model (missing {missing[:3]}, "
            f"unexpected {extra[:3]})"
        )
    with torch.no_grad():
        for k, v in sd.items():
            if own[k].shape != v.shape:
                raise CheckpointError(
                    f"{ckpt.model_dir}: {k} has shape {tuple(v.shape)}, the model "
                    f"{tuple(own[k].shape)}"
                )
            own[k].copy_(v)


def _load_adapter(model: torch.nn.Module, sd: dict[str, torch.Tensor], ckpt: Checkpoint) -> None:
    """A LoRA checkpoint's adapter weights into a peft-wrapped ``model`` (every adapter key)."""
    try:
        from peft import set_peft_model_state_dict
    except ImportError as e:  # pragma: no cover
        raise CheckpointError(f"{ckpt.model_dir}: a LoRA checkpoint needs peft") from e
    if not hasattr(model, "peft_config"):
        raise CheckpointError(f"{ckpt.model_dir}: a LoRA checkpoint; resume it with --lora-r")
    try:
        # peft annotates the return as `namedtuple` (the factory), not the _IncompatibleKeys
        res = cast(Any, set_peft_model_state_dict(model, sd))
    except RuntimeError as e:  # torch's "size mismatch for ...": another LoRA rank or model
        lines = [ln.strip() for ln in str(e).splitlines() if "size mismatch" in ln]
        raise CheckpointError(
            f"{ckpt.model_dir}: the adapter's shapes do not match the model (another --lora-r "
            f"or another model?): {lines[0] if lines else str(e).splitlines()[0]}"
        ) from e
    missing = [k for k in res.missing_keys if "lora_" in k]
    if missing or res.unexpected_keys:
        raise CheckpointError(
            f"{ckpt.model_dir}: adapter weights do not match the model (missing {missing[:3]}, "
            f"unexpected {list(res.unexpected_keys)[:3]})"
        )
