"""tula.script in one process: a script run without Tula passes every call through; the walk
says each step's kind and a resumed epoch draws the same batches; the spec Tula hands the
script round-trips through the environment; the script's arguments get their placeholders."""

import gc
import sys

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import tula.script
from tula import checkpoint
from tula.script.walk import Walk, batch_length
from tula.workers.script_run import ENV, ProbeAsk, ScriptRun, TrainAsk, run_script, script_argv


@pytest.fixture
def no_tula(monkeypatch):
    for var in (ENV, "RANK", "WORLD_SIZE", "SLURM_PROCID"):
        monkeypatch.delenv(var, raising=False)


def test_without_tula_the_script_runs_its_own_loop_and_every_call_passes_through(no_tula):
    run = tula.script.attach(local_batch=16, epochs=3, lr=0.1)
    assert (run.role, run.probing, run.local_batch, run.global_batch, run.world) == (
        None,
        False,
        16,
        16,
        1,
    )
    assert run.lr == 0.1 and run.num_epochs == 3 and tula.script.current() is run
    model = nn.Linear(4, 2)
    run.keep(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=run.lr))
    seen = []

    @run.step
    def step(x):
        seen.append(len(x))
        return x.sum()

    loader = DataLoader(TensorDataset(torch.arange(40.0)), batch_size=run.local_batch)
    epochs = []
    for epoch in run.epochs():
        epochs.append(epoch)
        for (x,) in run.batches(loader):
            assert step(x) == x.sum()  # the step's own return value
        run.epoch_end(loss=1.0, metric=0.5)
    assert epochs == [0, 1, 2] and seen == [16, 16, 8] * 3
    assert run.finished and run.finish() is None  # nothing of Tula's to finish


def test_a_marked_block_is_a_step_too(no_tula):
    run = tula.script.attach(local_batch=4, epochs=1)
    with run.step():
        pass
    assert run.walk.steps_done == 1


def test_keep_refuses_what_it_cannot_save_naming_the_part(no_tula):
    run = tula.script.attach(local_batch=4)
    with pytest.raises(TypeError, match=r"run.keep\(counter=...\) got a object.*state_dict"):
        run.keep(counter=object())


def test_epochs_need_a_count_without_tula(no_tula):
    run = tula.script.attach(local_batch=4)
    with pytest.raises(ValueError, match="needs a count"):
        next(run.epochs())
    assert list(run.epochs(2)) == [0, 1]


def test_each_steps_kind_is_known_before_it_runs():
    walk, kinds = Walk(local_batch=16), []
    loader = DataLoader(TensorDataset(torch.arange(40.0)), batch_size=16)
    for _ in walk.epochs(2):
        for _ in walk.batches(loader, lambda: None, lambda: None):
            kinds.append(walk.next_kind)
            walk.stepped()
    assert kinds == ["start", "plain", "partial"] * 2
    assert walk.train_samples == 40 and walk.epoch == 2 and walk.steps_done == 6


def test_batch_length_reads_tensors_tuples_and_dicts():
    x = torch.zeros(5, 3)
    assert batch_length(x) == 5 and batch_length((x, torch.zeros(5))) == 5
    assert batch_length({"image": x}) == 5 and batch_length(["no", "tensor"]) is None


def _epoch(walk, loader, stop_after=None):
    """The batches walk gives of its current epoch (up to ``stop_after`` stepped)."""
    got = []
    for (x,) in walk.batches(loader, lambda: None, lambda: None):
        got.append(x.clone())
        walk.stepped()
        torch.rand(1)  # the step draws from the RNG too (dropout, augmentation)
        if stop_after is not None and len(got) == stop_after:
            break
    return got


def test_a_resumed_epoch_skips_what_it_stepped_and_draws_what_an_uninterrupted_one_drew():
    data = TensorDataset(torch.arange(64.0))

    def loader():  # shuffled by torch's RNG, as a DataLoader without a sampler is
        return DataLoader(data, batch_size=8, shuffle=True)

    torch.manual_seed(0)
    whole = Walk(8)
    next(whole.epochs(1))
    uninterrupted = _epoch(whole, loader())
    after_all = torch.rand(3)

    torch.manual_seed(0)
    first = Walk(8)
    next(first.epochs(1))
    _epoch(first, loader(), stop_after=3)
    saved = first.state_dict(), first.epoch_rng, checkpoint.rng_state()

    torch.manual_seed(123)  # the resumed process starts elsewhere
    resumed = Walk(8)
    resumed.load_state_dict(saved[0], saved[1], saved[2], world_ratio=1.0)
    assert resumed.batches_done == 3
    next(resumed.epochs(1))
    rest = _epoch(resumed, loader())
    assert len(rest) == 5 and all(torch.equal(a, b) for a, b in zip(rest, uninterrupted[3:]))
    assert torch.equal(torch.rand(3), after_all)  # and the RNG stands where it would have


def test_a_checkpoint_of_a_larger_batch_skips_as_many_samples():
    walk = Walk(8)
    state = {"epoch": 1, "batches_done": 3, "steps_done": 9, "in_epoch": True, "local_batch": 16}
    walk.load_state_dict(state, None, None, world_ratio=2.0)  # written at twice this B
    assert walk.resume_at == (1, 6) and walk.epoch == 1 and walk.steps_done == 9


def test_the_run_tula_asks_round_trips_through_the_environment():
    spec = ScriptRun(
        "production",
        2,
        256,
        lr=0.1,
        epochs=3,
        train=TrainAsk("out", "out/ck", "abc", 5, 1, 2, 1, "submitit", "accuracy", "max"),
    )
    assert ScriptRun.from_env(spec.to_env()) == spec and spec.local_batch == 128
    probe = ScriptRun("probe", 1, 64, probe=ProbeAsk("N1_B64", "w", 3, 0.1, 10, 4.0, None))
    assert ScriptRun.from_env(probe.to_env()) == probe
    assert ScriptRun.from_env({}) is None
    with pytest.raises(ValueError, match="role 'train' is not one of"):
        ScriptRun.from_env({ENV: '{"role": "train", "workers": 1, "global_batch": 8}'})


def test_the_scripts_arguments_get_the_point_put_in(tmp_path):
    script = tmp_path / "train.py"
    args = ["--bs", "{local_batch}", "--B={global_batch}", "--lr", "{lr}", "--epochs={epochs}"]
    assert script_argv(str(script), args, 32, 64, 0.05, 3) == [
        str(script.resolve()),
        "--bs",
        "32",
        "--B=64",
        "--lr",
        "0.05",
        "--epochs=3",
    ]


def test_once_the_script_returns_nothing_of_tulas_holds_its_parts(no_tula, tmp_path, monkeypatch):
    """What the run keeps (a DDP model holds the process group) is collectable at the exit,
    while the interpreter still runs: left to its finalization, a gloo thread dropping its
    last work aborted a rank that had trained to the end (the job FAILED in sacct)."""
    script = tmp_path / "train.py"
    script.write_text(
        "import sys, types, weakref, torch, tula.script\n"
        "run = tula.script.attach(local_batch=4, epochs=1)\n"
        "model = torch.nn.Linear(2, 2)\n"
        "run.keep(model=model)\n"
        "sys.modules['tula_test_box'] = types.SimpleNamespace(model=weakref.ref(model))\n"
        "for _ in run.epochs():\n"
        "    run.epoch_end(loss=1.0, metric=0.5)\n"
    )
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "tula_test_box", raising=False)
    run_script([str(script)])
    tula.script.run._CURRENT.clear()  # what the exit does first (Run.__init__)
    gc.collect()
    assert sys.modules["tula_test_box"].model() is None
