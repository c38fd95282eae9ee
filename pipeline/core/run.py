"""The run directory: atomic writes, the manifest, the lock, and per-stage bookkeeping.

Every file the pipeline writes goes through :func:`atomic_path` (temporary file in the same
directory, fsync, rename), so a crash leaves the old file or the new one, never a torn one.
``manifest.json`` records, per stage: status (ok / skipped / failed / interrupted / running),
times, the fingerprint of its inputs, the artifacts it wrote with their sha256, and details.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import hashlib
import json
import logging
import os
import shutil
import signal
import stat
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, TypeVar

from pipeline.core.artifacts import CONFIG, IR_TEMP_PREFIX, ISOLATE_PREFIX, LOCK, LOGS, MANIFEST, OPENVINO_DIR  # noqa: F401
from pipeline.core.errors import (
    InputError,
    PipelineError,
    StageFailed,
    UsageError,
    check_interrupt,
    disk_full,
    disk_full_cause,
    is_interrupt,
)

# CONFIG: re-exported for callers
from pipeline.core.status import Status

NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)  # as pipeline.core.schema's


def open_confined(path: str | Path):
    """:func:`pipeline.core.schema.open_confined`, imported on first use: pydantic (a fifth of a second) stays out
    of the isolate child, which reads nothing untrusted."""
    from pipeline.core.schema import open_confined as confined_open

    return confined_open(path)

if TYPE_CHECKING:  # annotations only; pydantic is imported where a record is read: `--help` stays light
    from pipeline.core.config_schema import Config
    from pipeline.core.manifest import Artifact, StageEntry
    from pipeline.core.records import BuildRecord, ExportRecord, StageDetails, TrainRecord, VerifyRecord

    Record = TypeVar("Record", bound=StageDetails)

SCHEMA = "pipeline.manifest/1"

log = logging.getLogger("pipeline")


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def refuse_symlink(path: Path) -> None:
    """A file the pipeline writes or locks must not be a symbolic link: writing through one would
    change a file outside the run directory (the link's target), so it is refused, never followed."""
    if path.is_symlink():
        raise UsageError(f"refusing to write {path}: it is a symbolic link (to {os.readlink(path)}); the run "
                         "directory holds plain files only: remove the link or use another --run-dir")


def _open_error(path: Path, exc: OSError) -> PipelineError:
    """``ELOOP`` from ``O_NOFOLLOW`` is a symbolic link that appeared after :func:`refuse_symlink` looked."""
    if exc.errno == errno.ELOOP:
        return UsageError(f"refusing to write {path}: it is a symbolic link; the run directory holds plain "
                          "files only: remove the link or use another --run-dir")
    return _write_error(path, exc)


RUN_FOLDER = "the run directory holds plain files only: remove it or use another --run-dir"


def confined(root: Path, name: str | Path, holder: str = RUN_FOLDER) -> Path:
    """``root / name`` after checking that it stays inside ``root``: no component of ``name`` is a symbolic link
    (a link could point a read or a write at any file outside), ``..`` or absolute, and what exists there is a
    regular file or a folder. Otherwise one :class:`UsageError` (exit 2) naming the path, then ``holder``: what
    ``root`` is and what to do (the run directory's words by default; a baseline bundle has its own)."""
    relative = Path(name)
    if relative.is_absolute() or ".." in relative.parts:
        raise UsageError(f"refusing {name}: not a path inside {root}")
    path = Path(root)
    for part in relative.parts:
        path = path / part
        if path.is_symlink():
            raise UsageError(f"refusing to use {path}: it is a symbolic link (to {os.readlink(path)}); {holder}")
    if path.exists() and not (path.is_file() or path.is_dir()):
        raise UsageError(f"refusing to use {path}: not a regular file (a pipe or a device); {holder}")
    return path


def open_append(path: str | Path):
    """``path`` opened for appending text (created if missing), never through a symbolic link."""
    path = Path(path)
    refuse_symlink(path)
    own(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | NOFOLLOW, 0o666)
    except OSError as exc:
        raise _open_error(path, exc) from None
    return os.fdopen(fd, "a", encoding="utf-8")


TEMP_PREFIX = "."
TEMP_SUFFIX = ".tmp"


def _umask() -> int:
    """The process umask, read without changing it where the kernel tells it (Linux >= 4.7)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def umask() -> int:
    """The process umask (what a file or folder the user creates gets masked with)."""
    return _umask()


def _final_mode(path: Path) -> int:
    """Permissions the finished file gets: those of the file it replaces, else what ``open()`` would give.

    ``mkstemp`` creates its file with mode 0600; without this every artifact would be private to its
    owner, unlike a file the user writes (and unreadable from a container running as another user).
    """
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return 0o666 & ~_umask()


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it replaces ``path`` in one rename.

    On any failure the temporary file is removed and ``path`` is left as it was. A full disk or
    a read-only directory becomes one clear error instead of a traceback, also when the writer
    (``torch.save``, safetensors) reports the full disk as its own exception type. A process killed
    mid-write leaves a ``.<name>.*.tmp`` file, which the next :meth:`RunDir.locked` removes.
    """
    path = Path(path)
    refuse_symlink(path)
    own(path)
    tmp = None
    try:
        with signals_held():  # a Ctrl-C lands once `tmp` is known, so the cleanup below removes it
            fd, tmp_name = tempfile.mkstemp(prefix=f"{TEMP_PREFIX}{path.name}.", suffix=TEMP_SUFFIX, dir=path.parent)
            os.close(fd)
            tmp = Path(tmp_name)
        yield tmp
        fd = os.open(tmp, os.O_RDWR | NOFOLLOW)  # the writer left a plain file here, not a link to one
        try:
            os.fsync(fd)
            os.fchmod(fd, _final_mode(path))
        finally:
            os.close(fd)
        refuse_symlink(path)  # planted while the writer ran: never replace, never follow
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except OSError as exc:
        _remove(tmp)
        raise _write_error(path, exc) from None
    except Exception as exc:
        full = not isinstance(exc, PipelineError) and _disk_full(exc, path.parent)
        _remove(tmp)
        if full:
            raise _write_error(path, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))) from None
        raise
    except BaseException:
        _remove(tmp)
        raise


def _remove(tmp: Path | None) -> None:
    if tmp is not None:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def signals_held() -> Iterator[list[int]]:
    """Hold SIGINT/SIGTERM for a few statements; one that arrived is raised again when they end.

    A handler that only takes note, rather than a blocked signal mask: the mask is per thread, and the
    kernel hands a process signal to any thread that does not block it (torch's and ONNX Runtime's
    threads), whose C handler then runs the Python handler in the main thread anyway. The block gets the list of
    the signals noted so far (``with signals_held() as held``): a test waits on it rather than on a clock.
    """
    caught: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield caught  # signal handlers belong to the main thread
        return
    previous = {sig: signal.signal(sig, lambda signum, frame: caught.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield caught
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if caught:
            _deliver(caught[0], previous[caught[0]])


def _deliver(signum: int, handler) -> None:
    """The held signal, to the handler in force again, here and now: called directly when it is Python's (Python's
    default for SIGINT raises KeyboardInterrupt at once; a signal raised again could reach another thread first and
    the main thread only later, outside the caller's ``except``); otherwise raised again for the default action."""
    if callable(handler):
        handler(signum, None)
    elif handler != signal.SIG_IGN:
        signal.raise_signal(signum)


def _failure(exc: Exception) -> dict:
    """What the manifest records of a stage that failed: its one line, and its exit code where it is known."""
    if isinstance(exc, PipelineError):
        return {"error": str(exc), "exit_code": exc.exit_code}
    full = disk_full(exc)  # recorded as the command line reports it
    return {"error": str(full), "exit_code": full.exit_code} if full else {"error": f"{type(exc).__name__}: {exc}"}


def _disk_full(exc: BaseException, directory: Path) -> bool:
    """Whether a writer's exception is a full disk in disguise (torch.save raises a bare RuntimeError)."""
    if disk_full_cause(exc) is not None:
        return True
    try:
        return os.statvfs(directory).f_bavail == 0
    except OSError:
        return False


def _write_error(path: Path, exc: OSError) -> PipelineError:
    if exc.errno == errno.ENOSPC:
        return StageFailed(f"cannot write {path}: no space left on device (nothing was replaced)")
    if exc.errno in (errno.EACCES, errno.EROFS, errno.EPERM):
        return UsageError(f"cannot write {path}: {os.strerror(exc.errno)}")
    return StageFailed(f"cannot write {path}: {exc.strerror or exc}")


SCRATCH_PREFIX = "pipeline-scratch."


@contextlib.contextmanager
def scratch_folder(*sources: Path) -> Iterator[Path]:
    """A private temporary folder outside the run directory, holding copies of ``sources``; removed afterwards.

    Libraries that write files of their own (ModelOpt writes ``model_reconciled.onnx`` beside its input, and
    rewrites its input in place) get this copy, never the run directory: only the artifacts the pipeline
    owns enter the run directory, through :func:`install`. Each source is read through :func:`confined_file`.
    """
    folder = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}."))  # the pid: see remove_orphaned_scratch
    try:
        for source in sources:
            with open_confined(source) as src, open(folder / Path(source).name, "wb") as dst:
                shutil.copyfileobj(src, dst)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def remove_orphaned_scratch() -> list[Path]:
    """Scratch folders (:func:`scratch_folder`) of processes that no longer run: killed before they removed them."""
    removed = []
    for folder in Path(tempfile.gettempdir()).glob(f"{SCRATCH_PREFIX}*"):
        pid = folder.name[len(SCRATCH_PREFIX):].split(".")[0]
        if pid.isdigit() and not _alive(int(pid)) and _remove_real(folder, folder=True):
            removed.append(folder)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's process: alive, and not ours to clean up
    return True


def _remove_real(path: Path, *, folder: bool) -> bool:
    """Remove ``path`` if it is a real file (or folder, with what it holds), never a link; whether it was removed."""
    with contextlib.suppress(OSError):
        if path.is_symlink():
            return False
        if folder and path.is_dir():
            shutil.rmtree(path)
            return True
        if not folder and path.is_file():
            path.unlink()
            return True
    return False


def install(source: Path, path: str | Path) -> None:
    """Copy ``source`` (a file in a scratch folder) to ``path`` in the run directory through :func:`atomic_path`."""
    with atomic_path(path) as tmp:
        shutil.copyfile(source, tmp)


def atomic_write(path: str | Path, data: bytes | str) -> None:
    with atomic_path(path) as tmp:
        if isinstance(data, str):
            tmp.write_text(data, encoding="utf-8")
        else:
            tmp.write_bytes(data)


def write_json(path: str | Path, obj: Any) -> None:
    atomic_write(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def read_json(path: str | Path, what: str, *, keys: frozenset[str] | None = None) -> Any:
    """A JSON file the tool reads back, through the one reader (:func:`pipeline.core.schema.load_json`: no links,
    a size cap, a depth limit, no key given twice, ``keys`` the only top-level keys); a missing file raises
    :class:`FileNotFoundError`, anything else wrong is one :class:`InputError` (exit 2)."""
    from pipeline.core import schema

    if not Path(path).exists() and not Path(path).is_symlink():
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))
    return schema.load_json(path, what, keys=keys, says="is unreadable or corrupt")


def read_sidecar(path: Path, of: str, *, what: str, schema: str, author_key: str, rebuild: str,
                 why: str = "") -> dict:
    """The sidecar ``path`` of the artifact ``of`` (an engine, an OpenVINO IR): present, parseable, and written by
    this tool under ``schema``; otherwise :class:`InputError`, one line ending in ``rebuild``. The first of every
    check made before such an artifact is loaded; the callers then check its hashes and platform."""
    if not path.is_file():
        raise InputError(f"{of} has no sidecar {path.name}: only {what}s this tool wrote and recorded are "
                         f"loaded{why}; {rebuild}")
    try:
        sidecar = read_json(path, f"{what} sidecar")
    except InputError as exc:
        raise InputError(f"{exc}; refusing to load {of}; {rebuild}") from None
    if not isinstance(sidecar, dict) or sidecar.get("schema") != schema or \
            not str(sidecar.get(author_key, "")).startswith("pipeline "):
        raise InputError(f"{path.name} is not a pipeline {what} sidecar; refusing to load {of}; {rebuild}")
    return sidecar

# --------------------------------------------------------------------------- claiming a folder
#
# A run directory holds only what this tool wrote: before anything is written to a folder it is claimed. A folder
# without a manifest must be empty (the lock and a temporary file of an interrupted claim aside); a run's own folder
# may hold only its bookkeeping, the temporaries of an interrupted process, and the names its manifest lists (an
# artifact a stage recorded, or a name in its ledger ``files``, noted there before the file was first written).
# Anything else is the user's, whatever its name: the folder is refused (exit 2) before anything is written.

LEDGER = "files"  # the manifest's ledger: every top-level name this tool wrote in the run directory
BOOKKEEPING = frozenset({MANIFEST, CONFIG, LOCK, LOGS})


def _temporary(name: str) -> bool:
    """A file or folder an interrupted process of this tool leaves, which the next lock holder removes."""
    return (name.startswith(TEMP_PREFIX) and name.endswith(TEMP_SUFFIX)) or name.startswith(ISOLATE_PREFIX)


def owned_names(manifest: dict) -> frozenset[str]:
    """The top-level names a run's manifest says this tool wrote: its ledger and every stage's artifacts (only the
    names are read, of any manifest: a claim is refused before a damaged one is read)."""
    names = {str(name) for name in manifest.get(LEDGER) or ()}
    for entry in (manifest.get("stages") or {}).values():
        names |= {str(name).split("/")[0] for name in (entry.get("artifacts") or {} if isinstance(entry, dict)
                                                        else {})}
    return frozenset(names)


def foreign_entries(entries: list[str], manifest: dict | None) -> list[str]:
    """The entries of a folder (its top-level names) that this tool did not write, sorted: with no manifest (not a
    run yet) every entry but the lock and temporaries; with one, every entry that is neither bookkeeping, a
    temporary, nor a name the manifest lists (:func:`owned_names`)."""
    if manifest is None:  # only what an interrupted claim leaves: the lock, the manifest's temporary file
        return sorted(name for name in entries if name != LOCK and not (
            name.startswith(f"{TEMP_PREFIX}{MANIFEST}.") and name.endswith(TEMP_SUFFIX)))
    owned = BOOKKEEPING | owned_names(manifest)
    return sorted(name for name in entries if name not in owned and not _temporary(name))


def refuse_foreign(path: str | Path, manifest: dict | None = None) -> None:
    """Refuse (:class:`UsageError`, one line) a folder holding anything this tool did not write; nothing written.
    ``manifest``: the run's manifest as read already (read here from the folder when not given)."""
    path = Path(path)
    if not path.is_dir() or path.is_symlink():
        return
    if manifest is None and (path / MANIFEST).is_file():
        manifest = RunDir(path, create=False).manifest
    try:
        entries = os.listdir(path)
    except OSError as exc:
        raise UsageError(f"cannot read the run directory {path}: {exc.strerror or exc}") from None
    foreign = foreign_entries(entries, manifest)
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        what = "is not a run directory of this tool" if manifest is None else "holds files its manifest does not list"
        raise UsageError(f"refusing to use {path}: it {what} ({shown}); nothing of the user's is written over: "
                         "use a new or empty folder as --run-dir, or move those files away")


_LOCKED: dict[str, "RunDir"] = {}  # the run directories this process holds the lock of, by real path
_LOCKED_GUARD = threading.Lock()


def own(path: str | Path) -> None:
    """Note ``path`` in the ledger of the locked run directory that holds it, before it is first written (a write
    that a kill interrupts still leaves the name listed); anywhere else (a bundle, a scratch folder) nothing."""
    if not _LOCKED:
        return
    parent = os.path.realpath(Path(path).parent)
    for root, run in list(_LOCKED.items()):
        if parent == root:
            run.own(Path(path).name)
        elif parent.startswith(root + os.sep):
            run.own(Path(os.path.relpath(parent, root)).parts[0])


def make_folder(path: str | Path) -> Path:
    """``mkdir -p`` of a folder in the run directory, its name noted in the ledger first (:func:`own`)."""
    path = Path(path)
    own(path)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _digest(path: Path) -> Artifact:
    from pipeline.core.manifest import Artifact

    return Artifact(sha256=sha256_file(path), bytes=path.stat().st_size)


class StageRecord:
    """What a stage reports about itself while it runs: its :class:`~pipeline.core.manifest.StageEntry`, each change
    a new entry, put into the manifest (:meth:`StageEntry.to_json`) at once. ``details`` is the stage's own dict,
    which it fills while it runs (typed on read by :mod:`pipeline.core.records`)."""

    def __init__(self, run: "RunDir", name: str, entry: StageEntry, *, stored: bool = True):
        self.run = run
        self.name = name
        self.entry = entry
        self.details: dict = entry.details
        self.stored = stored  # False: a torchrun rank > 0, whose entry rank 0 keeps
        self._store()

    def _store(self) -> None:
        if self.stored:
            self.run.manifest["stages"][self.name] = self.entry.to_json()

    def update(self, **fields) -> None:
        """The entry with ``fields`` changed (the status, the run id, how it ended), put into the manifest."""
        self.entry = self.entry.model_copy(update=fields)
        self._store()

    def artifact(self, filename: str) -> Path:
        """Record a file this stage wrote and return its path; hashed now and again when the stage ends."""
        path = self.run.file(filename)
        self.update(artifacts={**self.entry.artifacts, filename: _digest(path)})
        return path

    def rehash(self) -> None:
        """Hash every recorded artifact as it is on disk when the stage ends: a later step of the stage (or a
        library) that touched a file after it was recorded cannot leave the manifest describing another file."""
        self.update(artifacts={name: _digest(self.run.file(name)) for name in self.entry.artifacts
                               if self.run.file(name).is_file()})

    def skip(self, reason: str) -> None:
        """Mark the stage ``skipped`` with the exact reason (it still ends normally)."""
        self.update(status=Status.SKIPPED, reason=reason)


NAME_ROOM = 64  # bytes a file the tool writes adds below the run directory (openvino/.ir.<random>/int8...onnx)


def _limit(path: Path, name: str, default: int) -> int:
    """``os.pathconf`` of the nearest folder of ``path`` that exists (the file system the run directory is on)."""
    probe = Path(os.path.abspath(path))
    while probe != probe.parent:
        try:
            return os.pathconf(probe, name)
        except (OSError, ValueError):  # absent, or itself too long: its folder
            probe = probe.parent
    return default


def check_path_length(path: str | Path, what: str = "run directory") -> None:
    """Refuse (:class:`UsageError`, exit 2) a path the file system cannot hold, before anything is made: a name longer
    than its NAME_MAX, or a path that leaves no room below it for the files the tool writes there."""
    path = Path(path)
    name_max = _limit(path, "PC_NAME_MAX", 255)
    for part in path.parts:
        if len(os.fsencode(part)) > name_max:
            raise UsageError(f"{what} {str(path)[:60]}...: the name {part[:40]!r}... is {len(os.fsencode(part))} "
                             f"bytes, more than the {name_max} this file system allows for one name; use a shorter "
                             "path")
    path_max = _limit(path, "PC_PATH_MAX", 4096)
    if len(os.fsencode(os.path.abspath(path))) + NAME_ROOM > path_max:
        raise UsageError(f"{what} {str(path)[:60]}...: the path is {len(os.fsencode(os.path.abspath(path)))} bytes; "
                         f"with the files written below it, more than the {path_max} this system allows; use a "
                         "shorter path")


class RunDir:
    """A run directory and its manifest. Use :meth:`locked` around any writing work."""

    def __init__(self, path: str | Path, *, create: bool = True):
        self.path = Path(path)
        check_path_length(self.path)
        if self.path.exists() and not self.path.is_dir():
            raise UsageError(f"run directory {self.path} exists and is not a directory")
        if create:
            try:
                self.path.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise UsageError(f"cannot create run directory {self.path}: {exc.strerror or exc}") from None
        elif not self.path.is_dir():
            raise InputError(f"run directory {self.path} does not exist")
        self.claimed = (self.path / MANIFEST).exists() or (self.path / MANIFEST).is_symlink()  # a run already
        if not create and not self.claimed:
            raise InputError(f"{self.path} is not a run directory (it has no {MANIFEST}); run `python -m pipeline "
                             f"all --run-dir {self.path}` first")
        self._lock_fd: int | None = None
        self.memo: dict = {}  # what one command computes once while it holds the lock (the data's summary)
        # what config.yaml gets when the command succeeds (pipeline.stages.open_run)
        self.config_to_save: Config | None = None
        # what `all` did with each stage in this invocation ("ran", "unchanged", or why not:
        # pipeline.stages.run_stages); None outside `all`. Its summary marks every other row as an earlier run's.
        self.this_invocation: dict[str, str] | None = None
        self.manifest = self._load_manifest()

    # ------------------------------------------------------------------ manifest

    def _load_manifest(self) -> dict:
        path = self.path / MANIFEST
        if not path.exists():
            return {"schema": SCHEMA, "created": now(), "stages": {}}
        from pipeline.core import manifest

        data = read_json(path, "manifest")
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise InputError(f"{path} is not a pipeline manifest; move it away or use another --run-dir")
        manifest.validate(data, path)
        return data

    def save_manifest(self) -> None:
        self.manifest["updated"] = now()
        write_json(self.path / MANIFEST, self.manifest)
        self.claimed = True

    def own(self, name: str) -> None:
        """Note the top-level ``name`` in the manifest's ledger (saved at once) unless it is listed already."""
        if name in BOOKKEEPING or _temporary(name) or name in owned_names(self.manifest):
            return
        self.manifest[LEDGER] = sorted({*self.manifest.get(LEDGER, ()), name})
        self.save_manifest()

    def stage_entry(self, name: str) -> StageEntry | None:
        """``name``'s manifest entry, typed (None: the stage has not run); a damaged one is one InputError."""
        from pipeline.core.manifest import StageEntry

        return StageEntry.of(self.manifest["stages"].get(name), self.path / MANIFEST)

    def refingerprint(self, name: str, fingerprint: str) -> None:
        """Record that stage ``name``'s outputs stand for the inputs with ``fingerprint`` (saved at once)."""
        entry = self.stage_entry(name)
        self.manifest["stages"][name] = entry.model_copy(update={"fingerprint": fingerprint}).to_json()
        self.save_manifest()

    def recorded_artifacts(self, stage: str) -> dict[str, str]:
        """Every artifact ``stage`` recorded, with its sha256, however the stage ended; empty when it has not run."""
        entry = self.stage_entry(stage)
        return {name: info.sha256 for name, info in entry.artifacts.items()} if entry is not None else {}

    def recorded_sha256(self, stage: str, name: str) -> str | None:
        """The sha256 that ``stage`` recorded for artifact ``name`` when it ended normally (ok, or skipped
        with what it did write: build writes the OpenVINO IR and skips the engines on a CPU); else None."""
        entry = self.stage_entry(stage)
        if entry is None or not entry.ended_normally:
            return None
        return self.recorded_artifacts(stage).get(name)

    def record(self, kind: type[Record]) -> Record | None:
        """What ``kind``'s stage handed on in its details, typed (:mod:`pipeline.core.records`); None when the
        stage has no entry or recorded no details. A damaged value is one :class:`InputError`."""
        from pipeline.core import records

        return records.from_entry(kind, self.stage_entry(kind.STAGE), str(self.path / MANIFEST))

    def train_record(self) -> TrainRecord | None:
        from pipeline.core.records import TrainRecord

        return self.record(TrainRecord)

    def export_record(self) -> ExportRecord | None:
        from pipeline.core.records import ExportRecord

        return self.record(ExportRecord)

    def build_record(self) -> BuildRecord | None:
        from pipeline.core.records import BuildRecord

        return self.record(BuildRecord)

    def verify_record(self) -> VerifyRecord | None:
        from pipeline.core.records import VerifyRecord

        return self.record(VerifyRecord)

    def export_skipped(self, precision: str) -> str | None:
        """Why export skipped the precision's graph, as it recorded (no ModelOpt); None when it did not."""
        export = self.export_record()
        return export.skipped(precision) if export is not None else None

    def file(self, name: str) -> Path:
        """``name`` in the run directory, confined: the one check every file read or written there goes through."""
        return confined(self.path, name)

    def require(self, filename: str, producer: str, consumer: str) -> Path:
        """The path of an input artifact, or an error telling which stage to run first."""
        path = self.file(filename)
        if not path.is_file():
            raise InputError(
                f"{consumer} needs {filename} in {self.path}, which the {producer} stage writes; "
                f"run `python -m pipeline {producer} --run-dir {self.path}` first"
            )
        return path

    # ------------------------------------------------------------------ locking

    @property
    def is_locked(self) -> bool:
        """Whether this process holds the run directory's lock (:meth:`locked`), so it may write there."""
        return self._lock_fd is not None

    @contextlib.contextmanager
    def locked(self) -> Iterator["RunDir"]:
        """Hold the run directory's lock; a second process refuses with a clear message."""
        import fcntl

        refuse_foreign(self.path, self.manifest if self.claimed else None)  # before the lock file is created
        lock_path = self.path / LOCK
        refuse_symlink(lock_path)
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | NOFOLLOW, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise _open_error(lock_path, exc) from None
            raise UsageError(f"run directory {self.path} is not writable: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise UsageError(
                f"run directory {self.path} is in use by another pipeline process (pid {holder}); "
                "wait for it to finish or use another --run-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._lock_fd = fd
        root = os.path.realpath(self.path)
        try:
            if os.access(self.path, os.W_OK) is False:
                raise UsageError(f"run directory {self.path} is not writable")
            self.remove_stale_temporaries()
            if not self.claimed:  # a new run: the manifest first, before any other file is written
                refuse_foreign(self.path, None)
                self.save_manifest()
            with _LOCKED_GUARD:
                _LOCKED[root] = self
            yield self
        finally:
            with _LOCKED_GUARD:
                if _LOCKED.get(root) is self:
                    del _LOCKED[root]
            self._lock_fd = None
            self.memo.clear()
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def remove_stale_temporaries(self) -> list[Path]:
        """Delete what a killed process left behind (call with the lock held): ``.<name>.*.tmp`` files here and in
        the artifact folders, the child processes' ``.isolate.*/`` exchange folders, OpenVINO's ``openvino/.ir.*/``
        conversion folders, and the scratch folders of ModelOpt's work (outside, :func:`scratch_folder`) whose
        process is gone. Links are never followed: only real files and folders are removed."""
        removed = []
        for where in (self.path, self.path / OPENVINO_DIR, self.path / LOGS):
            if where.is_symlink() or not where.is_dir():
                continue
            removed += [tmp for tmp in where.glob(f"{TEMP_PREFIX}*{TEMP_SUFFIX}") if _remove_real(tmp, folder=False)]
        stale = [*self.path.glob(f"{ISOLATE_PREFIX}*"), *self.path.glob(f"{OPENVINO_DIR}/{IR_TEMP_PREFIX}*")]
        if not (self.path / OPENVINO_DIR).is_symlink():
            removed += [folder for folder in stale if _remove_real(folder, folder=True)]
        removed += remove_orphaned_scratch()
        if removed:
            log.info("removed %d temporary file(s) or folder(s) left by an interrupted process: %s", len(removed),
                     ", ".join(p.name for p in removed))
        return removed

    # ------------------------------------------------------------------ stages

    @contextlib.contextmanager
    def stage(self, name: str, fingerprint: str | None = None) -> Iterator[StageRecord]:
        """Bookkeeping around one stage: running -> ok / skipped / failed / interrupted."""
        previous_entry = self.stage_entry(name)
        for previous in [*(previous_entry.artifacts if previous_entry is not None else ()), LOGS]:
            self.file(previous)  # refused before anything runs when one was replaced by a link
        kept = owned_names(self.manifest)  # the entry below drops its last run's artifacts: the ledger keeps them
        if not kept <= set(self.manifest.get(LEDGER, ())):
            self.manifest[LEDGER] = sorted(kept | set(self.manifest.get(LEDGER, ())))
        from pipeline.core.manifest import StageEntry

        record = StageRecord(self, name, StageEntry(status=Status.RUNNING, started=now(), fingerprint=fingerprint,
                                                    artifacts={}, details={}))
        self.save_manifest()
        start = time.perf_counter()

        def finish(status: str, **extra) -> None:
            ended = status if record.entry.status == Status.RUNNING or status != Status.OK else record.entry.status
            record.update(**extra, status=ended, ended=now(), duration_s=round(time.perf_counter() - start, 3))
            if status == Status.OK:
                self.save_manifest()
                return
            # The stage already failed: its own error is the one to report. If the manifest cannot be
            # written either (a full disk), say so, but do not replace that error with this one.
            try:
                self.save_manifest()
            except PipelineError as exc:
                log.warning("could not record the %s stage as %s: %s", name, status, exc)

        try:
            yield record
            check_interrupt()  # a library that swallowed the interrupt (a failed row of its own) ends the stage here
            record.rehash()
        except KeyboardInterrupt:
            finish(Status.INTERRUPTED, error="interrupted by the user")
            raise
        except Exception as exc:
            if is_interrupt(exc):  # the interrupt as a library's own exception type (errors.is_interrupt)
                finish(Status.INTERRUPTED, error="interrupted by the user")
                raise KeyboardInterrupt from exc
            finish(Status.FAILED, **_failure(exc))
            raise
        else:
            finish(Status.OK)
