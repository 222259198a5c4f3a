"""`tula queue` with no queue to ask: what the file says, and of which partition."""

import yaml

from tula.stages import queue


def test_the_queue_is_asked_of_the_partition_named_else_the_training_one(tmp_path):
    """Under the local executor there is no queue, and the file says so, naming the partition
    the workflow gave (a listed partition's name), else launch.slurm_partition."""
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"launch": {"slurm_partition": "long"}}))
    named = queue.run(tmp_path / "c.yaml", tmp_path / "q.json", "local", partition="lab0")
    assert (named["partition"], named["waits"]) == ("lab0", [])
    assert named["error"] == "no queue: the local executor runs every job here"
    assert queue.run(tmp_path / "c.yaml", tmp_path / "q.json", "local")["partition"] == "long"
