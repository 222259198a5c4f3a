"""tula check (tula.stages.check): the config, the search set, and the workload itself, each
mistake named by its config key before anything is queued."""

import json
import re

import pytest
import yaml

from tula.cli import main
from tula.stages import check


def test_check_lists_the_search_set(tiny_config_file, capsys):
    assert main(["check", "--config", str(tiny_config_file)]) == 0
    assert "N1_B32, N1_B128, N2_B32, N2_B128" in capsys.readouterr().out


def test_check_config_only_stops_at_a_dataset_file_that_is_not_there(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("workload:\n  dataset: npz:/no/such/file.npz\n")
    assert main(["check", "--config", str(cfg), "--config-only"]) == 2
    captured = capsys.readouterr()
    assert "npz file /no/such/file.npz not found" in captured.err and "valid" not in captured.out


@pytest.mark.parametrize(
    "key, spec, message",
    [
        (
            "model",
            "no_such_package.models:build",
            "workload.model.*cannot import module 'no_such_package.models'",
        ),
        ("model", "user_workload:missing", "workload.model.*has no attribute 'missing'"),
        ("model", "user_workload:NOT_CALLABLE", "workload.model.*is a int, not a callable"),
        (
            "model",
            "user_workload:returns_a_string",
            "workload.model.*returned a str, not a torch.nn.Module",
        ),
        (
            "model",
            "user_workload:wrong_output",
            r"workload.model.*\(batch, num_classes\) = \(2, 3\).*got \(2, 4\)",
        ),
        ("model", "tv_resnet18", r"workload.model.*3-channel images"),
        ("dataset", "no_such_package:data", "workload.dataset.*cannot import module"),
        (
            "dataset",
            "user_workload:returns_one_dataset",
            r"workload.dataset.*must return \(train_dataset, test_dataset\)",
        ),
        (
            "dataset",
            "user_workload:yields_dicts",
            r"workload.dataset.*must be \(tensor, int\); got dict",
        ),
        (
            "dataset",
            "npz:/no/such/file.npz",
            "workload.dataset.*npz file /no/such/file.npz not found",
        ),
        (
            "dataset",
            "imagefolder:/no/such/dir",
            "workload.dataset.*image folder /no/such/dir/train not found",
        ),
    ],
)
def test_tula_check_names_each_bad_model_or_dataset(
    tmp_path, user_pythonpath, capsys, key, spec, message
):
    good = {"model": "user_workload:make_model", "dataset": "user_workload:make_datasets"}
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"workload": {**good, key: spec}}))
    assert main(["check", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tula check: error: ") and re.search(message, err), err


def test_check_warns_when_image_size_upsamples_the_stored_images(tmp_path, capsys):
    """20 px images at the default image_size 224: 125x the pixels, named with the key to set;
    at image_size 16 (a crop of them) nothing to say."""
    from conftest import make_image_folder

    root = make_image_folder(
        tmp_path / "img", classes=3, train_per_class=4, val_per_class=2, size=20
    )
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"workload": {"dataset": f"imagefolder:{root}"}}))
    assert main(["check", "--config", str(cfg), "--out", str(tmp_path / "w.json")]) == 0
    out = capsys.readouterr().out
    assert (
        "warning: config key 'data.image_size' is 224, but the images of imagefolder:" in out
        and "are 20x20 px: each is upsampled to 224x224, 125x its pixels" in out
        and "set data.image_size: 20" in out
    )
    assert json.loads((tmp_path / "w.json").read_text())["stored_image_size"] == [20, 20]
    cfg.write_text(
        yaml.safe_dump({"workload": {"dataset": f"imagefolder:{root}"}, "data": {"image_size": 16}})
    )
    assert main(["check", "--config", str(cfg), "--out", str(tmp_path / "w.json")]) == 0
    assert (
        "warning" not in capsys.readouterr().out
        and json.loads((tmp_path / "w.json").read_text())["warnings"] == []
    )
    # auto, on this machine without a GPU
    assert json.loads((tmp_path / "w.json").read_text())["decode"] == "cpu"
    # GPU decoding reads JPEGs only: refused before any job, naming the key and a file
    cfg.write_text(
        yaml.safe_dump({"workload": {"dataset": f"imagefolder:{root}"}, "data": {"decode": "gpu"}})
    )
    assert main(["check", "--config", str(cfg)]) == 2
    assert re.search(r"data.decode.*JPEG files only.*\.png is not one", capsys.readouterr().err)


def test_the_probe_campaign_is_priced_before_it_runs():
    """Jobs, nodes per job and node-hours at the probe time limit, for 4-GPU nodes: the
    partial search's corners at N = 1 (one node) and N = 8 (two whole nodes), and N = 4, the
    largest one-node N (the node boundary)."""
    from tula import config
    from tula.stages.check import campaign, describe_campaign

    cfg = config.from_dict(
        {
            "grid": {"workers": [1, 4, 8], "batch_min": 32, "batch_max": 256},
            "cluster": {"workers_per_node": 4},
            "probe": {"timeout_s": 3300},
        }
    )
    c = campaign(cfg)
    # one probe job per N, measuring its batches in turn; each asks for probe.timeout_s per batch
    assert [(j["job"], j["nodes"], j.get("batches")) for j in c["jobs"]] == [
        ("memory probe", 1, None),
        ("N1", 1, [32, 256]),
        ("N4", 1, [32, 256]),
        ("N8", 2, [32, 256]),
    ]
    assert (c["probe_jobs"], c["points"], c["node_jobs"]) == (3, 6, 5)
    assert c["hours_per_job_max"] == pytest.approx((2 * 3300 // 60 + 5) / 60)  # 115 min
    assert c["node_hours_max"] == pytest.approx(1.0 + 4 * 115 / 60)  # memory probe 60 min
    assert describe_campaign(c) == (
        "probe campaign: the memory probe (1 node) and 3 probe job(s), one per N, 6 point(s) in "
        "all: 2 on 1 node(s) (N1: B 32, 256; N4: B 32, 256); 1 on 2 node(s) (N8: B 32, 256); 5 "
        "node-jobs of at most 115 min (whole nodes: probe.exclusive), at most 8.7 node-hours "
        "(every job at its time limit)"
    )
    # b_max known: the corners that fit in one batch (N = 1 has none at b <= 16), and the
    # largest point at the largest N as micro-batches (train.accumulate: auto; k = 2 there)
    assert [(j["job"], j["batches"]) for j in campaign(cfg, max_local_batch=16)["jobs"][1:]] == [
        ("N4", [32, 64]),
        ("N8", [32, 128, 256]),
    ]


def test_check_says_when_partial_search_adds_the_node_boundary(tmp_path, capsys):
    import yaml

    from tula.stages import check

    (tmp_path / "c.yaml").write_text(
        yaml.safe_dump(
            {
                "grid": {"workers": [1, 4, 8, 16], "batch_min": 32, "batch_max": 256},
                "cluster": {"workers_per_node": 8},
            }
        )
    )
    check.run(tmp_path / "c.yaml", config_only=True)
    out = capsys.readouterr().out
    assert (
        "the grid crosses a node boundary (cluster.workers_per_node=8): partial search also probes "
        "N=8 (the largest on one node) and N=16 (the smallest on several)"
    ) in out
    assert "N1_B32, N1_B256, N8_B32, N8_B256, N16_B32, N16_B256" in out
    assert "3 probe job(s), one per N, 6 point(s)" in out


def test_check_plans_on_the_named_gpu_before_anything_is_queued(tiny_raw, tmp_path, capsys):
    """With hardware.gpu, tula check prints the step's estimate for CUDA (whatever this node
    has), b_max per N after the margin, the points the estimate rules out (and the campaign
    without them), each point's roofline time, and the campaign's price range."""
    import re

    import yaml

    from tula import config
    from tula.io import read_json
    from tula.model import estimated

    tiny_raw["grid"]["batch_max"] = 256
    # a GPU small enough that the largest local batches cannot fit
    tiny_raw["hardware"] = {
        "gpu": {"memory_gb": 0.015, "bandwidth_gbs": 100, "fp32_tflops": 1, "tf32_tflops": 2}
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(tiny_raw))
    check.run(path, tmp_path / "workload.json")  # train.accumulate: auto, the default
    assert "train.accumulate: auto runs them as micro-batches that fit" in capsys.readouterr().out
    tiny_raw["train"]["accumulate"] = 1  # one batch a step: what does not fit is not probed
    path.write_text(yaml.safe_dump(tiny_raw))
    check.run(path, tmp_path / "workload.json")
    said = capsys.readouterr().out
    est = read_json(tmp_path / "workload.json")["estimate"]
    cfg = config.load(path)
    assert est["device"] == "cuda" and cfg.hardware.device_memory_gb == 0.015
    bmax = estimated.max_local_batch(est, cfg.hardware.memory_budget_bytes)
    assert f"b_max = {bmax} per worker, so N=1: B <= {bmax}, N=2: B <= {2 * bmax}" in said
    out = re.search(r"in one batch by the estimate \(not probed\): (.*)", said).group(1)
    ruled = [
        f"N={n} B={b}"
        for n in (1, 2)
        for b in (32, 64, 128, 256)
        if estimated.clearly_out(est, cfg.hardware.memory_budget_bytes, b // n)
    ]
    assert ruled and [x.split(" (")[0] for x in out.split(", ")] == ruled
    campaign = re.search(r"so the campaign probes at most \d+: (.*)", said).group(1)
    assert not set(campaign.split(", ")) & {r.replace("=", "").replace(" ", "_") for r in ruled}
    for n in (1, 2):
        assert re.search(rf"  N={n}: B=32 [\d.]+, B=64 [\d.]+, B=128 [\d.]+, B=256 [\d.]+", said)
    assert re.search(
        r"probe campaign's price: [\d.e-]+ to [\d.e-]+ USD \(\d probes in \d jobs", said
    )


def test_check_goes_on_without_an_estimate_for_a_model_that_reads_its_values(
    tiny_raw, tmp_path, capsys, user_pythonpath
):
    import yaml

    from tula.io import read_json

    tiny_raw["workload"] = {"model": "user_workload:reads_its_values", "dataset": "digits"}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(tiny_raw))
    check.run(path, tmp_path / "workload.json")
    assert "estimate: none (config key 'workload.model'" in capsys.readouterr().out
    assert read_json(tmp_path / "workload.json")["estimate"] is None


def test_the_estimate_counts_the_training_set_the_jobs_keep_on_the_gpu(tiny_raw, tmp_path, capsys):
    """On a named GPU, data.on_device auto keeps an in-memory set there (at most a quarter of
    the budget) and the memory probe measures with it, so the estimate's fixed part holds its
    stored bytes (the H200's ResNet-50 estimate was 30 % under the probe at b = 32 without
    them); data.on_device false keeps it on the host, and the estimate without it."""
    import yaml

    from tula import config
    from tula.io import read_json
    from tula.runtime.input import data as data_mod
    from tula.runtime.input.loader import resident_bytes

    tiny_raw["hardware"] = {"gpu": "h100"}
    fixed = {}
    for on_device in ("auto", False):
        tiny_raw["data"] = {"on_device": on_device}
        path = tmp_path / f"{on_device}.yaml"
        path.write_text(yaml.safe_dump(tiny_raw))
        check.run(path, tmp_path / "workload.json")
        fixed[on_device] = read_json(tmp_path / "workload.json")["estimate"]
    said = capsys.readouterr().out
    stored = resident_bytes(data_mod.load_config(config.load(tmp_path / "auto.yaml")))
    assert stored and fixed["auto"]["resident_bytes"] == stored
    assert fixed[False]["resident_bytes"] == 0
    assert fixed["auto"]["fixed_bytes"] - fixed[False]["fixed_bytes"] == stored
    assert said.count("the fixed part holds the training set kept on the GPU") == 1
