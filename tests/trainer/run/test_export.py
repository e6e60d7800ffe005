"""Issue 39 item 2: the trained model out of a run. ``RUN/final/`` (and ``treeprep export-model``)
is a Hugging Face folder that plain transformers, peft and ``AutoTokenizer`` load from another
working directory; its logits equal the trained model's (treeprep's tree attention on the
checkpoint's weights) to float32 rounding, and a merged LoRA export equals the adapter's."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from test_train import cfg, data  # noqa: E402, F401  (the build fixture)
from typer.testing import CliRunner  # noqa: E402

from treeprep.errors import TrainingError, TreeprepError  # noqa: E402
from treeprep.trainer import load_model, tree_logits  # noqa: E402
from treeprep.trainer.batch import TreeBatch  # noqa: E402
from treeprep.trainer.run.export import MARKER, export_model, pick_checkpoint, trained_model  # noqa: E402
from treeprep.trainer.run.loop import train  # noqa: E402

IDS = list(range(40, 90))


def _row() -> dict:
    n = len(IDS)
    return {
        "group_id": "g", "input_ids": IDS, "node_parent": [-1], "node_offset": [0],
        "node_length": [n], "node_depth": [0], "node_last": [0], "seq_node": [0],
        "seq_count": [1], "seq_loss_spans": [[1, n]], "seq_logprobs": [None],
        "seq_advantage": [None], "seq_reward": [None],
    }  # fmt: skip


def _trained_logits(run: Path) -> torch.Tensor:
    """The checkpoint's weights in treeprep's own model, on one path (the reference)."""
    lm = trained_model(pick_checkpoint(str(run)))
    with torch.no_grad():
        return tree_logits(lm, TreeBatch.from_trees([_row()]))


def _plain_logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([IDS])).logits[0]


def test_a_run_ends_with_a_final_folder_that_loads_from_anywhere(
    data: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import transformers as tf

    from treeprep.render.builtin import load_builtin

    run = tmp_path / "run"
    res = train(cfg(data, run, steps=2, keep=1))
    assert res.final == str(run / "final")
    ref = _trained_logits(run)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    final = str(run / "final")
    model = tf.AutoModelForCausalLM.from_pretrained(final)
    tok = tf.AutoTokenizer.from_pretrained(final)
    init = load_model("tiny-qwen3", vocab_size=model.config.vocab_size)
    assert not torch.equal(init.lm_head.weight, model.lm_head.weight)  # the trained weights
    torch.testing.assert_close(_plain_logits(model), ref, rtol=1e-5, atol=1e-5)
    # the build's tokenizer (a preset run: the built-in byte tokenizer), chat template included
    msgs = [{"role": "user", "content": "héllo"}, {"role": "assistant", "content": "hi"}]
    builtin = load_builtin()
    assert tok.apply_chat_template(msgs, tokenize=False) == builtin.apply_chat_template(
        msgs, tokenize=False
    )
    assert tok("héllo <think>")["input_ids"] == builtin("héllo <think>")["input_ids"]
    assert os.path.isfile(os.path.join(final, "generation_config.json"))
    assert os.path.isfile(os.path.join(final, "model.safetensors"))
    # the final folder survives the rotation of checkpoints by --keep
    train(cfg(data, run, steps=3, keep=1, resume="auto"))
    assert json.loads((run / "final" / MARKER).read_text())["step"] == 3


def test_lora_adapter_and_merged_exports_load_after_a_move(
    data: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 53 item 5: a preset's base is named relative to ``final/`` (it was an absolute path,
    so a moved run failed to load) and ``task_type`` is ``CAUSAL_LM`` (it was null)."""
    import transformers as tf
    from peft import AutoPeftModelForCausalLM, PeftModel

    run = tmp_path / "run"
    train(cfg(data, run, steps=2, lora_r=4, lr=3e-2))
    ref = _trained_logits(run)
    merged = tmp_path / "merged"
    export_model(str(run), str(merged), merge=True)
    final = tmp_path / "moved" / "final"
    os.rename(run, tmp_path / "moved")  # the run moves; its old place is gone
    adapter_cfg = json.loads((final / "adapter_config.json").read_text())
    assert adapter_cfg["base_model_name_or_path"] == "base"  # a preset's base, written inside
    assert adapter_cfg["task_type"] == "CAUSAL_LM"
    monkeypatch.chdir(final)  # peft resolves a relative base against the working directory
    peft_model = AutoPeftModelForCausalLM.from_pretrained(str(final))
    adapter_logits = _plain_logits(peft_model)
    torch.testing.assert_close(adapter_logits, ref, rtol=1e-5, atol=1e-5)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # from anywhere, with the base named
    base = tf.AutoModelForCausalLM.from_pretrained(str(final / "base"))
    peft_model = PeftModel.from_pretrained(base, str(final))
    torch.testing.assert_close(_plain_logits(peft_model), ref, rtol=1e-5, atol=1e-5)
    # final/ is also a model folder with an embedded adapter: transformers loads both, anywhere
    embedded = tf.AutoModelForCausalLM.from_pretrained(str(final))
    assert any("lora_A" in k for k in embedded.state_dict())
    torch.testing.assert_close(_plain_logits(embedded), ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(TreeprepError, match="a LoRA adapter beside its base"):
        load_model(str(final))  # treeprep would train the base under a frozen adapter
    torch.testing.assert_close(adapter_logits, ref, rtol=1e-5, atol=1e-5)
    plain = tf.AutoModelForCausalLM.from_pretrained(str(merged))
    assert not any("lora" in k for k in plain.state_dict())
    torch.testing.assert_close(_plain_logits(plain), adapter_logits, rtol=1e-5, atol=1e-5)
    assert tf.AutoTokenizer.from_pretrained(str(merged)).chat_template


def test_export_model_cli_picks_a_step_and_never_overwrites_another_folder(
    data: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    import transformers

    from treeprep.cli.app import app

    run = tmp_path / "run"
    train(cfg(data, run, steps=2, save_every=1, keep=None))
    out = tmp_path / "step1"
    transformers.utils.logging.enable_progress_bar()  # as in a fresh process
    r = CliRunner().invoke(app, ["export-model", str(run), "--step", "1", "-o", str(out)])
    assert r.exit_code == 0, r.output
    # issue 53 item 10: one line, and transformers' loading/saving bars off (a model folder's
    # from_pretrained drew them)
    assert r.output == f"wrote {out}\n"
    assert not transformers.utils.logging.is_progress_bar_enabled()
    assert json.loads((out / MARKER).read_text())["step"] == 1
    r = CliRunner().invoke(app, ["export-model", str(run), "-o", str(out)])  # an export: replaced
    assert r.exit_code == 0, r.output
    assert json.loads((out / MARKER).read_text())["step"] == 2
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    r = CliRunner().invoke(app, ["export-model", str(run), "-o", str(other)])
    assert r.exit_code == 1 and "not an earlier export" in str(r.exception)
    assert (other / "notes.txt").read_text() == "mine"
    r = CliRunner().invoke(app, ["export-model", str(run), "--step", "7", "-o", str(out)])
    assert r.exit_code == 1 and "no checkpoint of step 7 (kept: 1, 2)" in str(r.exception)
    with pytest.raises(TrainingError, match="--merge is for LoRA runs"):
        export_model(str(run), str(out), merge=True)
