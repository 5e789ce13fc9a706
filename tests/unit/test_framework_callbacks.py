"""The Lightning callback and the Hugging Face TrainerCallback, each in a real (CPU, single
process) training run under `fdtrace run`, next to the shim's own marks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.helpers import FDTRACE

STEPS = 3

LIGHTNING = """
import torch, lightning as L
from torch.utils.data import DataLoader, TensorDataset
from fdtrace.integrations.phases.lightning import FdtracePhases

class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
    def training_step(self, batch, index):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)
    def validation_step(self, batch, index):
        x, y = batch
        self.log("val", torch.nn.functional.mse_loss(self.layer(x), y))
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

torch.manual_seed(0)
data = TensorDataset(torch.randn(12, 8), torch.randn(12, 1))
trainer = L.Trainer(max_steps=3, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                    limit_val_batches=1, callbacks=[FdtracePhases()])
trainer.fit(Model(), DataLoader(data, batch_size=4), DataLoader(data, batch_size=4))
"""

HUGGINGFACE = """
import sys, torch
from torch.utils.data import Dataset
from transformers import Trainer, TrainingArguments
from fdtrace.integrations.phases.huggingface import FdtracePhasesCallback

class Data(Dataset):
    def __init__(self):
        torch.manual_seed(0)
        self.x, self.y = torch.randn(12, 8), torch.randn(12, 1)
    def __len__(self):
        return 12
    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
    def forward(self, x, labels=None):
        out = self.layer(x)
        return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}

args = TrainingArguments(output_dir=sys.argv[1], max_steps=3, per_device_train_batch_size=4, report_to=[],
                         save_strategy="no", logging_strategy="no", use_cpu=True, disable_tqdm=True)
Trainer(model=Model(), args=args, train_dataset=Data(), callbacks=[FdtracePhasesCallback()]).train()
"""


def run_under_fdtrace(script: str, tmp_path: Path, *args: str) -> pd.DataFrame:
    out = tmp_path / "phases.jsonl"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HOME=str(tmp_path / "hf"),
               FDTRACE_RUNS_DIR=str(tmp_path))
    result = subprocess.run([FDTRACE, "run", "--phases-out", str(out), "--", sys.executable, "-c", script, *args],
                            capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    return pd.DataFrame([json.loads(line) for line in out.read_text().splitlines()])


def inside(inner: pd.DataFrame, outer: pd.DataFrame) -> bool:
    """Each inner span lies within the outer span of the same position."""
    inner, outer = inner.sort_values("start_mono_ns"), outer.sort_values("start_mono_ns")
    return len(inner) == len(outer) and bool(
        (inner["start_mono_ns"].to_numpy() >= outer["start_mono_ns"].to_numpy()).all()
        and (inner["end_mono_ns"].to_numpy() <= outer["end_mono_ns"].to_numpy()).all())


def test_lightning_callback_marks_forward_backward_optimizer_and_validation(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    phases = run_under_fdtrace(LIGHTNING, tmp_path)
    marks = phases[phases["source"] == "lightning"]
    shim = phases[phases["source"] == "shim"]
    for phase in ("forward", "backward", "optimizer"):
        assert marks[marks["phase"] == phase]["step"].tolist() == list(range(STEPS)), phase
    assert set(marks[marks["phase"] == "optimizer"]["name"]) == {"SGD"}
    assert marks[marks["phase"] == "user"]["name"].tolist() == ["validation"]
    steps = marks[marks["phase"] != "user"]
    per_step = steps.pivot_table(index="step", columns="phase", values="start_mono_ns", aggfunc="min")
    assert (per_step["forward"] < per_step["backward"]).all() and (per_step["backward"] < per_step["optimizer"]).all()
    # The shim's backward (torch.autograd.backward) lies inside Lightning's. Lightning runs the
    # step's forward and backward in the optimizer's closure, so its backward lies inside the
    # shim's optimizer phase (torch's step hooks), and its own optimizer phase begins in it.
    assert inside(shim[shim["phase"] == "backward"], marks[marks["phase"] == "backward"])
    assert inside(marks[marks["phase"] == "backward"], shim[shim["phase"] == "optimizer"])
    theirs = shim[shim["phase"] == "optimizer"].sort_values("start_mono_ns")
    ours = marks[marks["phase"] == "optimizer"].sort_values("start_mono_ns")
    assert (ours["start_mono_ns"].to_numpy() >= theirs["start_mono_ns"].to_numpy()).all()
    assert (ours["start_mono_ns"].to_numpy() <= theirs["end_mono_ns"].to_numpy()).all()


def test_huggingface_callback_marks_train_steps_and_optimizer_steps(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    phases = run_under_fdtrace(HUGGINGFACE, tmp_path, str(tmp_path / "out"))
    marks = phases[phases["source"] == "huggingface"]
    shim = phases[phases["source"] == "shim"]
    steps = marks[(marks["phase"] == "user") & (marks["name"] == "train_step")]
    assert steps["step"].tolist() == list(range(STEPS))
    assert marks[(marks["phase"] == "user") & (marks["name"] == "train")]["step"].tolist() == [0]
    optimizer = marks[marks["phase"] == "optimizer"]
    assert optimizer["step"].tolist() == list(range(STEPS))
    assert inside(optimizer, steps) and inside(shim[shim["phase"] == "optimizer"], optimizer)
    assert len(shim[shim["phase"] == "backward"]) == STEPS


def test_without_fdtrace_run_the_callbacks_do_nothing() -> None:
    pytest.importorskip("lightning")
    from fdtrace.integrations.phases.lightning import FdtracePhases

    callback = FdtracePhases()
    callback.on_train_batch_start(None, None, None, 0)
    callback.on_before_backward(None, None, None)
    assert callback.marks._open == {}
