"""transformers Trainer callbacks for the resume tests: a run killed after its first checkpoint, and where a run
began."""

from __future__ import annotations

from transformers import TrainerCallback


class Interrupt(TrainerCallback):
    """Stops the run like a killed process, right after its first checkpoint is on disk."""

    def on_save(self, args, state, control, **kwargs):
        raise KeyboardInterrupt


class RecordStart(TrainerCallback):
    def on_train_begin(self, args, state, control, **kwargs):
        self.start_step = state.global_step
