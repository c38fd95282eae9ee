"""Command line: parses arguments, resolves the config, runs stages, maps exceptions to exit codes.

Nothing else lives here: every command is a thin layer over functions importable from the
package. Heavy libraries (torch, onnx, TensorRT) are imported only inside the commands that
need them, so ``--help`` works on any machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import signal
import sys
import traceback
from pathlib import Path

from pipeline import __version__, stages
from pipeline.core.artifacts import CONFIG
from pipeline.core.errors import (
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    ConfigError,
    PipelineError,
    UsageError,
    disk_full,
    exit_code,
    interrupt_requested,
)
from pipeline.core.manifest import StageEntry
from pipeline.stages import ORDER, STAGES

log = logging.getLogger("pipeline")


EPILOG = """exit codes: 0 ok, 1 check failed (precision gate, or the model did not learn), 2 usage/config/input error,
3 required backend unavailable, 4 other runtime failure, 5 gate inconclusive
(only with verify.inconclusive=fail), 130 interrupted"""


def _add_common(p: argparse.ArgumentParser, *, model: bool = True) -> None:
    if model:
        p.add_argument("--model", help="registered model name, or package.module:factory / file.py:factory")
    p.add_argument("--run-dir", type=Path, help="run directory (default: runs/<model>)")
    p.add_argument("--config", metavar="FILE", help="YAML config file")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. train.epochs=3")


def _add_require(p: argparse.ArgumentParser) -> None:
    p.add_argument("--require", action="append", choices=["tensorrt", "cuda"], default=[],
                   help="fail with exit code 3 when this backend is unavailable (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline",
        description="Train an image model, export it to ONNX (FP32, FP16, INT8), build TensorRT engines and "
                    "OpenVINO IR, verify every artifact against the FP32 model, and benchmark it.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"pipeline {__version__}")
    parser.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors")
    parser.add_argument("--debug", action="store_true", help="debug logging; show tracebacks")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("all", help=" -> ".join(ORDER), epilog=EPILOG)
    _add_common(p)
    _add_require(p)
    p.add_argument("--force", nargs="*", metavar="STAGE", choices=list(ORDER),
                   help="re-run these stages (all stages when none is named) even if unchanged")
    for stage in STAGES.values():
        for option in stage.options:
            if option.in_all:
                p.add_argument(option.flag, action="store_true", help=f"{stage.name}: {option.help}")

    for name, stage in STAGES.items():
        p = sub.add_parser(name, help=stage.help, description=stage.help, epilog=EPILOG)
        _add_common(p)
        _add_require(p)
        for option in stage.options:
            if option.metavar:
                p.add_argument(option.flag, metavar=option.metavar, help=option.help)
            else:
                p.add_argument(option.flag, action="store_true", help=option.help)

    p = sub.add_parser("report", help="write report.html and report.md for a run", epilog=EPILOG)
    _add_common(p)
    p = sub.add_parser("baseline", help="write a baseline bundle of a verified run (for compare)", epilog=EPILOG)
    _add_common(p)
    p.add_argument("--out", type=Path, required=True, help="the bundle folder to write (commit it)")
    p = sub.add_parser("bench-train", help="measure training throughput with AMP versus FP32", epilog=EPILOG)
    _add_common(p)
    p.add_argument("--steps", type=int, default=20, help="timed optimizer steps per precision")
    p.add_argument("--amp", choices=["bf16", "fp16"], help="precision to compare against FP32 (default: bf16 "
                   "on CPU, fp16 on CUDA)")
    p = sub.add_parser("doctor", help="print the software stack and every mismatch in it, with the fix", epilog=EPILOG)
    _add_require(p)
    sub.add_parser("models", help="list the registered models")
    p = sub.add_parser("config", help="print the resolved config (or every key with --keys)")
    _add_common(p)
    p.add_argument("--keys", action="store_true", help="list every key with its default and meaning")
    return parser


# --------------------------------------------------------------------------- helpers


def _setup_logging(quiet: bool, debug: bool) -> None:
    level = logging.DEBUG if debug else logging.WARNING if quiet else logging.INFO
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.handlers[:] = [handler]
    log.setLevel(level)
    log.propagate = False


def _sanitize(name: str) -> str:
    if ":" in name:  # a user model (importing the registry only then: it loads torch)
        from pipeline.core.registry import models

        with contextlib.suppress(models.UnknownModelError):  # a malformed name fails later, with its reason
            module, attr = models.split_import_path(name)
            name = f"{Path(module).stem if module.endswith('.py') else module.rsplit('.', 1)[-1]}_{attr}"
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "model"


def resolve_config(args) -> tuple[object, Path, object]:
    """Defaults <- run directory's config.yaml <- --config <- --model <- overrides; then --require.

    Returns ``(cfg, run_dir, saved)``: ``saved`` is what the run directory keeps, without this
    invocation's ``--require`` flags (those apply to this command only).
    """
    from pipeline import config as config_mod

    run_dir = getattr(args, "run_dir", None)
    saved = config_mod.resolve(_saved_config(run_dir), getattr(args, "config", None), _overrides(args))
    if run_dir is None:  # the default run directory keeps its own config too
        run_dir = Path("runs") / _sanitize(saved.model.name)
        saved = config_mod.resolve(_saved_config(run_dir), getattr(args, "config", None), _overrides(args))
    required = sorted(set(saved.require) | set(getattr(args, "require", []) or []))
    cfg = saved.model_copy(update={"require": required}) if required != saved.require else saved
    return cfg, run_dir, saved


def _overrides(args) -> list[str]:
    """The ``key=value`` overrides, ``--model`` first among them."""
    overrides = list(getattr(args, "overrides", []) or [])
    model = getattr(args, "model", None)
    if model is not None:
        overrides.insert(0, f"model.name={json.dumps(_model_argument(model))}")  # a string, never read as YAML
    return overrides


def _model_argument(model: str) -> str:
    """``--model`` as given, refused (exit 2) when empty or holding a control character (a newline, a tab): no model
    has such a name, and an empty one must not fall back to the default model."""
    if not model.strip():
        raise UsageError("--model is empty: name a registered model (python -m pipeline models), "
                         "package.module:factory or path/to/file.py:factory")
    if any(ord(c) < 32 or ord(c) == 127 for c in model):
        raise UsageError(f"--model {json.dumps(model)} holds a control character (a newline?): no model is named so")
    return model


def _saved_config(directory: Path | None) -> dict:
    """A run directory's config.yaml ({} where there is none): the layer below ``--config`` and the overrides."""
    from pipeline import config as config_mod

    if directory is not None:
        from pipeline.core.run import check_path_length

        check_path_length(directory)  # a name too long for the file system: exit 2 here, not an OSError below
    if directory is not None and (directory / CONFIG).is_file():
        from pipeline.core.run import refuse_foreign

        refuse_foreign(directory)  # a config.yaml of the user's folder is not read as a run's
        return config_mod.load_yaml_file(directory / CONFIG)
    return {}


def _check_not_distributed(command: str) -> None:
    from pipeline.training.distributed import launched_by_torchrun

    if launched_by_torchrun() and not (command in STAGES and STAGES[command].distributed):
        allowed = ", ".join(f"'{name}'" for name, stage in STAGES.items() if stage.distributed)
        raise UsageError(f"only {allowed} runs under torchrun; run '{command}' as a single process")


def _on_interrupt(signum, frame):
    interrupt_requested.set()  # see errors.check_interrupt
    raise KeyboardInterrupt


# --------------------------------------------------------------------------- commands


def cmd_models(args) -> int:
    from pipeline.core.registry import models

    names = models.list_models()
    print(f"{'model':<24} {'input':<12} {'classes':>7}  description")
    for name in names:
        spec = models.get_spec(name)
        c, h, w = spec.input_size
        print(f"{name:<24} {f'{c}x{h}x{w}':<12} {spec.num_classes:>7}  {spec.description}")
    print(f"\n{'training defaults':<24} {'optimizer':<9} {'lr':>7} {'epochs':>6} {'warm-up':>7} {'BN momentum':>11} "
          f"{'smallest input':>14}")
    for name in names:
        r = models.get_recipe(name)
        bn = "own" if r.bn_momentum is None else f"{r.bn_momentum:g}"
        print(f"{name:<24} {r.optimizer:<9} {r.lr:>7g} {r.epochs:>6} {r.warmup_epochs:>7g} {bn:>11} "
              f"{f'{r.min_image_size}x{r.min_image_size}':>14}")
    print("\nAny registered model trains at data.image_size (default 32) with the data set's class count and its\n"
          "training defaults (a config file or key=value overrides them: docs/configuration.md#precedence);\n"
          "a user model is given as --model package.module:factory or --model path/to/file.py:factory.")
    return 0


def cmd_doctor(args) -> int:
    from pipeline import doctor

    return doctor.run(args.require)


def cmd_config(args) -> int:
    from pipeline import config as config_mod

    if args.keys:
        for key, default, doc in config_mod.describe():
            print(f"{key:<48} {str(default):<24} {doc}")
        return 0
    cfg, run_dir, _ = resolve_config(args)
    print(config_mod.dump_yaml(cfg), end="")
    origins = config_mod.origins(_saved_config(run_dir), args.config, _overrides(args))
    if origins:  # YAML comments: the output still reads back as a config file
        print("# where values come from, where not from the defaults (docs/configuration.md#precedence):")
        width = max(map(len, origins))
        for key, origin in origins.items():
            print(f"#   {key:<{width}}  {origin}")
    return 0


def cmd_stage(args) -> int:
    cfg, run_dir, saved = resolve_config(args)
    _check_not_distributed(args.command)
    stage = STAGES[args.command]
    options = {option.dest: getattr(args, option.dest) for option in stage.options}
    if stage.distributed and os.environ.get("RANK", "0") != "0":
        stages.run_worker(args.command, cfg, run_dir, **options)
        return 0
    with stages.open_run(cfg, run_dir, save=saved, reads_trained=args.command != "train") as run:
        entry = stages.run_stage(args.command, cfg, run, **options)
    _print_stage_line(args.command, entry)
    return 0


def cmd_all(args) -> int:
    """``stages.run_all``, printing the summary even when a stage fails."""
    cfg, run_dir, saved = resolve_config(args)
    _check_not_distributed("all")
    force = set(ORDER) if args.force == [] else set(args.force or [])
    options = {stage.name: {o.dest: getattr(args, o.dest) for o in stage.options if o.in_all}
               for stage in STAGES.values()}
    log.info("pipeline %s: %s -> %s", __version__, cfg.model.name, run_dir)
    from pipeline import doctor

    for problem in doctor.problems(doctor.gather()):
        log.warning("doctor: %s: %s", problem.part, problem.message)
    stages.run_all(cfg, run_dir, force=force, options=options, save=saved,
                   on_end=lambda run: print(stages.summary(run)))
    return 0


def cmd_report(args) -> int:
    from pipeline import report

    cfg, run_dir, _ = resolve_config(args)
    from pipeline.core.run import RunDir

    run = RunDir(run_dir, create=False)
    with run.locked():
        paths = report.write(run, cfg)
    for path in paths:
        print(path)
    return 0


def cmd_baseline(args) -> int:
    from pipeline import baseline
    from pipeline.core.run import RunDir

    _, run_dir, _ = resolve_config(args)
    run = RunDir(run_dir, create=False)
    with run.locked():
        print(baseline.write(run, args.out))
    return 0


def cmd_bench_train(args) -> int:
    from pipeline import bench_train

    cfg, _, _ = resolve_config(args)
    _check_not_distributed("bench-train")
    result = bench_train.run(cfg, steps=args.steps, amp=args.amp)
    print(bench_train.format_result(result))
    return 0


def _print_stage_line(name: str, entry: StageEntry) -> None:
    extra = f": {entry.reason}" if entry.reason else ""
    log.info("%s: %s%s (%.1f s)", name, entry.status, extra, entry.duration_s or 0.0)


COMMANDS = {
    "models": cmd_models,
    "config": cmd_config,
    "doctor": cmd_doctor,
    "all": cmd_all,
    "report": cmd_report,
    "bench-train": cmd_bench_train,
    "baseline": cmd_baseline,
}  # every other command is a stage of the table: cmd_stage


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _setup_logging(args.quiet, args.debug)
    if os.environ.get("RANK", "0") != "0":
        log.setLevel(logging.WARNING)
    interrupt_requested.clear()
    previous = {sig: signal.signal(sig, _on_interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    stage_token = stages.current_stage.set("pipeline")
    try:
        return COMMANDS.get(args.command, cmd_stage)(args)
    except (Exception, KeyboardInterrupt) as err:  # every ending has its exit code, decided in errors.exit_code
        code = exit_code(err)
        _say(err, code, args)
        return code
    finally:
        stages.current_stage.reset(stage_token)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        interrupt_requested.clear()  # this command's; a caller of main() in the same process starts afresh


def _say(err: BaseException, code: int, args) -> None:
    """The one line (a line per problem for a config error) for the exception a command ended with."""
    if code == EXIT_INTERRUPTED:
        print(f"interrupted: {_where(args)} stopped; the manifest marks it interrupted", file=sys.stderr)
    elif isinstance(err, ConfigError):
        for problem in err.problems:
            print(f"error: config: {problem}", file=sys.stderr)
    elif isinstance(err, PipelineError):
        print(f"error: {_where(args)}: {_one_line(err)}", file=sys.stderr)
    elif (full := disk_full(err)) is not None:
        print(f"error: {_where(args)}: {full}", file=sys.stderr)
    else:  # a failure we did not anticipate: one line, the stage, the cause
        print(f"error: {_where(args)}: {type(err).__name__}: {_one_line(err)}"
              + ("" if args.debug else " (run with --debug for the traceback)"), file=sys.stderr)
    if args.debug and code != EXIT_INTERRUPTED:
        traceback.print_exc()


def _where(args) -> str:
    stage = stages.current_stage.get()
    return stage if stage != "pipeline" else args.command


def _one_line(err: BaseException) -> str:
    text = str(err).strip()
    # Errors raised inside DataLoader workers arrive wrapped with the worker's traceback.
    if "Original Traceback" in text:
        text = text.strip().splitlines()[-1].split(": ", 1)[-1]
    return " ".join(text.split()) if "\n" in text else text


__all__ = ["main", "build_parser", "EXIT_USAGE"]
