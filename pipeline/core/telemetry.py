"""Nothing the tool runs sends anything anywhere: the libraries' own telemetry, turned off the way each documents.

Two libraries of the dependency set phone home by default (a tiny ``all`` through a recording proxy: 49
``CONNECT www.google-analytics.com:443`` and 3 ``CONNECT mobile.events.data.microsoft.com:443``):

* **ONNX Runtime** (1.29 and later, official non-Windows builds): 1DS telemetry to
  ``mobile.events.data.microsoft.com``. ``ORT_DISABLE_TELEMETRY=1``, set before ONNX Runtime initializes, turns it
  off for the process: no uploader, no events, no device id (ONNX Runtime's docs/Privacy.md, "Disabling
  Telemetry"). :func:`environment_opt_out` sets it when ``pipeline`` is imported, so every child process (the
  isolated runtimes, ``benchmark_app``) inherits it.
* **OpenVINO's model converter** (``openvino.convert_model``, ovc, through the openvino-telemetry package): usage
  events to Google Analytics, sent when the consent file ``~/intel/openvino_telemetry`` is absent or holds ``1``
  (docs.openvino.ai, "OpenVINO Telemetry": ``opt_in_out --opt_out``, which writes ``0`` there; OpenVINO's own CI
  writes the file the same way). ``import openvino`` alone sends an event (``openvino.tools.ovc`` is imported with
  it), so :func:`openvino_opt_out` runs just before the first import of ``openvino`` in a process, wherever that
  import is (a stage, a runtime's child process, a user's model file): it writes ``0`` when there is no consent
  file yet, and not through ``opt_in_out``, which itself sends an "opted out" event.

A user's own explicit choice is kept: an ``ORT_DISABLE_TELEMETRY`` already in the environment (``0`` opts in), and
a consent file that already exists (``1``: the user opted in with ``opt_in_out --opt_in`` or OpenVINO's installer;
the log says so once). docs/run-directory.md, "What the tool sends": the list, and how it was measured.
"""

from __future__ import annotations

import functools
import importlib.abc
import logging
import os
import sys
from pathlib import Path

log = logging.getLogger("pipeline")

# Environment variables that turn a library's telemetry off, each as its library documents it.
ENVIRONMENT = {
    "ORT_DISABLE_TELEMETRY": "1",  # ONNX Runtime: docs/Privacy.md, "Disabling Telemetry"
}

OPENVINO_DECLINED = "0"  # what `opt_in_out --opt_out` writes; "1" is consent, anything else declines


def opt_out() -> None:
    """Every opt-out, for this process and the children it starts: :data:`ENVIRONMENT` now (keeping any value already
    set), OpenVINO's consent just before ``openvino`` is first imported. Called when ``pipeline`` is imported."""
    for name, value in ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    if "openvino" not in sys.modules and not any(isinstance(f, _BeforeImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _BeforeImport("openvino", openvino_opt_out))


class _BeforeImport(importlib.abc.MetaPathFinder):
    """Runs ``action`` once, just before the first import of the top-level module ``name``, then steps aside (the
    import itself is left to the other finders)."""

    def __init__(self, name: str, action) -> None:
        self.name, self.action = name, action

    def find_spec(self, fullname, path=None, target=None) -> None:
        if fullname == self.name:
            sys.meta_path.remove(self)
            self.action()


def openvino_consent_file() -> Path:
    """Where openvino-telemetry reads the user's consent (``$HOME/intel/openvino_telemetry`` on Linux and macOS)."""
    return Path.home() / "intel" / "openvino_telemetry"


@functools.cache
def openvino_opt_out() -> str:
    """Decline OpenVINO's telemetry: write the consent file with ``0`` where there is none. Returns what was found
    or done (``"declined"``, ``"written"``, ``"consented"`` or ``"unwritable"``), and logs the last three once."""
    path = openvino_consent_file()
    if not path.exists() and not path.is_symlink():
        try:
            path.parent.mkdir(exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
        except FileExistsError:
            pass  # another process wrote it meanwhile: what it holds is read below
        except OSError as exc:
            log.warning("warning: OpenVINO's telemetry could not be turned off (%s: %s); it may send usage data to "
                        "Google Analytics: run `opt_in_out --opt_out`", path, exc.strerror or exc)
            return "unwritable"
        else:
            with os.fdopen(fd, "w") as f:
                f.write(OPENVINO_DECLINED)
            log.info("OpenVINO telemetry turned off for this user: wrote %s (%s), as `opt_in_out --opt_out` does",
                     path, OPENVINO_DECLINED)
            return "written"
    if _consent(path) == "1":
        log.info("OpenVINO's converter sends usage data to Google Analytics: %s holds 1 (this user opted in); "
                 "`opt_in_out --opt_out` stops it", path)
        return "consented"
    return "declined"


def _consent(path: Path) -> str:
    """What the consent file holds, as openvino-telemetry reads it (its first line); "" where it cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.readline().strip()
    except OSError:
        return ""
