"""The model registry and the architectures' parameter names.

The key tables below are written out from torchvision's and timm's published models, not
derived from ours, so a pretrained state dict from either loads into our builders unchanged.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from models import (
    UnknownModelError,
    create_model,
    get_spec,
    import_path_source,
    list_models,
    load_factory,
    split_import_path,
)


def parse_table(text: str) -> dict[str, tuple[int, ...]]:
    """``key d0 d1 ...`` per line (``key ()`` for a scalar); ``prefix bn C`` stands for a BatchNorm2d's 5 entries."""
    table: dict[str, tuple[int, ...]] = {}
    for line in text.strip().splitlines():
        key, *dims = line.split()
        if dims[0] == "bn":
            c = (int(dims[1]),)
            entries = {"weight": c, "bias": c, "running_mean": c, "running_var": c, "num_batches_tracked": ()}
            for suffix, shape in entries.items():
                table[f"{key}.{suffix}"] = shape
        else:
            table[key] = () if dims == ["()"] else tuple(int(d) for d in dims)
    return table


def shapes(module: nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in module.state_dict().items()}


def assert_same_keys(actual: dict, expected: dict) -> None:
    missing = sorted(expected.keys() - actual.keys())
    unexpected = sorted(actual.keys() - expected.keys())
    wrong = {k: (actual[k], expected[k]) for k in expected.keys() & actual.keys() if actual[k] != expected[k]}
    assert not (missing or unexpected or wrong), f"missing {missing}\nunexpected {unexpected}\nwrong shape {wrong}"


# torchvision.models.resnet18().state_dict(), every entry.
RESNET18 = """
conv1.weight 64 3 7 7
bn1.weight 64
bn1.bias 64
bn1.running_mean 64
bn1.running_var 64
bn1.num_batches_tracked ()
layer1.0.conv1.weight 64 64 3 3
layer1.0.bn1.weight 64
layer1.0.bn1.bias 64
layer1.0.bn1.running_mean 64
layer1.0.bn1.running_var 64
layer1.0.bn1.num_batches_tracked ()
layer1.0.conv2.weight 64 64 3 3
layer1.0.bn2.weight 64
layer1.0.bn2.bias 64
layer1.0.bn2.running_mean 64
layer1.0.bn2.running_var 64
layer1.0.bn2.num_batches_tracked ()
layer1.1.conv1.weight 64 64 3 3
layer1.1.bn1.weight 64
layer1.1.bn1.bias 64
layer1.1.bn1.running_mean 64
layer1.1.bn1.running_var 64
layer1.1.bn1.num_batches_tracked ()
layer1.1.conv2.weight 64 64 3 3
layer1.1.bn2.weight 64
layer1.1.bn2.bias 64
layer1.1.bn2.running_mean 64
layer1.1.bn2.running_var 64
layer1.1.bn2.num_batches_tracked ()
layer2.0.conv1.weight 128 64 3 3
layer2.0.bn1.weight 128
layer2.0.bn1.bias 128
layer2.0.bn1.running_mean 128
layer2.0.bn1.running_var 128
layer2.0.bn1.num_batches_tracked ()
layer2.0.conv2.weight 128 128 3 3
layer2.0.bn2.weight 128
layer2.0.bn2.bias 128
layer2.0.bn2.running_mean 128
layer2.0.bn2.running_var 128
layer2.0.bn2.num_batches_tracked ()
layer2.0.downsample.0.weight 128 64 1 1
layer2.0.downsample.1.weight 128
layer2.0.downsample.1.bias 128
layer2.0.downsample.1.running_mean 128
layer2.0.downsample.1.running_var 128
layer2.0.downsample.1.num_batches_tracked ()
layer2.1.conv1.weight 128 128 3 3
layer2.1.bn1.weight 128
layer2.1.bn1.bias 128
layer2.1.bn1.running_mean 128
layer2.1.bn1.running_var 128
layer2.1.bn1.num_batches_tracked ()
layer2.1.conv2.weight 128 128 3 3
layer2.1.bn2.weight 128
layer2.1.bn2.bias 128
layer2.1.bn2.running_mean 128
layer2.1.bn2.running_var 128
layer2.1.bn2.num_batches_tracked ()
layer3.0.conv1.weight 256 128 3 3
layer3.0.bn1.weight 256
layer3.0.bn1.bias 256
layer3.0.bn1.running_mean 256
layer3.0.bn1.running_var 256
layer3.0.bn1.num_batches_tracked ()
layer3.0.conv2.weight 256 256 3 3
layer3.0.bn2.weight 256
layer3.0.bn2.bias 256
layer3.0.bn2.running_mean 256
layer3.0.bn2.running_var 256
layer3.0.bn2.num_batches_tracked ()
layer3.0.downsample.0.weight 256 128 1 1
layer3.0.downsample.1.weight 256
layer3.0.downsample.1.bias 256
layer3.0.downsample.1.running_mean 256
layer3.0.downsample.1.running_var 256
layer3.0.downsample.1.num_batches_tracked ()
layer3.1.conv1.weight 256 256 3 3
layer3.1.bn1.weight 256
layer3.1.bn1.bias 256
layer3.1.bn1.running_mean 256
layer3.1.bn1.running_var 256
layer3.1.bn1.num_batches_tracked ()
layer3.1.conv2.weight 256 256 3 3
layer3.1.bn2.weight 256
layer3.1.bn2.bias 256
layer3.1.bn2.running_mean 256
layer3.1.bn2.running_var 256
layer3.1.bn2.num_batches_tracked ()
layer4.0.conv1.weight 512 256 3 3
layer4.0.bn1.weight 512
layer4.0.bn1.bias 512
layer4.0.bn1.running_mean 512
layer4.0.bn1.running_var 512
layer4.0.bn1.num_batches_tracked ()
layer4.0.conv2.weight 512 512 3 3
layer4.0.bn2.weight 512
layer4.0.bn2.bias 512
layer4.0.bn2.running_mean 512
layer4.0.bn2.running_var 512
layer4.0.bn2.num_batches_tracked ()
layer4.0.downsample.0.weight 512 256 1 1
layer4.0.downsample.1.weight 512
layer4.0.downsample.1.bias 512
layer4.0.downsample.1.running_mean 512
layer4.0.downsample.1.running_var 512
layer4.0.downsample.1.num_batches_tracked ()
layer4.1.conv1.weight 512 512 3 3
layer4.1.bn1.weight 512
layer4.1.bn1.bias 512
layer4.1.bn1.running_mean 512
layer4.1.bn1.running_var 512
layer4.1.bn1.num_batches_tracked ()
layer4.1.conv2.weight 512 512 3 3
layer4.1.bn2.weight 512
layer4.1.bn2.bias 512
layer4.1.bn2.running_mean 512
layer4.1.bn2.running_var 512
layer4.1.bn2.num_batches_tracked ()
fc.weight 1000 512
fc.bias 1000
"""

# torchvision.models.mobilenet_v3_small().state_dict(). features.1 has no expansion conv, so its
# depthwise conv is block.0 and its SE block.1; every later block starts with the expansion at block.0.
MOBILENET_V3_SMALL = """
features.0.0.weight 16 3 3 3
features.0.1 bn 16
features.1.block.0.0.weight 16 1 3 3
features.1.block.0.1 bn 16
features.1.block.1.fc1.weight 8 16 1 1
features.1.block.1.fc1.bias 8
features.1.block.1.fc2.weight 16 8 1 1
features.1.block.1.fc2.bias 16
features.1.block.2.0.weight 16 16 1 1
features.1.block.2.1 bn 16
features.2.block.0.0.weight 72 16 1 1
features.2.block.0.1 bn 72
features.2.block.1.0.weight 72 1 3 3
features.2.block.1.1 bn 72
features.2.block.2.0.weight 24 72 1 1
features.2.block.2.1 bn 24
features.3.block.0.0.weight 88 24 1 1
features.3.block.0.1 bn 88
features.3.block.1.0.weight 88 1 3 3
features.3.block.1.1 bn 88
features.3.block.2.0.weight 24 88 1 1
features.3.block.2.1 bn 24
features.4.block.0.0.weight 96 24 1 1
features.4.block.0.1 bn 96
features.4.block.1.0.weight 96 1 5 5
features.4.block.1.1 bn 96
features.4.block.2.fc1.weight 24 96 1 1
features.4.block.2.fc1.bias 24
features.4.block.2.fc2.weight 96 24 1 1
features.4.block.2.fc2.bias 96
features.4.block.3.0.weight 40 96 1 1
features.4.block.3.1 bn 40
features.5.block.0.0.weight 240 40 1 1
features.5.block.0.1 bn 240
features.5.block.1.0.weight 240 1 5 5
features.5.block.1.1 bn 240
features.5.block.2.fc1.weight 64 240 1 1
features.5.block.2.fc1.bias 64
features.5.block.2.fc2.weight 240 64 1 1
features.5.block.2.fc2.bias 240
features.5.block.3.0.weight 40 240 1 1
features.5.block.3.1 bn 40
features.6.block.0.0.weight 240 40 1 1
features.6.block.0.1 bn 240
features.6.block.1.0.weight 240 1 5 5
features.6.block.1.1 bn 240
features.6.block.2.fc1.weight 64 240 1 1
features.6.block.2.fc1.bias 64
features.6.block.2.fc2.weight 240 64 1 1
features.6.block.2.fc2.bias 240
features.6.block.3.0.weight 40 240 1 1
features.6.block.3.1 bn 40
features.7.block.0.0.weight 120 40 1 1
features.7.block.0.1 bn 120
features.7.block.1.0.weight 120 1 5 5
features.7.block.1.1 bn 120
features.7.block.2.fc1.weight 32 120 1 1
features.7.block.2.fc1.bias 32
features.7.block.2.fc2.weight 120 32 1 1
features.7.block.2.fc2.bias 120
features.7.block.3.0.weight 48 120 1 1
features.7.block.3.1 bn 48
features.8.block.0.0.weight 144 48 1 1
features.8.block.0.1 bn 144
features.8.block.1.0.weight 144 1 5 5
features.8.block.1.1 bn 144
features.8.block.2.fc1.weight 40 144 1 1
features.8.block.2.fc1.bias 40
features.8.block.2.fc2.weight 144 40 1 1
features.8.block.2.fc2.bias 144
features.8.block.3.0.weight 48 144 1 1
features.8.block.3.1 bn 48
features.9.block.0.0.weight 288 48 1 1
features.9.block.0.1 bn 288
features.9.block.1.0.weight 288 1 5 5
features.9.block.1.1 bn 288
features.9.block.2.fc1.weight 72 288 1 1
features.9.block.2.fc1.bias 72
features.9.block.2.fc2.weight 288 72 1 1
features.9.block.2.fc2.bias 288
features.9.block.3.0.weight 96 288 1 1
features.9.block.3.1 bn 96
features.10.block.0.0.weight 576 96 1 1
features.10.block.0.1 bn 576
features.10.block.1.0.weight 576 1 5 5
features.10.block.1.1 bn 576
features.10.block.2.fc1.weight 144 576 1 1
features.10.block.2.fc1.bias 144
features.10.block.2.fc2.weight 576 144 1 1
features.10.block.2.fc2.bias 576
features.10.block.3.0.weight 96 576 1 1
features.10.block.3.1 bn 96
features.11.block.0.0.weight 576 96 1 1
features.11.block.0.1 bn 576
features.11.block.1.0.weight 576 1 5 5
features.11.block.1.1 bn 576
features.11.block.2.fc1.weight 144 576 1 1
features.11.block.2.fc1.bias 144
features.11.block.2.fc2.weight 576 144 1 1
features.11.block.2.fc2.bias 576
features.11.block.3.0.weight 96 576 1 1
features.11.block.3.1 bn 96
features.12.0.weight 576 96 1 1
features.12.1 bn 576
classifier.0.weight 1024 576
classifier.0.bias 1024
classifier.3.weight 1000 1024
classifier.3.bias 1000
"""

# timm.create_model("vit_tiny_patch16_224").state_dict(): the model-level entries, then the same
# twelve entries for each of blocks.0 .. blocks.11.
VIT_TINY_TOP = """
cls_token 1 1 192
pos_embed 1 197 192
patch_embed.proj.weight 192 3 16 16
patch_embed.proj.bias 192
norm.weight 192
norm.bias 192
head.weight 1000 192
head.bias 1000
"""
VIT_TINY_BLOCK = """
norm1.weight 192
norm1.bias 192
attn.qkv.weight 576 192
attn.qkv.bias 576
attn.proj.weight 192 192
attn.proj.bias 192
norm2.weight 192
norm2.bias 192
mlp.fc1.weight 768 192
mlp.fc1.bias 768
mlp.fc2.weight 192 768
mlp.fc2.bias 192
"""


def test_resnet18_matches_torchvision_state_dict():
    expected = parse_table(RESNET18)
    assert len(expected) == 122
    assert_same_keys(shapes(create_model("resnet18")[0]), expected)


def test_mobilenet_v3_small_matches_torchvision_state_dict():
    expected = parse_table(MOBILENET_V3_SMALL)
    assert len(expected) == 244
    model = create_model("mobilenet_v3_small")[0]
    assert_same_keys(shapes(model), expected)
    assert sum(p.numel() for p in model.parameters()) == 2_542_856  # torchvision's published count
    bn = model.features[0][1]
    assert (bn.eps, bn.momentum) == (0.001, 0.01)


def test_vit_tiny_matches_timm_state_dict():
    block = parse_table(VIT_TINY_BLOCK)
    expected = parse_table(VIT_TINY_TOP)
    expected.update({f"blocks.{i}.{key}": shape for i in range(12) for key, shape in block.items()})
    assert len(expected) == 152
    model = create_model("vit_tiny_patch16_224")[0]
    assert_same_keys(shapes(model), expected)
    assert sum(p.numel() for p in model.parameters()) == 5_717_416  # timm's published count


@pytest.mark.parametrize("name", list_models())
def test_every_registered_model_builds_and_runs(name):
    spec = get_spec(name)
    assert spec.name == name
    assert spec.description
    channels, height, width = spec.input_size
    assert channels == 3 and height == width and height >= 32
    assert spec.num_classes > 0
    assert len(spec.mean) == len(spec.std) == channels and all(s > 0 for s in spec.std)
    assert spec.input_name and spec.output_name and spec.input_name != spec.output_name

    torch.manual_seed(0)
    model, built = create_model(name, num_classes=10, image_size=32)
    assert built.num_classes == 10 and built.input_size == (3, 32, 32)
    model.eval()
    with torch.no_grad():
        out = model(torch.randn(2, 3, 32, 32))
    if built.task == "detection":  # (head, detections): pipeline.core.tasks
        from pipeline.core import tasks

        assert tasks.output_problem(tasks.of(built), out, 2, 10) is None
        out = out[0]
    assert out.shape == (2, 10) or built.task == "detection"
    assert torch.isfinite(out).all()


def test_unknown_model_names_the_known_ones():
    with pytest.raises(UnknownModelError) as info:
        create_model("resnet19")
    message = str(info.value)
    assert "resnet19" in message
    for name in list_models():
        assert name in message
    with pytest.raises(UnknownModelError):
        get_spec("resnet19")


USER_MODEL = """
import torch
from torch import nn


def factory(num_classes=5):
    '''A user's own model.'''
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, num_classes))
    model.input_size = (3, 16, 16)
    model.num_classes = num_classes
    model.mean = (0.5, 0.5, 0.5)
    model.std = (0.25, 0.25, 0.25)
    return model
"""


def test_user_factory_from_file(tmp_path):
    path = tmp_path / "my_model.py"
    path.write_text(USER_MODEL)
    model, spec = create_model(f"{path}:factory", num_classes=4)
    assert spec.name == f"{path}:factory"
    assert spec.input_size == (3, 16, 16)
    assert spec.num_classes == 4
    assert spec.mean == (0.5, 0.5, 0.5) and spec.std == (0.25, 0.25, 0.25)
    assert spec.description == "A user's own model."
    assert model(torch.randn(2, 3, 16, 16)).shape == (2, 4)


def test_user_factory_failures(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("import package_that_does_not_exist\n")
    with pytest.raises(UnknownModelError, match="package_that_does_not_exist") as info:
        create_model(f"{broken}:factory")
    assert "ModuleNotFoundError" in str(info.value)
    assert isinstance(info.value.__cause__, ModuleNotFoundError)

    with pytest.raises(UnknownModelError, match="does not exist"):
        create_model(f"{tmp_path / 'missing.py'}:factory")

    (tmp_path / "empty.py").write_text("")
    with pytest.raises(UnknownModelError, match="no callable 'factory'"):
        create_model(f"{tmp_path / 'empty.py'}:factory")


@pytest.mark.parametrize("name, parts", [
    ("my_pkg.nets:factory", ("my_pkg.nets", "factory")),
    ("path/to/file.py:make", ("path/to/file.py", "make")),
    ("C:/models/net.py:make", ("C:/models/net.py", "make")),  # the last colon separates the factory
])
def test_split_import_path(name, parts):
    assert split_import_path(name) == parts


@pytest.mark.parametrize("name", ["pkg.module:", ":factory", ":"])
def test_split_import_path_needs_both_parts(name):
    with pytest.raises(UnknownModelError, match="expected 'package.module:factory' or 'file.py:factory'"):
        split_import_path(name)
    with pytest.raises(UnknownModelError, match="expected"):
        load_factory(name)


def test_import_path_source_finds_the_file_without_importing_it(tmp_path, monkeypatch):
    (tmp_path / "never_imported_net.py").write_text("raise RuntimeError('imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert import_path_source(f"{tmp_path}/never_imported_net.py:f") == tmp_path / "never_imported_net.py"
    assert import_path_source("never_imported_net:f") == tmp_path / "never_imported_net.py"
    assert import_path_source("no_such_package_anywhere:f") is None
    assert import_path_source("broken:") is None


def test_load_factory_returns_the_callable(tmp_path):
    (tmp_path / "net.py").write_text(USER_MODEL)
    factory = load_factory(f"{tmp_path / 'net.py'}:factory")
    assert callable(factory) and factory.__doc__ == "A user's own model."


@pytest.mark.parametrize(
    "name, head, features",
    [("resnet18", "fc", 512), ("mobilenet_v3_small", "classifier.3", 1024), ("vit_tiny_patch16_224", "head", 192)],
)
def test_num_classes_changes_the_head(name, head, features):
    model, spec = create_model(name, num_classes=7)
    state = model.state_dict()
    assert state[f"{head}.weight"].shape == (7, features)
    assert state[f"{head}.bias"].shape == (7,)
    assert spec.num_classes == 7


@pytest.mark.parametrize(
    "name, image_size, tokens",
    [("vit_tiny_patch16_224", 32, 5), ("vit_tiny_patch16_224", 384, 577), ("vit_micro", 64, 257)],
)
def test_vit_image_size_changes_pos_embed(name, image_size, tokens):
    assert get_spec(name).fixed_input_size
    model, spec = create_model(name, image_size=image_size)
    assert model.pos_embed.shape[1] == tokens
    assert spec.input_size == (3, image_size, image_size)


def test_vit_rejects_image_size_not_a_multiple_of_the_patch():
    with pytest.raises(ValueError, match="patch size 16"):
        create_model("vit_tiny_patch16_224", image_size=100)


@pytest.mark.filterwarnings("ignore:You are using the legacy TorchScript-based ONNX export")
@pytest.mark.parametrize("name", ["vit_micro", "mobilenet_v3_small"])
def test_onnx_export_matches_pytorch_with_dynamic_batch(name, tmp_path):
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    torch.manual_seed(0)
    model, spec = create_model(name, num_classes=10, image_size=32)
    model.eval()
    path = tmp_path / "model.onnx"
    torch.onnx.export(
        model,
        (torch.randn(2, 3, 32, 32),),
        str(path),
        dynamo=False,
        opset_version=18,
        input_names=[spec.input_name],
        output_names=[spec.output_name],
        dynamic_axes={spec.input_name: {0: "batch"}, spec.output_name: {0: "batch"}},
    )
    ops = {node.op_type for node in onnx.load(str(path)).graph.node}
    if name.startswith("vit"):
        assert {"LayerNormalization", "MatMul", "Softmax"} <= ops

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for batch in (1, 3):
        x = torch.randn(batch, 3, 32, 32)
        with torch.no_grad():
            expected = model(x).numpy()
        (actual,) = session.run(None, {spec.input_name: x.numpy()})
        assert actual.shape == (batch, 10)
        # MobileNet's freshly initialised logits are ~1e-2, so a relative bound keeps the check meaningful.
        np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5)
