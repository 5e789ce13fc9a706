"""A Hugging Face ``TrainerCallback`` that marks training phases:
``Trainer(..., callbacks=[FdtracePhasesCallback()])``.

Under `fdtrace run` the marks land beside the shim's (``source`` "huggingface"); elsewhere the
callback does nothing. Phases: ``user`` "train_step" (a whole optimizer step, all its
gradient-accumulation micro-batches), ``optimizer`` (the optimizer's step itself), and ``user``
"train" around the whole training loop. Hugging Face gives no hook between forward and backward:
under DDP the shim marks those.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from fdtrace.integrations.phases.api import Marks


class FdtracePhasesCallback(TrainerCallback):  # type: ignore[misc,unused-ignore]
    """Marks train steps, optimizer steps and the training loop for fdtrace."""

    def __init__(self) -> None:
        self.marks = Marks("huggingface")

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.marks.begin("user", "train")

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.marks.end("user", "train_step")
        self.marks.end("user", "train")

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.marks.begin("user", "train_step")

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.marks.begin("optimizer")

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.marks.end("optimizer")

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.marks.end("user", "train_step")
