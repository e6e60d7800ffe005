"""Issue 39 item 5: a missing build, an unfinished one and a plan made for another build are
refused by ``treeprep train`` before torch and the model load (a large model takes a minute to
load; the refusal must not wait for it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from treeprep.build import BuildConfig, build

ROOT = Path(__file__).resolve().parents[2]


def _train(*args: str) -> tuple[int, str, bool]:
    """``treeprep train ARGS`` in a fresh interpreter: exit code, stderr, and whether torch was
    imported by the time it exited."""
    code = (
        "import sys, json\n"
        "from treeprep.cli.app import main\n"
        f"sys.argv = ['treeprep', 'train', *{list(args)!r}]\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as e:\n"
        "    print(json.dumps([e.code, 'torch' in sys.modules]))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    exit_code, torch_loaded = json.loads(r.stdout.strip().splitlines()[-1])
    return exit_code, " ".join(r.stderr.split()), torch_loaded


def test_a_missing_build_is_refused_before_torch(tmp_path: Path) -> None:
    code, err, torch_loaded = _train(str(tmp_path / "nothere"), "--model", "tiny-qwen3")
    assert code == 1 and "no manifest.json; not a finished treeprep build" in err
    assert not torch_loaded


def test_a_plan_of_another_build_is_refused_before_torch(tmp_path: Path) -> None:
    for name, text in (("a", "one"), ("b", "two")):
        (tmp_path / f"{name}.jsonl").write_text(
            json.dumps({"messages": [{"role": "user", "content": text},
                                     {"role": "assistant", "content": text}]}) + "\n"
        )  # fmt: skip
        build(BuildConfig(inputs=[str(tmp_path / f"{name}.jsonl")], out=str(tmp_path / name)))
    from treeprep.pack import PackConfig, pack

    plan, _ = pack(str(tmp_path / "b"), PackConfig(budget=256, name="p"))
    code, err, torch_loaded = _train(str(tmp_path / "a"), "--model", "tiny-qwen3",
                                     "--plan", str(plan))  # fmt: skip
    assert code == 1 and "plan was made for another build" in err
    assert not torch_loaded
