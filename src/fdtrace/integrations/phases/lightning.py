"""A Lightning callback that marks training phases: ``Trainer(callbacks=[FdtracePhases()])``.

Under `fdtrace run` the marks land beside the shim's (``source`` "lightning"); elsewhere the
callback does nothing. Phases: ``forward`` (batch start to the loss's backward), ``backward``,
``optimizer`` (from Lightning's before-optimizer-step hook to the batch's end, so zeroing the
gradients is in it), and the ``user`` phases ``validation`` and ``test`` around those loops.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import Callback

from fdtrace.integrations.phases.api import Marks


class FdtracePhases(Callback):
    """Marks forward, backward, optimizer, validation and test phases for fdtrace."""

    def __init__(self) -> None:
        super().__init__()
        self.marks = Marks("lightning")

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.marks.begin("forward")

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        self.marks.end("forward")
        self.marks.begin("backward")

    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        self.marks.end("backward")

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self.marks.begin("optimizer", type(optimizer).__name__)
        self._optimizer = type(optimizer).__name__

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.marks.end("forward")  # a batch that skipped its backward
        self.marks.end("optimizer", getattr(self, "_optimizer", None))

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self.marks.begin("user", "validation")

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self.marks.end("user", "validation")

    def on_test_start(self, trainer: Any, pl_module: Any) -> None:
        self.marks.begin("user", "test")

    def on_test_end(self, trainer: Any, pl_module: Any) -> None:
        self.marks.end("user", "test")
