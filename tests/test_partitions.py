"""The partitions a config plans on: each entry's own config, the errors that name the entry, a
config without the list planned as a table of one, the profile's, as before, and the results
this table will not read named as stale."""

import pytest

from tula import config, partitions, pipeline

SITE = {
    "hardware": {"gpu": "h100"},
    "cluster": {
        "workers_per_node": 4,
        "partitions": [
            {"name": "a100", "gpu": "a100-40gb", "per_worker_hour": 1.2},
            {"name": "h100", "gpu": "h100", "per_node_hour": 30.0, "max_nodes": 1, "account": "ml"},
            {"name": "cpu", "workers_per_node": 2},
        ],
    },
    "grid": {"workers": [1, 2, 4, 8]},
}


def derived(raw=SITE):
    d = config.validate(raw)
    return {n: config.from_dict(p.config) for n, p in partitions.table(d, {}).items()}


def test_each_entry_lays_its_gpu_nodes_price_and_name_over_the_config():
    parts = derived()
    a, h, c = parts["a100"], parts["h100"], parts["cpu"]
    # the memory budget follows each partition's GPU, not the config's h100
    assert (a.hardware.gpu, a.hardware.device_memory_gb) == ("a100-40gb", 40)
    assert (h.hardware.gpu, h.hardware.device_memory_gb) == ("h100", 80)
    assert c.hardware.gpu is None and "no hardware.gpu" in c.hardware.device_memory_why
    # max_nodes=1 at 4 workers a node keeps N <= 4; workers_per_node=2 keeps all of them
    assert h.grid.workers == (1, 2, 4) and c.grid.workers == (1, 2, 4, 8)
    assert c.cluster.workers_per_node == 2
    assert (a.pricing.model, a.pricing.per_worker_hour) == ("worker_hour", 1.2)
    assert (h.pricing.model, h.pricing.per_node_hour) == ("node_hour", 30.0)
    assert (h.launch.slurm_partition, h.launch.slurm_account) == ("h100", "ml")
    assert all(p.cluster.partitions == () for p in parts.values())


@pytest.mark.parametrize(
    "entries, said",
    [
        (
            [{"name": "x"}, {"name": "x"}],
            "'cluster.partitions[1]' (x): the partition is listed twice",
        ),
        (
            [{"name": "y", "gpu": "b300"}],
            "'cluster.partitions[0]' (y): its gpu: unknown GPU 'b300'",
        ),
        (
            [{"name": "z", "max_nodes": 1, "workers_per_node": 1}],
            "'cluster.partitions[0]' (z): max_nodes=1 holds none of grid.workers [2, 4]",
        ),
        (
            [{"name": "w", "per_worker_hour": 1, "per_node_hour": 2}],
            "'cluster.partitions[0]' (w): give one price",
        ),
        ([{"name": "bad name"}], "cluster.partitions.0.name"),
        ([{"name": "v", "per_worker_hour": -1}], "cluster.partitions.0.per_worker_hour"),
    ],
)
def test_a_wrong_entry_is_named(entries, said):
    raw = {"grid": {"workers": [2, 4]}, "cluster": {"partitions": entries}}
    with pytest.raises(config.ConfigError) as err:
        config.validate(raw)
    assert said in str(err.value)


def test_without_the_list_every_stage_sees_what_it_saw_before():
    """The keys this feature added change no stage's settings: an old results folder re-runs
    nothing, and a partition's own stages see only their own config."""
    before = config.from_dict({})
    assert before.cluster.partitions == ()
    d = before.to_dict()
    assert d["cluster"] == {"workers_per_node": 1, "netlab": None, "partitions": []}
    for stage in ("probe", "fit", "predict", "select", "launch"):
        assert '"partition' not in pipeline.stage_settings(before, stage)
    # a partition whose entry changes nothing plans what the one-partition config plans
    same = derived({"cluster": {"partitions": [{"name": "p"}]}})["p"]
    for stage in ("check", "memprobe", "probe", "fit", "predict"):
        assert pipeline.stage_settings(same, stage) == pipeline.stage_settings(before, stage)


PROFILE = {"probe_partition": "gpu", "train_partition": "long"}


def test_a_config_without_the_list_is_a_table_of_one_named_after_the_profile():
    d = config.validate({"launch": {"slurm_partition": None}})
    (one,) = partitions.table(d, PROFILE).values()
    # its config is the user's, its jobs go where the profile sends them
    assert (one.name, one.listed, one.config) == ("gpu", False, d)
    assert (one.probe_partition(PROFILE), one.train_partition(PROFILE)) == ("gpu", "long")
    # launch.slurm_partition sends the production job (not the probes) elsewhere
    moved = partitions.table(config.validate({"launch": {"slurm_partition": "big"}}), PROFILE)
    assert moved["gpu"].train_partition(PROFILE) == "big"
    # no partition in the profile: the cluster's default, named so
    (alone,) = partitions.table(d, {}).values()
    assert alone.name == partitions.DEFAULT_NAME and alone.probe_partition({}) is None


def test_listed_partitions_send_their_jobs_to_their_own_names_whatever_the_profile_says():
    d = config.validate(SITE)
    table = partitions.table(d, PROFILE)
    assert list(table) == ["a100", "h100", "cpu"] and all(p.listed for p in table.values())
    for name, part in table.items():
        assert part.probe_partition(PROFILE) == part.train_partition(PROFILE) == name
        assert part.config == partitions.config_for(
            d, partitions.entries(d)[list(table).index(name)]
        )


def test_what_this_table_will_not_read_is_named_and_left_in_place(tmp_path):
    res = tmp_path / "results"
    for old in ("partitions/a100/probes", "partitions/old/probes", "probes/N1", "logs/probe"):
        (res / old).mkdir(parents=True)
    (res / "partitions" / "chosen.json").write_text("{}")  # the choice's own file, not a folder
    said = partitions.stale(res, ["a100", "h100"])
    assert len(said) == 2 and said[0].startswith(f"{res / 'partitions' / 'old'} is another")
    assert f"{res / 'probes'}, {res / 'logs/probe'}: from Tula's layout before" in said[1]
    assert (res / "probes" / "N1").is_dir()  # named, not removed
    assert partitions.stale(tmp_path / "none", ["a100"]) == []


def test_no_key_tells_the_workflow_which_partition_it_plans():
    """A partition's jobs learn their partition from the {partition} wildcard and the table,
    not from a config key the user would have to leave unset: cluster.partition is unknown."""
    with pytest.raises(config.ConfigError, match="'partition' was unexpected"):
        config.validate({"cluster": {"partition": "gpu"}})
