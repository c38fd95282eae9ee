"""The calibration stability certificate's record as types (:mod:`pipeline.core.stability_record`) and verify.json's
held-out images record (:mod:`pipeline.core.images_record`): made where the draws are judged and the images checked,
written by one serialiser in the shape earlier releases wrote (verify.json's and tune.json's ``stability``,
verify.json's ``images``), read back typed and bounded, and read by attribute everywhere else. The AST check here
fails on a ``["key"]`` or ``.get("key")`` on one of them outside its serialiser."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from conftest import ROOT
from pipeline.core import verify_rows
from pipeline.core.errors import InputError
from pipeline.core.images_record import ImagesRecord, VerdictImages
from pipeline.core.stability_record import DrawRow, KindSpread, SpreadRow, StabilityCertificate
from pipeline.evaluation import certificate
from pipeline.precision import stability, tune_result

PACKAGE = ROOT / "pipeline"
TUNE = ROOT / "tests" / "data" / "tune.json"  # written by tune before the certificate was typed (issue 47)
RELEASE = ROOT / "tests" / "data" / "release_0.1.0" / "run" / "verify.json"
# the serialisers: the only modules that may read one by its key
HOMES = {PACKAGE / "core" / "stability_record.py", PACKAGE / "core" / "images_record.py"}
TYPES = {"StabilityCertificate", "CertificateOutcome", "DrawRow", "SpreadRow", "GateSpread", "ScaleSpread",
         "KindSpread", "QuantizerSpread", "ImagesRecord", "ImageSetRecord", "VerdictImages", "ValidationSplit"}
# What holds one: these attributes of a result, a report or a record, and these calls (the makers, the readers).
ATTRIBUTES = {"stability", "certificate", "gate_spread", "scale_spread", "activation", "weight", "quantizers",
              "validation_split", "held_out"}
MAKERS = {"certify", "payload", "report_of", "result_of", "_outcome", "_gate_spread", "_kind_spread",
          "held_out_section", *TYPES}


# --------------------------------------------------------------------------- the AST check


def _names_a_type(node: ast.AST | None) -> bool:
    return node is not None and any(
        (isinstance(n, ast.Name) and n.id in TYPES) or (isinstance(n, ast.Attribute) and n.attr in TYPES)
        for n in ast.walk(node))


def _gives_one(node: ast.AST, held: set[str]) -> bool:
    """Whether ``node``'s value is one of the types (or a list of them): a name that holds one, an attribute that is
    one, a maker's call, its ``model_copy``, or either side of a conditional or ``and``/``or``."""
    if isinstance(node, ast.Name):
        return node.id in held
    if isinstance(node, ast.Attribute):
        return node.attr in ATTRIBUTES or (node.attr == "draws" and _gives_one(node.value, held))
    if isinstance(node, ast.Call):
        f = node.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
        return name in MAKERS or (name == "model_copy" and _gives_one(f.value, held))
    if isinstance(node, ast.IfExp):
        return _gives_one(node.body, held) or _gives_one(node.orelse, held)
    if isinstance(node, ast.BoolOp):
        return any(_gives_one(v, held) for v in node.values)
    return False


def _held(fn: ast.AST) -> set[str]:
    """The names that hold one in a function: typed parameters and annotations, and what is assigned from one
    (``cert, gate = s.certificate, s.gate_spread`` binds both), followed until nothing new is found."""
    args = fn.args
    held = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs] if _names_a_type(a.annotation)}
    while True:
        before = len(held)
        for node in ast.walk(fn):
            if isinstance(node, ast.AnnAssign) and _names_a_type(node.annotation) and isinstance(node.target, ast.Name):
                held.add(node.target.id)
            elif isinstance(node, (ast.For, ast.comprehension)) and _gives_one(node.iter, held):
                held |= {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    both = isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple)
                    pairs = zip(target.elts, node.value.elts, strict=False) if both else [(target, node.value)]
                    held |= {t.id for t, v in pairs if isinstance(t, ast.Name) and _gives_one(v, held)}
        if len(held) == before:
            return held


def key_reads(path: Path) -> list[str]:
    """``x["key"]`` and ``x.get("key")`` where ``x`` is a certificate or one of its parts."""
    hits = []
    for fn in ast.walk(ast.parse(path.read_text())):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        held = _held(fn)
        for node in ast.walk(fn):
            on, key = None, None
            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                on, key = node.value, node.slice.value
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                  and node.args and isinstance(node.args[0], ast.Constant)):
                on, key = node.func.value, node.args[0].value
            if isinstance(key, str) and _gives_one(on, held):
                hits.append(f"{path.relative_to(path.parents[1])}:{node.lineno}: {ast.unparse(node)}")
    return sorted(set(hits))


def test_no_stability_certificate_is_read_by_its_key_outside_its_serialiser():
    files = [p for p in sorted(PACKAGE.rglob("*.py")) if p not in HOMES]
    assert [hit for p in files for hit in key_reads(p)] == []


def test_the_check_finds_a_key_read_on_a_certificate_and_leaves_dicts(tmp_path):
    path = tmp_path / "pkg" / "m.py"
    path.parent.mkdir()
    path.write_text(
        "def a(s: StabilityCertificate):\n    return s['draws']\n"
        "def b(p):\n    return p.stability.get('limit')\n"
        "def c(x):\n    result = certificate.certify(x)\n    return result['certificate']\n"
        "def d(s: StabilityCertificate):\n    cert, n = s.certificate, s.seconds\n    return cert['line'], n['x']\n"
        "def e(s: StabilityCertificate):\n    return [r['status'] for r in s.draws]\n"
        "def f(payload: dict):\n    return payload['stability'], {'a': 1}['a']\n"  # a raw dict: not followed
        "def g(s: StabilityCertificate):\n    act = s.scale_spread.activation\n    return act.get('worst')\n"
        "def h(images: ImagesRecord | None):\n    return images.held_out['line'], images.get('verdict')\n")
    assert key_reads(path) == ["pkg/m.py:10: cert['line']", "pkg/m.py:12: r['status']",
                               "pkg/m.py:17: act.get('worst')", "pkg/m.py:19: images.get('verdict')",
                               "pkg/m.py:19: images.held_out['line']", "pkg/m.py:2: s['draws']",
                               "pkg/m.py:4: p.stability.get('limit')", "pkg/m.py:7: result['certificate']"]


def test_the_check_covers_the_readers_it_claims_to():
    """The modules that read the certificate hold it typed: the check sees one in each."""
    for name in ("reports/tables.py", "reports/stability_report.py", "reports/verify_report.py",
                 "reports/tune_report.py", "verify.py", "tune.py", "evaluation/certificate.py"):
        tree = ast.parse((PACKAGE / name).read_text())
        fns = [fn for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))]
        assert any(_held(fn) or any(isinstance(n, ast.Attribute) and n.attr in ATTRIBUTES for n in ast.walk(fn))
                   for fn in fns), name


# --------------------------------------------------------------------------- one serialiser, the old shape


def _old_shape(data):
    return json.dumps(data)  # every key, nested, in order


def test_tunes_certificate_reads_typed_and_writes_back_in_the_same_shape():
    old = json.loads(TUNE.read_text())["stability"]
    cert = tune_result.read(TUNE).stability
    assert isinstance(cert, StabilityCertificate) and cert.limit == 0.5
    assert cert.certificate.status == "certified" and all(isinstance(r, DrawRow) for r in cert.draws)
    assert isinstance(cert.gate_spread.scaled_error, SpreadRow) and isinstance(cert.scale_spread.weight, KindSpread)
    assert _old_shape(cert.to_json()) == _old_shape(old)


def test_verifys_certificate_reads_typed_without_tunes_limit(tmp_path):
    payload = json.loads(RELEASE.read_text())
    stab = {k: v for k, v in json.loads(TUNE.read_text())["stability"].items() if k != "limit"}
    stab["draws"][1]["scaled_error"] = "nan"  # a non-finite number as verify.json writes it
    cert = verify_rows.report_of({**payload, "stability": stab}).stability
    assert cert is not None and cert.limit is None and cert.draws[1].scaled_error == "nan"
    assert _old_shape(cert.to_json()) == _old_shape(stab)
    assert verify_rows.report_of(payload).stability is None  # release 0.1.0: no certificate


def test_the_certificate_is_made_in_the_old_shape():
    draws = stability.Draws(((0, 1), (2, 3), (4, 5)), stability.DISJOINT)
    rows = [DrawRow(draw=n, deployed=n == 0, images=2, split="train", status=s, scaled_error=e, top1_agreement=1.0,
                    accuracy_drop=0.0) for n, (s, e) in enumerate([("passed", 0.1), ("failed", 0.3), ("passed", 0.2)])]
    scales = [{"x": ("activation", 1.0), "w": ("weight", 0.5)}, {"x": ("activation", 2.0), "w": ("weight", 0.5)},
              {"x": ("activation", 1.5), "w": ("weight", 0.5)}]
    out = certificate.payload(draws, rows, scales, 0.5, "pass", 2, 10, 1.234).to_json()
    assert list(out) == ["certificate", "sampling", "sampling_note", "draw_size", "verdict_images", "draws",
                         "gate_spread", "scale_spread", "quantizers", "seconds"]
    assert out["certificate"] == stability.certify(["passed", "failed", "passed"], 0.5, "pass").to_json()
    assert out["draws"][1] == {"draw": 1, "deployed": False, "images": 2, "split": "train", "status": "failed",
                               "scaled_error": 0.3, "top1_agreement": 1.0, "accuracy_drop": 0.0}
    assert out["gate_spread"]["scaled_error"] == stability.Spread(0.1, 0.3, 0.2).to_json()
    assert list(out["gate_spread"]) == list(certificate.STATISTICS)
    assert out["scale_spread"] == {
        "activation": {"quantizers": 1, "median_relative": 2 / 3, "max_relative": 2 / 3, "worst": "x"},
        "weight": {"quantizers": 1, "median_relative": 0.0, "max_relative": 0.0, "worst": "w"}}
    assert out["quantizers"][0] == {"tensor": "x", "kind": "activation",
                                    **stability.Spread(1.0, 2.0, 1.5).to_json()}
    assert out["seconds"] == 1.23


def test_verifys_images_record_reads_typed_and_writes_back_in_the_same_shape():
    images = {"verdict": {"role": "verdict", "split": "val", "count": 2, "indices": [3, 7],
                          "sha256_16": ["0123456789abcdef", "fedcba9876543210"]},
              "held_out": {"status": "held out", "held_out": True, "reasons": [], "overlaps": {},
                           "checked": ["int8 calibration"], "not_run": ["tune search"],
                           "line": "held out: no verdict image is among the images of int8 calibration"},
              "validation_split": {"cut": True, "search_part": 30, "verdict_part": 30, "reason": ""}}
    record = verify_rows.report_of({**json.loads(RELEASE.read_text()), "images": images}).images
    assert isinstance(record, ImagesRecord) and isinstance(record.held_out, VerdictImages)
    assert record.verdict.count == 2 and record.held_out.held_out and record.validation_split.verdict_part == 30
    assert _old_shape(record.to_json()) == _old_shape(images)


@pytest.mark.parametrize("damage", [{"held_out": {"status": "held out", "held_out": "yes"}},
                                    {"verdict": {"role": "verdict", "split": "val", "indices": [-1]}},
                                    {"validation_split": {"cut": "no"}}])
def test_a_damaged_images_record_is_one_input_error(tmp_path, damage):
    path = tmp_path / "verify.json"
    path.write_text(json.dumps({**json.loads(RELEASE.read_text()), "images": damage}))
    with pytest.raises(InputError, match="verify report"):
        verify_rows.read(path)


@pytest.mark.parametrize("damage", [{"draws": "three"}, {"certificate": {"status": "certified"}},
                                    {"gate_spread": {}}, {"seconds": "1s"}, {"draws": [{"draw": 0}]}])
def test_a_damaged_certificate_is_one_input_error(tmp_path, damage):
    payload = json.loads(RELEASE.read_text())
    stab = {**json.loads(TUNE.read_text())["stability"], **damage}
    path = tmp_path / "verify.json"
    path.write_text(json.dumps({**payload, "stability": stab}))
    with pytest.raises(InputError, match="verify report"):
        verify_rows.read(path)
