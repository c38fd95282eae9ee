"""Config: YAML + overrides, strict types, every problem reported at once."""

import pytest

from pipeline import config
from pipeline.core.errors import ConfigError


def problems(**kwargs):
    with pytest.raises(ConfigError) as err:
        config.resolve(**kwargs)
    return err.value.problems


def test_defaults_are_valid():
    cfg = config.resolve()
    assert cfg.model.name == "resnet18" and cfg.train.amp == "auto" and cfg.export.opset >= 17


def test_overrides_are_yaml_values():
    cfg = config.resolve(overrides=["train.epochs=3", "verify.fp16.atol=1e-3", "benchmark.batch_sizes=[1, 2]",
                                    "data.image_size=null", "train.clip_grad_norm=1", "model.name=tiny_cnn"])
    assert cfg.train.epochs == 3
    assert cfg.verify.fp16.atol == 1e-3  # "1e-3" is a float, not YAML 1.1's string
    assert cfg.benchmark.batch_sizes == [1, 2]
    assert cfg.data.image_size is None
    assert cfg.train.clip_grad_norm == 1.0


def test_file_then_overrides(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("train:\n  epochs: 9\n  lr: 0.1\nverify:\n  fp16:\n    atol: 5e-2\n")
    cfg = config.resolve(config_file=str(f), overrides=["train.epochs=2"])
    assert cfg.train.epochs == 2 and cfg.train.lr == 0.1
    assert cfg.verify.fp16.atol == 0.05 and cfg.verify.fp16.rtol == 0.02  # a partial section keeps its defaults


def test_base_then_file(tmp_path):
    cfg = config.resolve(base={"train": {"epochs": 5, "lr": 0.2}}, overrides=["train.lr=0.3"])
    assert cfg.train.epochs == 5 and cfg.train.lr == 0.3


def test_all_problems_at_once():
    found = problems(overrides=["trian.epochs=3", "train.epochs=-1", "data.batch_size=0", "verify.fp16.atol=-1",
                                "train.lr=fast", "train.amp=fp8", "benchmark.batch_sizes=[1, 0]"])
    text = "\n".join(found)
    assert "trian: unknown key (did you mean train?)" in text
    assert "train.epochs" in text and "data.batch_size" in text and "train.lr" in text and "train.amp" in text
    assert "verify.fp16: atol must be >= 0" in text
    assert len(found) >= 6


def test_types_are_strict():
    assert "train.epochs" in problems(overrides=["train.epochs=2.5"])[0]
    assert "train.epochs" in problems(overrides=["train.epochs='3'"])[0]
    assert "train.channels_last" in problems(overrides=["train.channels_last=1"])[0]


def test_unknown_nested_key_suggests():
    (p,) = problems(overrides=["verify.fp16.atoll=0.1"])
    assert p == "verify.fp16.atoll: unknown key (did you mean verify.fp16.atol?)"


def test_malformed_yaml_and_bad_files(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  epochs: [1,\n")
    (p,) = problems(config_file=str(bad))
    assert "malformed YAML" in p and "line" in p
    (p,) = problems(config_file=str(tmp_path / "missing.yaml"))
    assert "not found" in p
    top = tmp_path / "list.yaml"
    top.write_text("- 1\n- 2\n")
    assert "mapping" in problems(config_file=str(top))[0]


def test_bad_override_syntax():
    assert "expected key=value" in problems(overrides=["train.epochs"])[0]
    assert "dotted key" in problems(overrides=["train..epochs=1"])[0]
    assert "not a section" in problems(overrides=["train.epochs.x=1"])[0] or \
        "train.epochs" in problems(overrides=["train.epochs.x=1"])[0]


def test_cross_field_rules():
    assert any("data.path is required" in p for p in problems(overrides=["data.source=imagefolder"]))
    assert any("min_batch <= opt_batch <= max_batch" in p for p in problems(overrides=["build.min_batch=64"]))


def test_describe_covers_every_leaf():
    keys = {k for k, _, _ in config.describe()}
    assert {"train.epochs", "verify.fp16.atol", "verify.candidates.tensorrt_fp16.enabled", "require"} <= keys
    assert all(doc for _, _, doc in config.describe())


def test_dump_roundtrip():
    cfg = config.resolve(overrides=["train.epochs=2", "verify.fp32.atol={'': 1e-4, logits: 1e-3}"])
    import yaml

    again = config.validate(yaml.safe_load(config.dump_yaml(cfg)))
    assert again == cfg


# --------------------------------------------------------------------------- the model card's recipe


@pytest.fixture
def recipes(monkeypatch):
    """Give two registered models recipes unlike the defaults and unlike each other."""
    import dataclasses

    from pipeline.core.registry import models

    planted = {"tiny_cnn": {"lr": 0.3, "epochs": 9, "warmup_epochs": 0.0},
               "vit_micro": {"optimizer": "adamw", "lr": 0.001, "weight_decay": 0.05, "epochs": 5}}
    for name, values in planted.items():
        entry = models._REGISTRY[name]
        monkeypatch.setattr(entry, "recipe", dataclasses.replace(entry.recipe, **values))
    return planted


def test_the_recipe_sits_between_the_defaults_and_the_users_config(recipes, tmp_path):
    cfg = config.resolve(overrides=["model.name=tiny_cnn"])
    assert (cfg.train.lr, cfg.train.epochs, cfg.train.warmup_epochs) == (0.3, 9, 0.0)
    assert cfg.train.label_smoothing == 0.0 and cfg.train.optimizer == "sgd"  # not in the recipe: the defaults
    f = tmp_path / "c.yaml"
    f.write_text("train:\n  lr: 0.123\n")
    cfg = config.resolve(config_file=str(f), overrides=["model.name=tiny_cnn", "train.epochs=2"])
    assert (cfg.train.lr, cfg.train.epochs, cfg.train.warmup_epochs) == (0.123, 2, 0.0)
    # a run directory's config.yaml (every key) of the same model wins over the recipe
    saved = config.resolve(overrides=["model.name=tiny_cnn", "train.lr=0.2"]).to_dict()
    assert config.resolve(saved).train.lr == 0.2
    assert config.resolve(overrides=["model.name=resnet18"]).train.lr == 0.05  # the defaults where the card says so


def test_a_run_directory_of_another_model_keeps_only_what_the_user_chose_there(recipes):
    saved = config.resolve(overrides=["model.name=tiny_cnn", "train.weight_decay=0.01"]).to_dict()
    cfg = config.resolve(saved, overrides=["model.name=vit_micro"])
    assert (cfg.train.optimizer, cfg.train.lr, cfg.train.epochs) == ("adamw", 0.001, 5)  # vit_micro's recipe
    assert cfg.train.weight_decay == 0.01  # the user's choice stays
    assert config.resolve(saved, overrides=["model.name=vit_micro", "train.lr=0.3"]).train.lr == 0.3


def test_origins_say_where_each_value_comes_from(recipes, tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("train:\n  weight_decay: 0.001\n")
    saved = config.resolve(overrides=["model.name=tiny_cnn", "data.seed=4"]).to_dict()
    found = config.origins(saved, str(f), ["model.name=tiny_cnn", "train.epochs=2"])
    assert found["train.lr"] == "tiny_cnn's recipe" and found["train.warmup_epochs"] == "tiny_cnn's recipe"
    assert found["train.epochs"] == "--model / key=value" and found["model.name"] == "--model / key=value"
    assert found["train.weight_decay"] == f"--config {f}"
    assert found["data.seed"] == "the run directory's config.yaml"
    assert "data.batch_size" not in found and "verify.fp32.atol" not in found  # the defaults


def test_the_config_command_shows_the_resolved_values_and_their_origins(recipes, tmp_path, capsys):
    from conftest import cli

    assert cli("config", "--model", "tiny_cnn", "--run-dir", tmp_path / "run", "train.epochs=3") == 0
    out = capsys.readouterr().out
    import yaml

    shown = yaml.safe_load(out)  # the comments keep it a config file
    assert shown["train"]["lr"] == 0.3 and shown["train"]["epochs"] == 3
    lines = [line.split() for line in out.splitlines() if line.startswith("#   ")]
    assert ["#", "train.lr", "tiny_cnn's", "recipe"] in lines and ["#", "train.epochs", "--model", "/", "key=value"] \
        in lines


def test_every_registered_models_recipe_is_a_valid_config():
    from pipeline.core.registry import models

    for name in models.list_models():
        recipe = models.get_recipe(name)
        cfg = config.resolve(overrides=[f"model.name={name}"])
        assert {key: getattr(cfg.train, key) for key in models.RECIPE_KEYS} == recipe.train_keys(), name
        assert recipe.min_image_size >= 1
