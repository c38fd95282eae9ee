"""Puts back, one at a time, the defects of issue 46's cases (docs/failures.md, "Each case's defect put back"), runs
the tests that must catch each, and restores the file. Every line should say CAUGHT. Run from anywhere with the
project's Python: ``python scripts/claim_defects.py [CASE ...]`` (about 5 minutes for all)."""
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = os.environ.get("PYTHON", sys.executable)
T = "tests/"
CASES = [  # (case, file, the fix as it is now, the defect put back, the tests that must fail)
    ('1', 'pipeline/core/run.py',
     '    owned = BOOKKEEPING | owned_names(manifest)\n    return sorted(',
     ('    owned = BOOKKEEPING | owned_names(manifest)\n    return []\n    return'
      ' sorted('),
     ['test_claim.py::test_a_run_holding_a_file_of_the_users_is_refused_by_every_command']),
    ('1b', 'pipeline/core/run.py',
     '    if manifest is None:  # only what an interrupted claim leaves',
     ('    if manifest is None:\n        return []\n    if manifest is None:  # o'
      'nly what an interrupted claim leaves'),
     ['test_claim.py::test_a_folder_of_the_users_is_refused_by_every_command_and_left_as_it_was']),
    ('2-3', 'pipeline/core/verdicts.py',
     ('    if stage_status is None:\n        return "the manifest records no ver'
      'ify"'),
     ('    return None\n    if stage_status is None:\n        return "the manifes'
      't records no verify"'),
     ['test_claim.py::test_report_shows_a_stale_or_edited_verify_report_as_such_never_as_passed']),
    ('4', 'pipeline/core/data.py',
     '            sha = hashlib.file_digest(f, "sha256").hexdigest()',
     '            sha = str(st.st_mtime_ns)',
     ['test_data_content.py::test_all_re_runs_train_and_verify_after_images_are_swapped_between_classes']),
    ('5', 'pipeline/core/schema.py',
     ('    except RecursionError:\n        raise InputError(f"{path}: {what} nes'
      'ts deeper'),
     ('    except ZeroDivisionError:\n        raise InputError(f"{path}: {what} '
      'nests deeper'),
     ['test_read_back.py::test_a_100000_deep_file_is_exit_2_in_one_line']),
    ('6', 'pipeline/training/qat_recipe.py',
     "    except (RuntimeError, KeyError, TypeError) as exc:  # not QAT's",
     "    except ZeroDivisionError as exc:  # not QAT's",
     ['test_qat.py::test_qat_writes_ptqs_form_records_it_and_export_rebuilds_it']),
    ('7', 'pipeline/core/config_schema.py',
     'samples_per_class: int = Field(300, ge=2, le=MAX_IMAGES,',
     'samples_per_class: int = Field(300, ge=2,',
     ['test_read_back.py::test_every_numeric_setting_has_an_upper_bound',
      'test_read_back.py::test_an_impossible_setting_is_refused_before_any_work']),
    ('8', 'pipeline/config.py',
     '    if threads is not None and threads > THREADS_PER_CORE * cores:',
     '    if False:',
     ['test_read_back.py::test_threads_are_bounded_by_a_small_multiple_of_the_cores']),
    ('9', 'pipeline/core/config_schema.py',
     '    epochs: int = Field(4, ge=1, le=MAX_EPOCHS,',
     '    epochs: int = Field(4, ge=1,',
     ['test_read_back.py::test_every_numeric_setting_has_an_upper_bound',
      'test_read_back.py::test_an_impossible_setting_is_refused_before_any_work']),
    ('10', 'pipeline/core/run.py',
     '    path = Path(path)\n    name_max = _limit(',
     '    return\n    path = Path(path)\n    name_max = _limit(',
     ['test_read_back.py::test_a_300_character_run_directory_name_is_exit_2_before_anything_is_made']),
    ('11', 'pipeline/core/torch_onnx.py',
     '        if differ and not accept_trace_warnings:',
     '        if False:',
     ['test_export_trace.py::test_a_data_dependent_branch_fails_export_naming_the_models_line']),
    ('12', 'pipeline/core/benchmark_rows.py',
     'Field(ge=MIN_MS, le=MAX_MS, allow_inf_nan=False)',
     'Field(gt=0, le=MAX_MS, allow_inf_nan=False)',
     ['test_compare.py::test_impossible_values_are_refused']),
    ('13', 'pipeline/core/benchmark_rows.py',
     'Field(ge=MIN_MS, le=MAX_MS, allow_inf_nan=False)',
     'Field(ge=MIN_MS, allow_inf_nan=False)',
     ['test_compare.py::test_impossible_values_are_refused']),
    ('12-13 print', 'pipeline/reports/compare_report.py',
     '    return f"{value:.3g}"',
     '    return f"{value:.3f}"',
     ['test_compare.py::test_ratios_print_with_three_significant_digits']),
    ('14', 'pipeline/core/schema.py',
     '    if len(data) != len(pairs):',
     '    if False:',
     ['test_read_back.py::test_a_baseline_bundle_with_a_key_given_twice_is_refused']),
    ('15', 'pipeline/core/config_schema.py',
     '                    if key in seen:',
     '                    if False:',
     ['test_read_back.py::test_a_yaml_key_given_twice_is_refused']),
    ('16', 'pipeline/core/run.py',
     ('        if path.is_symlink():\n            raise UsageError(f"refusing to'
      ' use {path}: it is a symbolic link (to {os.readlink(path)}); {holder}")'),
     ('        if path.is_symlink():\n            raise UsageError(f"refusing to'
      ' use {path}: it is a symbolic link (to {os.readlink(path)}); {RUN_FOLDER'
      '}")'),
     ['test_bundle_folder.py::test_a_link_in_the_bundle_is_refused_in_the_bundles_words']),
    ('17', 'pipeline/baseline.py',
     '(_empty(out) or ',
     '(',
     ['test_bundle_folder.py::test_an_existing_empty_folder_is_taken_as_out']),
    ('18', 'pipeline/reports/tune_report.py',
     '    units, others = raised_layers(chosen.high, layers)',
     '    units, others = len(chosen.high), 0',
     ['test_careless_input.py::test_tunes_summary_counts_only_its_layers_and_names_the_other_nodes']),
    ('19', 'pipeline/core/config_schema.py',
     ('        if repeated:\n            raise ValueError(f"tune.calibration_met'
      'hods'),
     ('        if False:\n            raise ValueError(f"tune.calibration_method'
      's'),
     ['test_careless_input.py::test_a_repeated_calibration_method_is_refused_before_any_work']),
    ('20', 'pipeline/training/trainer.py',
     '        if ran > self.tc.epochs:',
     '        if False:',
     ['test_careless_input.py::test_resuming_past_the_epochs_asked_for_is_refused_naming_the_setting']),
    ('20b', 'pipeline/training/qat_recipe.py',
     '    epochs_setting = "qat.epochs"',
     '    epochs_setting = "train.epochs"',
     ['test_careless_input.py::test_resuming_past_the_epochs_asked_for_is_refused_naming_the_setting']),
    ('21', 'pipeline/cli.py',
     '    if not model.strip():',
     '    if False:',
     ['test_careless_input.py::test_an_empty_or_control_character_model_is_refused_not_defaulted']),
    ('22', 'pipeline/cli.py',
     'f"model.name={json.dumps(_model_argument(model))}"',
     'f"model.name={_model_argument(model)}"',
     ['test_careless_input.py::test_a_model_name_is_never_read_as_yaml']),
    ('23', 'pipeline/cli.py',
     '    if any(ord(c) < 32 or ord(c) == 127 for c in model):',
     '    if False:',
     ['test_careless_input.py::test_an_empty_or_control_character_model_is_refused_not_defaulted']),
    ('24', 'pipeline/core/run.py',
     '        if not create and not self.claimed:',
     '        if False:',
     ['test_claim.py::test_report_and_baseline_write_nothing_into_an_empty_folder']),
    ('25', 'pipeline/core/schema.py',
     '        if size > limit:',
     '        if False:',
     ['test_read_back.py::test_a_300_mb_manifest_is_refused_before_it_is_read']),
    ('25b', 'pipeline/core/schema.py',
     ('    if keys is not None and isinstance(data, dict) and not set(data) <= '
      'keys:'),
     '    if False:',
     ['test_read_back.py::test_a_model_card_with_a_key_the_tool_does_not_write_is_refused']),
    ('25c', 'pipeline/core/manifest.py',
     '    model_config = ConfigDict(extra="forbid", strict=True)',
     '    model_config = ConfigDict(extra="allow", strict=True)',
     ['test_read_back.py::test_a_manifest_with_a_key_given_twice_or_an_unknown_top_level_key_is_refused']),
    ('26', 'pipeline/core/data.py',
     ('        if any(issubclass(w.category, Image.DecompressionBombWarning) fo'
      'r w in caught):'),
     '        if False:',
     ['test_careless_input.py::test_a_decompression_bomb_warning_becomes_one_line_naming_the_image']),
    ('27', 'pipeline/baseline.py',
     '    if folder.is_symlink():',
     '    if False:',
     ['test_bundle_folder.py::test_the_bundle_folder_itself_as_a_link_is_refused']),
]
only = set(sys.argv[1:])
for case, rel, old, new, tests in CASES:
    if only and case not in only:
        continue
    path = ROOT / rel
    src = path.read_text()
    n = src.count(old)
    if n != 1:
        print(f"case {case}: {rel}: pattern found {n} times, not put back", flush=True)
        continue
    path.write_text(src.replace(old, new, 1))
    try:
        t0 = time.time()
        r = subprocess.run([PY, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-x",
                            *(T + t for t in tests)], cwd=ROOT, capture_output=True, text=True, timeout=900)
        last = [x for x in r.stdout.splitlines() if x.strip()][-1] if r.stdout.strip() else r.stderr[-200:]
        verdict = "CAUGHT" if r.returncode == 1 else ("not caught" if r.returncode == 0 else f"rc={r.returncode}")
        print(f"case {case}: {verdict}: {rel}: {old.strip().splitlines()[0][:70]!r} -> "
              f"{new.strip().splitlines()[0][:50]!r}; {', '.join(tests)}: {last} ({time.time() - t0:.0f} s)",
              flush=True)
    finally:
        path.write_text(src)
