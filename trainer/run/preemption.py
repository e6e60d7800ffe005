"""Stopping a run on a signal without losing it: SIGTERM, SIGINT (Ctrl-C) and SIGUSR1.

Schedulers announce the end of a job with a signal: SLURM sends SIGTERM at preemption or time
limit (and SIGUSR1 ahead of it with ``#SBATCH --signal=B:USR1@N``), Kubernetes SIGTERM on
eviction, a person Ctrl-C. :class:`StopSignals` turns the first of these into a request that the
loop reads at the next step boundary, where it saves a whole checkpoint and returns; it never
interrupts a step or a save in the middle, so the time from the signal to the exit is at most one
step plus one save (``docs/training.md`` has the SLURM line and the measured times). A second
signal means "now": the previous handlers are put back and the signal is raised again (Ctrl-C
becomes ``KeyboardInterrupt``, SIGTERM ends the process), after the caller was told so that it
can name the last whole checkpoint; the kill -9 guarantees are all that is left, and they hold
(checkpoints are atomic).

Under torchrun every rank installs the handlers; a signal may reach one rank only (``kill`` of one
process) or all (Ctrl-C to the process group, torchrun forwarding its SIGTERM). :func:`agree` sums
the ranks' flags at each step boundary, so all ranks stop at the same step and save together (the
save is collective). Handlers can only be installed from the main thread; elsewhere (a run
started from a worker thread) the signals keep their handlers and nothing is requested.

A run that ends because another rank was lost (:func:`~treeprep.trainer.distributed.rank_lost`)
does not put the old handlers back: torchrun's agent sends the survivors SIGTERM as soon as a
worker dies, and the default action would end the process before its error message is out. The
stop signals are ignored from then on; the process exits with status 1 right after (and the
agent's SIGKILL, 30 s later, still ends one that would not).

The process then exits with ``128 + signal number`` (143 for SIGTERM, 130 for Ctrl-C, 138 for
SIGUSR1): the shell's convention for a process ended by a signal, which torchrun and schedulers
read as "did not finish" (a job that stopped early must not look done to a requeue script).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

from treeprep.trainer import distributed as dist_mod

#: the signals that ask for a checkpoint and a stop
STOP_SIGNALS: tuple[signal.Signals, ...] = tuple(
    s for s in (signal.SIGTERM, signal.SIGINT, getattr(signal, "SIGUSR1", None)) if s is not None
)


def exit_code(signame: str) -> int:
    """``128 + n`` for the signal named ``signame`` (the shell's exit status of a signal)."""
    return 128 + int(signal.Signals[signame])


class StopSignals:
    """Within ``with``: the first stop signal sets :attr:`received` (its name); a second one
    exits at once through the handlers that were there before. ``notify(name, now)`` is told of
    each (``now``: the second, about to exit), so the caller can say what it does and which
    checkpoint is the last whole one."""

    def __init__(self, notify: Callable[[str, bool], None] | None = None) -> None:
        self.received: str | None = None
        self._old: dict[signal.Signals, Any] = {}
        self._notify = notify

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for s in STOP_SIGNALS:
                self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        if ev is not None and self._old and dist_mod.collective_failed(ev):
            for s in self._old:
                signal.signal(s, signal.SIG_IGN)  # the run is over: let its message out
            self._old.clear()
            return
        self._restore()

    def _restore(self) -> None:
        for s, old in self._old.items():
            signal.signal(s, old if old is not None else signal.SIG_DFL)
        self._old.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        first = self.received is None
        if first:
            self.received = name
        if self._notify is not None:
            try:
                self._notify(name, not first)
            except Exception:  # noqa: BLE001  (a report must never keep the run from stopping)
                pass
        if first:
            return
        self._restore()  # the second signal: the old handler (KeyboardInterrupt, or the default)
        signal.raise_signal(signum)
        os._exit(128 + signum)  # an old handler that ignored it: still exit at once


def agree(flags: list[bool], info: dist_mod.DistInfo) -> list[bool]:
    """Each flag true on any rank, on every rank (one small all-reduce under torchrun)."""
    return [v > 0 for v in dist_mod.all_reduce_sum([float(f) for f in flags], info)]
