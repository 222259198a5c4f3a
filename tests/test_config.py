import pytest
import yaml

from tula import config
from tula.config import ConfigError


def test_defaults_fill_every_section():
    cfg = config.from_dict({})
    assert cfg.grid.nodes == (1, 2)
    assert cfg.search == "partial" and cfg.objective == "knee"
    assert cfg.pricing.per_node_hour == 2.48
    assert cfg.hardware.memory_budget_bytes == pytest.approx(16e9 * 0.9)


def test_shipped_config_is_valid():
    from conftest import ROOT

    cfg = config.load(ROOT / "workflow" / "config.yaml")
    assert cfg.workload.dataset == "digits" and cfg.hardware.device == "auto"


@pytest.mark.parametrize(
    "patch, key",
    [
        ({"grid": {"batch_min": -4}}, "grid.batch_min"),
        ({"grid": {"nodes": [0, 2]}}, "grid.nodes.0"),
        ({"grid": {"nodes": []}}, "grid.nodes"),
        ({"objective": "fastest"}, "objective"),
        ({"search": "some"}, "search"),
        ({"grid": {"nodes": [3], "batch_min": 32, "batch_max": 64}}, "grid.nodes"),
        ({"grid": {"batch_min": 48, "batch_max": 64}}, "grid.batch_min"),
        ({"grid": {"batch_min": 128, "batch_max": 64}}, "grid.batch_min"),
        ({"grid": {"batchmax": 64}}, "grid"),
        ({"workload": {"dataset": "imagenet"}}, "workload.dataset"),
        ({"pricing": {"per_node_hour": -1}}, "pricing.per_node_hour"),
        ({"hardware": {"device": "cpu", "backend": "nccl"}}, "hardware.backend"),
        ({"constraints": {"min_nodes": 4, "max_nodes": 2}}, "constraints.min_nodes"),
    ],
)
def test_bad_values_name_the_key(patch, key):
    with pytest.raises(ConfigError) as err:
        config.from_dict(patch)
    assert f"'{key}'" in str(err.value)


def test_b_not_divisible_by_n_explains_why():
    with pytest.raises(ConfigError, match="does not divide the global batch"):
        config.from_dict({"grid": {"nodes": [1, 3], "batch_min": 32, "batch_max": 64}})


def test_load_errors_name_the_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        config.load(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("grid: [unclosed")
    with pytest.raises(ConfigError, match=str(bad)):
        config.load(bad)


def test_snapshot_is_rewritten_only_on_change(tmp_path):
    path = tmp_path / "snap.json"
    config.snapshot({"objective": "time"}, path)
    first = path.stat().st_mtime_ns
    config.snapshot({"objective": "time"}, path)
    assert path.stat().st_mtime_ns == first
    config.snapshot({"objective": "cost"}, path)
    assert config.load(path).objective == "cost"


def test_stage_settings_isolate_reruns():
    a = config.from_dict({"pricing": {"per_node_hour": 1.0}})
    b = config.from_dict({"pricing": {"per_node_hour": 9.0}})
    assert config.stage_settings(a, "probe") == config.stage_settings(b, "probe")
    assert config.stage_settings(a, "select") != config.stage_settings(b, "select")
    c = config.from_dict({"probe": {"timed_steps": 50}})
    assert config.stage_settings(a, "probe") != config.stage_settings(c, "probe")


def test_schema_file_is_the_packaged_one():
    from conftest import ROOT

    assert yaml.safe_load((ROOT / "workflow" / "config.schema.yaml").read_text()) == config.schema()


def test_a_dataset_path_that_does_not_exist_is_a_config_error_before_any_loading(tmp_path):
    npz = tmp_path / "d.npz"
    with pytest.raises(ConfigError, match=f"config key 'workload.dataset': npz file {npz} not found"):
        config.check_dataset_paths(config.from_dict({"workload": {"dataset": f"npz:{npz}"}}))
    npz.write_bytes(b"")
    config.check_dataset_paths(config.from_dict({"workload": {"dataset": f"npz:{npz}"}}))  # exists: layout is `tula check`'s
    (tmp_path / "img" / "train").mkdir(parents=True)
    with pytest.raises(ConfigError, match="image folder .*img/val not found"):
        config.check_dataset_paths(config.from_dict({"workload": {"dataset": f"imagefolder:{tmp_path / 'img'}"}}))
