"""The model registry (the repository's ``models/`` package), always the tool's own.

``python -m pipeline`` puts the current directory first on ``sys.path``, and ``models`` is the most common
folder name in an ML project: a plain ``import models`` would import (and run) a user's ``models/__init__.py``
instead of the registry. The registry is therefore loaded from its file location beside this package, under
its usual name (its modules import ``from models import register_model``), before anything else can claim
that name. Import it as ``from pipeline.core.registry import models``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2] / "models"


def _ours(module: ModuleType | None) -> bool:
    file = getattr(module, "__file__", None)
    return file is not None and Path(file).resolve().parent == ROOT


def _load() -> ModuleType:
    if _ours(sys.modules.get("models")):
        return sys.modules["models"]
    for name in [n for n in sys.modules if n == "models" or n.startswith("models.")]:
        del sys.modules[name]  # a user's own `models` package: not the registry
    spec = importlib.util.spec_from_file_location("models", ROOT / "__init__.py",
                                                  submodule_search_locations=[str(ROOT)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["models"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["models"]
        raise
    return module


models = _load()
