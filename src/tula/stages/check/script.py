"""``tula check`` of a user's own script (``workload.script``): the script is run here, on
this machine (the login node), as one worker at the grid's smallest batch per worker, for a
few steps (:class:`tula.script.roles.Check`), before any job is queued. It is refused, naming
``workload.script`` and the script's own error line, when it fails before or in its first
steps, never calls the step marker, never attaches, or loads batches of another size than Tula
asked; where it cannot run here because this machine has no GPU, that is said instead and the
memory probe, on the cluster, is its first run. Returns what results/workload.json says of
it."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from tula import config as config_mod
from tula import model_inputs
from tula.io import read_json
from tula.model.memory import probe_batches
from tula.workers import script_launch
from tula.workers.processes import result_path
from tula.workers.script_run import ScriptRun

KEY = "config key 'workload.script'"
# a failure that says the device is missing, not that the script is wrong
NO_GPU = re.compile(r"CUDA|cuda|NCCL|nccl|no NVIDIA driver|nvidia", re.IGNORECASE)


def own_line(text: str, script: str) -> str:
    """The script's own line in a traceback (its last frame in the script, with the code),
    and the error: ``ValueError: ... (train.py, line 42: loss = f(x))``."""
    # torch.distributed prefixes what each rank prints with "[rank0]:"
    lines = [re.sub(r"^\[rank\d+\]:", "", ln) for ln in text.strip().splitlines()]
    lines = [ln for ln in lines if ln.strip()]
    error = lines[-1].strip() if lines else "no output"
    name = Path(script).name
    frame = None
    for i, ln in enumerate(lines):
        m = re.match(r'\s*File "([^"]+)", line (\d+)', ln)
        if (
            m
            and Path(m.group(1)).name == name
            and Path(m.group(1)).resolve() == Path(script).resolve()
        ):
            code = lines[i + 1].strip() if i + 1 < len(lines) else ""
            frame = f"{name}, line {m.group(2)}" + (f": {code}" if code else "")
    return f"{error} ({frame})" if frame else error


def no_gpu_here() -> bool:
    return not Path("/dev/nvidia0").exists() and shutil.which("nvidia-smi") is None


def run(cfg: config_mod.Config, timeout_s: float | None = None) -> dict[str, Any]:
    """Run the script for ``check_steps`` steps here and judge what it did (module docstring)."""
    script = cfg.workload.script
    assert script is not None
    b = probe_batches(model_inputs.grid_spec(cfg), model_inputs.probe_steps(cfg).memory_batches)[0]
    work = Path(tempfile.mkdtemp(prefix="tula-check-"))
    spec = ScriptRun(
        "check",
        workers=1,
        global_batch=b,
        lr=model_inputs.lr_at(cfg, b),
        epochs=cfg.workload.epochs,
        result_dir=str(work),
    )
    timeout = timeout_s or cfg.probe.timeout_s
    print(f"workload.script: running {script} here for {spec.check_steps} steps at b={b} ...")
    try:
        done = script_launch.run_captured(cfg, spec, timeout)
        rec = read_json(result_path(work, 0)) if result_path(work, 0).exists() else None
    except subprocess.TimeoutExpired:
        raise config_mod.ConfigError(
            f"{KEY}: {script} did not reach {spec.check_steps} steps in {timeout:g} s "
            "(probe.timeout_s) on this machine"
        ) from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return judge(cfg, spec, done, rec)


def judge(
    cfg: config_mod.Config,
    spec: ScriptRun,
    done: subprocess.CompletedProcess,
    rec: dict[str, Any] | None,
) -> dict[str, Any]:
    """What the check's run says: the record for workload.json, or the refusal."""
    script = str(cfg.workload.script)
    in_step = rec is not None and rec.get("status") == "error"
    if done.returncode != 0 or in_step:
        return failed(script, done, rec, in_step)
    if rec is None:
        raise config_mod.ConfigError(
            f"{KEY}: {script} ran to its end without calling tula.script.attach(): Tula cannot "
            "hand it its batch nor time it (README, 'Your own training script')"
        )
    if rec["steps"] == 0:
        raise config_mod.ConfigError(
            f"{KEY}: {script} attached but never called the step marker (run.step): Tula "
            "cannot time a step it is not shown; wrap the step function with run.step(...)"
        )
    problems = []
    seen = [n for n in rec["batch_lengths"] if n != spec.local_batch]
    if seen:
        problems.append(
            f"its batches hold {seen[0]} samples but Tula asked for {spec.local_batch}: build "
            "its DataLoader with run.local_batch (or pass {local_batch} in workload.args)"
        )
    if not rec["batches_used"] or rec["train_samples"] is None:
        problems.append(
            "it does not iterate its loader through run.batches(loader): Tula needs the training "
            "set's size (len(loader.dataset)) to predict an epoch, and its epochs' starts"
        )
    if problems:
        raise config_mod.ConfigError(f"{KEY}: {script}: " + "; ".join(problems))
    warnings = []
    if not rec["parts"]:
        warnings.append(
            f"warning: {script} hands Tula no parts to checkpoint (run.keep(...)): a requeue, "
            "a relaunch after an out-of-memory error or a lost node starts it over"
        )
    if not rec["ddp"]:
        warnings.append(
            f"warning: {script} keeps no DDP-wrapped model: a probe of N > 1 times the "
            "compute-only step under DDP's no_sync() and will stop there"
        )
    return {**rec, "warnings": warnings}


def failed(
    script: str, done: subprocess.CompletedProcess, rec: dict[str, Any] | None, in_step: bool
) -> dict[str, Any]:
    """The script failed (``in_step``: inside a marked step, ``rec`` saying which): refused
    with its own line, or said, where this machine has no GPU and the error is about one."""
    text = ((rec or {}).get("error") if in_step else None) or done.stderr or done.stdout or ""
    steps = (rec or {}).get("steps", 0)
    if in_step:
        where = "in its first step" if steps == 0 else f"in step {steps + 1}"
    else:
        where = f"after {steps} step(s)" if steps else "before its first step"
    line = own_line(text, script)
    if NO_GPU.search(text) and no_gpu_here():
        print(
            f"workload.script: {script} cannot run on this machine, which has no GPU "
            f"({line}); its first run will be the memory probe's, on the cluster"
        )
        return {"status": "not run here", "error": line, "warnings": [line]}
    raise config_mod.ConfigError(f"{KEY}: {script} failed {where}: {line}")


def describe(rec: dict[str, Any], script: str) -> str:
    """The check's run, in one line."""
    if rec.get("status") != "ok":
        return f"workload.script: {script} not run here"
    steps = ", ".join(f"{1e3 * s:.1f} ms" for s in rec["step_s"])
    parts = ", ".join(f"{k} ({v})" for k, v in rec["parts"].items()) or "none"
    return (
        f"workload.script: {script} ran {rec['steps']} steps at b={rec['local_batch']} on "
        f"{rec['device']} ({steps}); {rec['train_samples']} training samples; parts kept: {parts}"
    )
