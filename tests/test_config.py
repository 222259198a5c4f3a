import json
import re

import numpy as np
import pytest

from tula import config, dataset_paths, model_inputs
from tula.config import ConfigError
from tula.model import grid


def test_defaults_fill_every_section():
    cfg = config.from_dict({})
    assert cfg.grid.workers == (1, 2)
    assert cfg.search == "partial" and cfg.objective == "knee"
    assert cfg.pricing.per_worker_hour == 2.48 and cfg.pricing.model == "worker_hour"
    assert cfg.hardware.memory_budget_bytes == pytest.approx(16e9 * 0.9)


def test_shipped_config_is_valid():
    from conftest import ROOT

    cfg = config.load(ROOT / "workflow" / "config.yaml")
    # the quick start's promise: a set made locally (no download), on whatever device is here
    assert cfg.workload.dataset in ("digits", "mnist1d") and cfg.hardware.device == "auto"


@pytest.mark.parametrize(
    "patch, key",
    [
        ({"grid": {"batch_min": -4}}, "grid.batch_min"),
        ({"grid": {"workers": [0, 2]}}, "grid.workers.0"),
        ({"grid": {"workers": []}}, "grid.workers"),
        ({"objective": "fastest"}, "objective"),
        ({"search": "some"}, "search"),
        ({"grid": {"workers": [3], "batch_min": 32, "batch_max": 64}}, "grid.workers"),
        ({"grid": {"batch_min": 48, "batch_max": 64}}, "grid.batch_max"),
        ({"grid": {"batch_min": 48, "batch_max": 512}}, "grid.batch_max"),
        ({"grid": {"batch_min": 128, "batch_max": 64}}, "grid.batch_min"),
        ({"grid": {"batchmax": 64}}, "grid"),
        ({"workload": {"dataset": "imagenet"}}, "workload.dataset"),
        ({"pricing": {"per_worker_hour": -1}}, "pricing.per_worker_hour"),
        ({"hardware": {"device": "cpu", "backend": "nccl"}}, "hardware.backend"),
        ({"constraints": {"min_workers": 4, "max_workers": 2}}, "constraints.min_workers"),
    ],
)
def test_bad_values_name_the_key(patch, key):
    with pytest.raises(ConfigError) as err:
        config.from_dict(patch)
    assert f"'{key}'" in str(err.value)


@pytest.mark.parametrize(
    "old, message",
    [
        ({"grid": {"nodes": [1, 2]}}, "config key 'grid.nodes' was renamed: use grid.workers"),
        (
            {"grid": {"workers_per_node": 8}},
            "config key 'grid.workers_per_node' was renamed: use cluster.workers_per_node",
        ),
        (
            {"constraints": {"min_nodes": 2}},
            "config key 'constraints.min_nodes' was renamed: use constraints.min_workers",
        ),
        (
            {"constraints": {"max_nodes": 2}},
            "config key 'constraints.max_nodes' was renamed: use constraints.max_workers",
        ),
        ({"compare": {"nodes": 2}}, "config key 'compare.nodes' was renamed: use compare.workers"),
        (
            {"pricing": {"model": "node"}},
            "config key 'pricing.model': `node` (it charged per worker) was renamed: use "
            "`worker_hour`",
        ),
        (
            {"pricing": {"per_node_hour": 2.48}},
            "config key 'pricing.per_node_hour': a whole node's price is used only by "
            "`pricing.model: node_hour`",
        ),
        (
            {"pricing": {"model": "node_hour"}},
            "config key 'pricing.per_node_hour': `pricing.model: node_hour` needs",
        ),
    ],
)
def test_old_keys_are_refused_naming_their_replacement(old, message):
    """A config written before N was called workers is never read under the old meaning."""
    with pytest.raises(ConfigError) as err:
        config.from_dict(old)
    assert message in str(err.value)


def test_node_hour_pricing_with_its_price_is_accepted():
    cfg = config.from_dict(
        {
            "pricing": {"model": "node_hour", "per_node_hour": 20.0},
            "cluster": {"workers_per_node": 8},
        }
    )
    assert (cfg.pricing.model, cfg.pricing.per_node_hour, cfg.cluster.workers_per_node) == (
        "node_hour",
        20.0,
        8,
    )


def test_b_not_divisible_by_n_explains_why():
    with pytest.raises(ConfigError, match="does not divide the global batch"):
        config.from_dict({"grid": {"workers": [1, 3], "batch_min": 32, "batch_max": 64}})


def test_load_errors_name_the_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        config.load(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("grid: [unclosed")
    with pytest.raises(ConfigError, match=str(bad)):
        config.load(bad)


def test_snakemake_validates_with_the_schema_tula_loads_and_fills_the_same_defaults():
    """The workflow's validate() and tula's loader must apply one schema: the workflow file is a
    link to the packaged one (a copy could drift), and Snakemake fills the defaults tula uses."""
    import os

    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    from conftest import ROOT

    wf = ROOT / "workflow" / "config.schema.yaml"
    assert wf.is_symlink() and os.path.samefile(wf, config.SCHEMA_PATH)
    raw = {"grid": {"workers": [1, 2]}, "workload": {"model": "resnet_tiny"}}
    filled = json.loads(json.dumps(raw))
    validate(filled, str(wf), set_default=True)
    cfg = config.from_dict(raw)
    assert (
        filled["grid"]["batch_min"],
        filled["grid"]["batch_max"],
        filled["cluster"]["workers_per_node"],
    ) == (cfg.grid.batch_min, cfg.grid.batch_max, cfg.cluster.workers_per_node)
    assert (filled["objective"], filled["search"]) == (cfg.objective, cfg.search)
    with pytest.raises(WorkflowError, match="'x' is not of type 'array'"):
        validate({"grid": {"workers": "x"}}, str(wf))
    with pytest.raises(ConfigError, match="grid.workers"):
        config.from_dict({"grid": {"workers": "x"}})


@pytest.mark.parametrize(
    "raw, says",
    [
        ({"workload": {"model": "resnet51"}}, "'resnet51' is not a shipped model (small_cnn,"),
        ({"workload": {"dataset": "cifar10"}}, "'cifar10' is not digits, mnist1d, npz:<path>"),
        ({"cluster": {"netlab": "Lab-1"}}, "'Lab-1' is not a lab's name, lower-case letters"),
        (
            {"hardware": {"comm_env": {"FOO": 1}}},
            "config key 'hardware.comm_env': 'FOO' is not a variable named NCCL_*, GLOO_*",
        ),
    ],
)
def test_a_value_its_pattern_refuses_is_said_in_words_not_as_the_pattern(raw, says):
    with pytest.raises(ConfigError) as err:
        config.from_dict(raw)
    assert says in str(err.value)
    assert "does not match" not in str(err.value)


def test_a_dataset_path_that_does_not_exist_is_a_config_error_before_any_loading(tmp_path):
    npz = tmp_path / "d.npz"
    with pytest.raises(
        ConfigError, match=f"config key 'workload.dataset': npz file {npz} not found"
    ):
        dataset_paths.check_dataset_paths(config.from_dict({"workload": {"dataset": f"npz:{npz}"}}))
    cfg = config.from_dict({"workload": {"dataset": f"npz:{npz}"}})
    npz.write_bytes(b"not a zip")
    with pytest.raises(
        ConfigError, match=f"config key 'workload.dataset': {npz} is not a readable .npz archive"
    ):
        dataset_paths.check_dataset_paths(cfg)
    np.savez(npz, x_train=np.zeros((4, 8)), y_train=np.zeros(4, int), x_test=np.zeros((2, 8)))
    with pytest.raises(
        ConfigError,
        match=r"missing array\(s\) y_test; an npz dataset needs x_train, y_train, x_test",
    ):
        dataset_paths.check_dataset_paths(cfg)  # the array names only: nothing is loaded
    np.savez(
        npz,
        x_train=np.zeros((4, 8)),
        y_train=np.zeros(4, int),
        x_test=np.zeros((2, 8)),
        y_test=np.zeros(2, int),
    )
    # the arrays' shapes and labels are `tula check`'s (it loads them)
    dataset_paths.check_dataset_paths(cfg)
    (tmp_path / "img" / "train").mkdir(parents=True)
    with pytest.raises(ConfigError, match="image folder .*img/val not found"):
        dataset_paths.check_dataset_paths(
            config.from_dict({"workload": {"dataset": f"imagefolder:{tmp_path / 'img'}"}})
        )


def test_a_grid_of_doublings_need_not_start_at_a_power_of_two():
    """B = 48, 96, ..., 768 (six workers' nodes, or a knee clear of knee_gain) is a grid; a
    batch_max off the doublings is refused with the two that would do."""
    cfg = config.from_dict({"grid": {"workers": [1, 2, 6], "batch_min": 48, "batch_max": 768}})
    assert grid.batch_sizes(model_inputs.grid_spec(cfg)) == [48, 96, 192, 384, 768]
    with pytest.raises(ConfigError, match=r"grid.batch_max.*use 384 or 768"):
        config.from_dict({"grid": {"batch_min": 48, "batch_max": 512}})


def test_hardware_gpu_by_name_sets_the_memory_unless_given():
    """A GPU Tula knows gives hardware.device_memory_gb (its memory) unless the config sets it;
    explicit figures stand for one it does not know."""
    assert config.from_dict({"hardware": {"gpu": "H100"}}).hardware.device_memory_gb == 80
    assert (
        config.from_dict({"hardware": {"gpu": "h100", "device_memory_gb": 40}}).hardware
    ).device_memory_gb == 40
    mine = {"memory_gb": 24, "bandwidth_gbs": 500, "fp32_tflops": 20, "bf16_tflops": 80}
    hw = config.from_dict({"hardware": {"gpu": mine}}).hardware
    assert hw.device_memory_gb == 24 and hw.gpu == mine
    assert config.from_dict({}).hardware.device_memory_gb == 16  # no GPU named: as before


def test_an_unknown_gpu_is_refused_naming_the_key_and_the_known_names():
    with pytest.raises(config.ConfigError) as err:
        config.from_dict({"hardware": {"gpu": "h1000"}})
    msg = str(err.value)
    assert "config key 'hardware.gpu': unknown GPU 'h1000'" in msg
    assert all(name in msg for name in ("h100", "a100-80gb", "l40s", "v100-32gb"))
    with pytest.raises(config.ConfigError, match=r"hardware.gpu.*fp32_tflops"):
        config.from_dict({"hardware": {"gpu": {"memory_gb": 24, "bandwidth_gbs": 500}}})


SCRIPT = "examples/ddp_train/train.py"


@pytest.mark.parametrize(
    "workload, extra, says",
    [
        ({"script": "no/such/train.py"}, {}, "'workload.script': no/such/train.py is not a file"),
        (
            {"script": SCRIPT, "args": ["--bs", "{batch}"]},
            {},
            "'workload.args[1]': {batch} is not one of {local_batch}, {global_batch}, {lr}",
        ),
        ({"script": SCRIPT, "args": ["{local_batch"]}, {}, "'workload.args[0]'"),
        ({"args": ["--bs", "{local_batch}"]}, {}, "'workload.args': arguments without"),
        (
            {"script": SCRIPT},
            {"objective": "time_to_accuracy"},
            "'objective': time_to_accuracy needs the gradient noise scale",
        ),
        (
            {"script": SCRIPT},
            {"train": {"accumulate": 4}},
            "'train.accumulate': 4 micro-batches are your script's to make",
        ),
    ],
)
def test_a_script_workload_is_checked_before_anything_runs(monkeypatch, workload, extra, says):
    from conftest import ROOT

    monkeypatch.chdir(ROOT)  # the script's path is the run's, from the repository's root
    with pytest.raises(ConfigError, match=re.escape(says)):
        config.from_dict({"workload": workload, **extra})


def test_a_script_workload_loads_with_its_arguments(monkeypatch):
    from conftest import ROOT

    monkeypatch.chdir(ROOT)
    cfg = config.from_dict({"workload": {"script": SCRIPT, "args": ["--bs", "{local_batch}"]}})
    assert cfg.workload.script == SCRIPT and cfg.workload.args == ("--bs", "{local_batch}")


def test_train_accumulate_is_auto_or_a_whole_number_of_micro_batches():
    assert config.from_dict({}).train.accumulate == "auto"
    assert config.from_dict({"train": {"accumulate": 4}}).train.accumulate == 4
    for bad in (0, 2.5, "some"):
        with pytest.raises(ConfigError, match=r"'train.accumulate': .* is not auto or a whole"):
            config.from_dict({"train": {"accumulate": bad}})
