"""`tula check` of a user's script (workload.script): the script is run here for two steps
(a real process, gloo) and refused, naming workload.script and the script's own error line,
when it crashes, never marks a step, never attaches or loads batches of its own size."""

import json
import re
import textwrap

import pytest
import yaml

from tula import config
from tula.stages import check

# each script must reach its steps within probe.timeout_s: never at idle CPU priority
pytestmark = pytest.mark.wallclock

SCRIPT = """\
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

{attach}
dist.init_process_group("gloo")
model = nn.parallel.DistributedDataParallel(nn.Linear(4, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
{keep}
data = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
loader = DataLoader(data, batch_size={batch})


{marker}
def step(x, y):
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y){crash}
    loss.backward()
    opt.step()
    return loss


for epoch in {epochs}:
    for x, y in {batches}:
        step(x, y)
"""
GOOD = {
    "attach": "import tula.script\nrun = tula.script.attach(int(sys.argv[2]), epochs=1)",
    "keep": "run.keep(model=model, optimizer=opt)",
    "batch": "run.local_batch",
    "marker": "@run.step",
    "crash": "",
    "epochs": "run.epochs()",
    "batches": "run.batches(loader)",
}


def _config(tmp_path, **change):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(**{**GOOD, **change}))
    raw = {
        "workload": {"script": str(script), "args": ["--bs", "{local_batch}"], "epochs": 1},
        "grid": {"workers": [1, 2], "batch_min": 16, "batch_max": 32},
        "probe": {"timeout_s": 120},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _refused(tmp_path, **change) -> str:
    with pytest.raises(config.ConfigError) as err:
        check.run(_config(tmp_path, **change), out=tmp_path / "workload.json")
    assert not (tmp_path / "workload.json").exists()  # nothing written for a refused script
    return str(err.value)


def test_a_script_that_marks_its_steps_is_run_here_and_described(tmp_path):
    w = check.run(_config(tmp_path), out=tmp_path / "workload.json")
    rec = json.loads((tmp_path / "workload.json").read_text())
    assert rec["workload"] == "script" and rec["train_samples"] == 64 == w["train_samples"]
    c = rec["check"]
    assert c["status"] == "ok" and c["steps"] == 2 and c["batch_lengths"] == [8]  # b = 16 / 2
    assert c["parts"] == {"model": "DistributedDataParallel", "optimizer": "SGD"} and c["ddp"]
    assert rec["warnings"] == []


def test_a_script_that_crashes_in_its_first_step_is_refused_with_its_own_line(tmp_path):
    said = _refused(tmp_path, crash="\n    loss = loss / 0 if loss.numel() > 1 else 1 / 0")
    assert said.startswith("config key 'workload.script': ")
    assert "failed in its first step: ZeroDivisionError: division by zero" in said
    assert re.search(r"\(train\.py, line 22: loss = loss / 0 if", said), said


def test_a_script_that_fails_before_its_first_step_is_refused_with_its_own_line(tmp_path):
    said = _refused(tmp_path, keep="import no_such_module_here")
    assert "failed before its first step: ModuleNotFoundError: No module named" in said
    assert "(train.py, line 13: import no_such_module_here)" in said


def test_a_script_that_never_marks_a_step_is_refused(tmp_path):
    said = _refused(tmp_path, marker="")
    assert "never called the step marker (run.step)" in said and "workload.script" in said


def test_a_script_that_never_attaches_is_refused(tmp_path):
    said = _refused(
        tmp_path,
        attach="",
        keep="",
        batch="8",
        marker="",
        epochs="range(1)",
        batches="loader",
    )
    assert "ran to its end without calling tula.script.attach()" in said


def test_a_script_that_loads_batches_of_its_own_size_is_refused(tmp_path):
    said = _refused(tmp_path, batch="5")
    assert "its batches hold 5 samples but Tula asked for 8" in said


def test_a_script_without_parts_to_keep_is_run_with_a_warning(tmp_path):
    check.run(_config(tmp_path, keep=""), out=tmp_path / "workload.json")
    (warning,) = json.loads((tmp_path / "workload.json").read_text())["warnings"][:1]
    assert "hands Tula no parts to checkpoint" in warning and "starts it over" in warning


def test_the_scripts_own_line_is_found_in_a_traceback():
    from tula.stages.check.script import own_line

    text = textwrap.dedent(
        """\
        Traceback (most recent call last):
          File "/x/runpy.py", line 1, in run
          File "/a/train.py", line 9, in main
            step(x)
          File "/a/train.py", line 4, in step
            y = x / 0
          File "/lib/torch.py", line 3, in f
        ZeroDivisionError: division by zero
        """
    )
    assert own_line(text, "/a/train.py") == (
        "ZeroDivisionError: division by zero (train.py, line 4: y = x / 0)"
    )
