"""An exporter warning that the graph may differ from the model fails export (issue 46): a planted model with
``if f.mean() > 0.5: ... else: ...`` shipped with every stage ok, because every validation image took one branch."""

from __future__ import annotations

import json
import textwrap

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import TINY, cli
from pipeline import stages
from pipeline.core.manifest import StageEntry
from pipeline.core.torch_onnx import GRAPH_MAY_DIFFER, LIBRARY_SOURCES, graph_may_differ

BRANCHY = textwrap.dedent("""
    import torch
    from torch import nn


    class Branchy(nn.Module):
        def __init__(self, num_classes: int):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)
            self.fc = nn.Linear(8, num_classes)

        def forward(self, x):
            f = self.conv(x).relu().mean((2, 3))
            if f.mean() > 0.5:
                return self.fc(f)
            return -self.fc(f)


    def branchy(num_classes: int = 10):
        return Branchy(num_classes)
""")


@pytest.fixture(scope="module")
def branchy_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("branchy")
    (base / "branchy.py").write_text(BRANCHY)
    run = base / "run"
    assert cli("train", "--model", f"{base / 'branchy.py'}:branchy", "--run-dir", run, *TINY) == 0
    return base, run


def test_a_data_dependent_branch_fails_export_naming_the_models_line(branchy_run, capsys):
    base, run = branchy_run
    capsys.readouterr()
    assert cli("export", "--run-dir", run) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1, err
    assert "the exported graph may differ from the model" in err[0]
    assert f"{base / 'branchy.py'}:14: if f.mean() > 0.5:" in err[0], err[0]
    assert "export.accept_trace_warnings=true" in err[0]
    assert not (run / "model.onnx").exists()  # nothing written


def test_the_setting_accepts_it_and_the_summary_says_so(branchy_run, tmp_path, capsys):
    import shutil

    _, run = branchy_run
    run = shutil.copytree(run, tmp_path / "run")
    assert cli("export", "--run-dir", run, "export.accept_trace_warnings=true") == 0
    entry = json.loads((run / "manifest.json").read_text())["stages"]["export"]
    accepted = entry["details"]["accepted_trace_warnings"]
    assert len(accepted) == 1 and "TracerWarning" in accepted[0] and "if f.mean() > 0.5:" in accepted[0]
    line = stages.STAGES["export"].line(StageEntry.of(entry))
    assert "accepted 1 exporter warning(s) that the graph may differ from the model" in line, line


@given(category=st.sampled_from(["TracerWarning", "UserWarning", "DeprecationWarning"]),
       phrase=st.sampled_from([*GRAPH_MAY_DIFFER, "an unrelated note"]), prefix=st.text(max_size=20),
       where=st.sampled_from(["model", "torch", "modelopt"]))
def test_only_tracer_warnings_of_a_trace_that_may_be_wrong_in_the_models_code_count(category, phrase, prefix, where):
    """A warning raised in torch's own modules (nn.TransformerEncoder's fast-path checks) or ModelOpt's quantizers
    (their empty-input check, which QAT's exported model carries) is the library's path, not the model's
    data-dependent step."""
    library = {f.rstrip("/").rsplit("/", 1)[-1]: f for f in LIBRARY_SOURCES}
    filename = {"model": "/home/me/model.py", "torch": f"{library['torch']}nn/modules/transformer.py",
                "modelopt": f"{library['modelopt']}torch/quantization/nn/modules/tensor_quantizer.py"}[where]
    expected = category == "TracerWarning" and phrase in GRAPH_MAY_DIFFER and where == "model"
    assert graph_may_differ(category, prefix + phrase, filename) == expected
