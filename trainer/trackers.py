"""Experiment trackers (``train --report-to``): TensorBoard, Weights & Biases, MLflow, trackio.

Each tracker is an optional extra of the same name (``pip install 'treeprep[wandb]'``). A run that
asks for one whose package is missing is refused by :func:`require` before anything is loaded,
with the extra and the pip command (it used to write nothing and say nothing). On the main rank
:func:`open_trackers` starts one :class:`Tracker` per name; every step's numeric metrics go to
each as ``train/<name>`` at the step's number, and :meth:`Tracker.close` ends the tracker's run.
The trackers' own settings (``WANDB_PROJECT``, ``MLFLOW_TRACKING_URI``, offline modes...) are
theirs: treeprep passes the project (``TREEPREP_PROJECT``, default ``treeprep``), the run folder's
name and the run's config, nothing else.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable
from typing import Any

from treeprep.errors import TrainingError
from treeprep.modes import ReportTo

#: tracker -> the module it imports (the extra is the tracker's name)
MODULES: dict[ReportTo, str] = {
    ReportTo.tensorboard: "torch.utils.tensorboard",
    ReportTo.wandb: "wandb",
    ReportTo.mlflow: "mlflow",
    ReportTo.trackio: "trackio",
}


def install_command(extra: str) -> str:
    """The pip command that installs an extra of treeprep."""
    return f"pip install 'treeprep[{extra}]'"


def _import(name: ReportTo) -> Any:
    try:
        return importlib.import_module(MODULES[name])
    except ImportError as e:
        raise TrainingError(
            f"--report-to {name} needs the {name} extra, which is not installed: "
            f"{install_command(name)}"
        ) from e


def require(names: Iterable[str]) -> None:
    """Refuse (a :class:`TrainingError` naming the extra and its pip command) a tracker whose
    package is not installed; called before the run loads anything."""
    for n in names:
        _import(ReportTo(n))


class Tracker:
    """One tracker's run: :meth:`log` a step's metrics, :meth:`close` at the end."""

    def __init__(self, name: ReportTo, run_dir: str, config: dict[str, Any]) -> None:
        self.name = name
        mod = _import(name)
        project = os.environ.get("TREEPREP_PROJECT", "treeprep")
        run_name = os.path.basename(os.path.normpath(run_dir))
        self.handle: Any
        if name == ReportTo.tensorboard:
            self.handle = mod.SummaryWriter(os.path.join(run_dir, "tensorboard"))
        elif name == ReportTo.wandb:
            self.handle = mod.init(project=project, name=run_name, dir=run_dir, config=config)
        elif name == ReportTo.mlflow:
            mod.set_experiment(project)
            self.handle = mod.start_run(run_name=run_name)
            mod.log_params({k: str(v)[:250] for k, v in config.items()})
        else:
            self.handle = mod.init(project=project, name=run_name, config=config)
        self.mod = mod

    def log(self, metrics: dict[str, Any], step: int) -> None:
        scalars = {
            f"train/{k}": float(v)
            for k, v in metrics.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and k != "step"
        }
        if self.name == ReportTo.tensorboard:
            for k, v in scalars.items():
                self.handle.add_scalar(k, v, step)
        elif self.name == ReportTo.wandb:
            self.handle.log(scalars, step=step)
        elif self.name == ReportTo.mlflow:
            self.mod.log_metrics({k.replace("/", "."): v for k, v in scalars.items()}, step=step)
        else:
            self.mod.log(scalars, step=step)

    def close(self) -> None:
        if self.name == ReportTo.tensorboard:
            self.handle.close()
        elif self.name == ReportTo.wandb:
            self.handle.finish()
        elif self.name == ReportTo.mlflow:
            self.mod.end_run()
        else:
            self.mod.finish()


def open_trackers(names: Iterable[str], run_dir: str, config: dict[str, Any]) -> list[Tracker]:
    """A started :class:`Tracker` per name (the main rank only calls this)."""
    return [Tracker(ReportTo(n), run_dir, config) for n in names]
