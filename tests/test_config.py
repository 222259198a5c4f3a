import json

import numpy as np
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


def test_snakemake_validates_with_the_schema_tula_loads_and_fills_the_same_defaults():
    """The workflow's validate() and tula's loader must apply one schema: the workflow file is a
    link to the packaged one (a copy could drift), and Snakemake fills the defaults tula uses."""
    import os

    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    from conftest import ROOT

    wf = ROOT / "workflow" / "config.schema.yaml"
    assert wf.is_symlink() and os.path.samefile(wf, config.SCHEMA_PATH)
    raw = {"grid": {"nodes": [1, 2]}, "workload": {"model": "resnet_tiny"}}
    filled = json.loads(json.dumps(raw))
    validate(filled, str(wf), set_default=True)
    cfg = config.from_dict(raw)
    assert (filled["grid"]["batch_min"], filled["grid"]["batch_max"], filled["grid"]["workers_per_node"]) == (
        cfg.grid.batch_min, cfg.grid.batch_max, cfg.grid.workers_per_node)  # fmt: skip
    assert (filled["objective"], filled["search"]) == (cfg.objective, cfg.search)
    with pytest.raises(WorkflowError, match="'x' is not of type 'array'"):
        validate({"grid": {"nodes": "x"}}, str(wf))
    with pytest.raises(ConfigError, match="grid.nodes"):
        config.from_dict({"grid": {"nodes": "x"}})


def test_a_dataset_path_that_does_not_exist_is_a_config_error_before_any_loading(tmp_path):
    npz = tmp_path / "d.npz"
    with pytest.raises(ConfigError, match=f"config key 'workload.dataset': npz file {npz} not found"):
        config.check_dataset_paths(config.from_dict({"workload": {"dataset": f"npz:{npz}"}}))
    cfg = config.from_dict({"workload": {"dataset": f"npz:{npz}"}})
    npz.write_bytes(b"not a zip")
    with pytest.raises(ConfigError, match=f"config key 'workload.dataset': {npz} is not a readable .npz archive"):
        config.check_dataset_paths(cfg)
    np.savez(npz, x_train=np.zeros((4, 8)), y_train=np.zeros(4, int), x_test=np.zeros((2, 8)))
    with pytest.raises(ConfigError, match=r"missing array\(s\) y_test; an npz dataset needs x_train, y_train, x_test"):
        config.check_dataset_paths(cfg)  # the array names only: nothing is loaded
    np.savez(npz, x_train=np.zeros((4, 8)), y_train=np.zeros(4, int), x_test=np.zeros((2, 8)), y_test=np.zeros(2, int))
    config.check_dataset_paths(cfg)  # the arrays' shapes and labels are `tula check`'s (it loads them)
    (tmp_path / "img" / "train").mkdir(parents=True)
    with pytest.raises(ConfigError, match="image folder .*img/val not found"):
        config.check_dataset_paths(config.from_dict({"workload": {"dataset": f"imagefolder:{tmp_path / 'img'}"}}))


def test_conda_env_file_installs_this_checkout_wherever_snakemake_copies_it(tmp_path):
    """Snakemake creates conda environments from a copy of the env file under .snakemake/conda/,
    so `-e ..` must become an absolute path; checked with pip itself from another directory
    (conda cannot be installed here: its packages come from conda-forge, which this machine and
    CI cannot reach)."""
    import subprocess
    import sys

    from conftest import ROOT

    out = config.conda_env(ROOT / "envs" / "tula.yaml", tmp_path / ".snakemake" / "tula" / "conda-env.yaml")
    env = yaml.safe_load(out.read_text())
    (pip,) = [d["pip"] for d in env["dependencies"] if isinstance(d, dict)]
    assert pip == [f"-e {ROOT}"] and "python=3.11" in env["dependencies"]
    copy = tmp_path / ".snakemake" / "conda" / "0123abcd.yaml"  # where Snakemake puts its copy
    copy.parent.mkdir(parents=True)
    copy.write_text(out.read_text())
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--no-build-isolation",
                        "--no-index", *pip[0].split()], cwd=copy.parent, capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0 and "Would install tula" in r.stdout, r.stdout + r.stderr
    # other pip entries are kept; relative paths resolve from the template's directory
    tpl = tmp_path / "envs" / "t.yaml"
    tpl.parent.mkdir()
    tpl.write_text(yaml.safe_dump({"dependencies": ["pip", {"pip": ["numpy>=1", "-e ..", "./vendored"]}]}))
    got = yaml.safe_load(config.conda_env(tpl, tmp_path / "o.yaml").read_text())["dependencies"][1]["pip"]
    assert got == ["numpy>=1", f"-e {tmp_path}", str(tmp_path / "envs" / "vendored")]
