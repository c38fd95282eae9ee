"""Checkpoint files: written atomically, read back only when they are this tool's format."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from pipeline.core import modeling
from pipeline.core.errors import InputError
from pipeline.core.run import atomic_path

log = logging.getLogger("pipeline")


CHECKPOINT_FORMAT = "pipeline.checkpoint/1"


def save_checkpoint(path: Path, state: dict) -> None:
    with atomic_path(path) as tmp:
        torch.save(state, tmp)


def load_checkpoint(path: Path) -> dict:
    state = modeling.safe_torch_load(path, what="checkpoint")
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise InputError(f"{path} is not a pipeline checkpoint; re-run train without --resume")
    return state
