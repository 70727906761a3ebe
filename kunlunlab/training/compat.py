"""What differs between the library versions the project's extras allow, chosen by capability, not by version.

The CPU lock (``constraints.txt``) has transformers 5.22 (pyproject.toml keeps it below 5.23, which deprecated the
``is_gradient_checkpointing`` that TRL 1.16 reads at every RL step); the ``gpu`` extra resolves 5.17 (vLLM 0.31 caps
it below 5.18, ``constraints-gpu.txt``), and so does the GPU image. Transformers 5.2x renamed
``gradient_checkpointing`` to ``activation_checkpointing`` (the old name a deprecated alias, warning on use); 5.17
knows only the old name, so passing the new one raised ``TypeError`` in every training stage on a GPU node (issue 42).
Which name a ``TrainingArguments`` takes is read off its fields, so the code runs on either without a warning to hide.
"""
from __future__ import annotations

import dataclasses
import functools

from transformers import TrainingArguments


@functools.cache
def _training_argument_names() -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(TrainingArguments))


def checkpointing_args(enabled: bool) -> dict:
    """The keyword that switches activation (gradient) checkpointing on a Trainer's arguments: the current name
    where this transformers has it, else the name before the rename."""
    name = "activation_checkpointing" if "activation_checkpointing" in _training_argument_names() else \
        "gradient_checkpointing"
    return {name: enabled}
