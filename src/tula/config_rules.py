"""What a config must say that its JSON schema cannot: keys renamed in an older config, the
rules between keys (B divisible by N, whole nodes, B by doublings, ...), and the defaults that
depend on another key (the device memory on hardware.gpu, the LR and weight decay on the
model's family). Each problem is a sentence naming its config key;
:func:`tula.config.validate` raises them together."""

from __future__ import annotations

import copy
import string
from pathlib import Path
from typing import Any

import jsonschema

from tula import gpus

# Keys renamed when N became "workers": an old key is refused with its replacement,
# never read under its old meaning.
RENAMED = {
    ("grid", "nodes"): "grid.workers (N counts workers: GPUs, or CPU processes)",
    ("grid", "workers_per_node"): "cluster.workers_per_node",
    ("constraints", "min_nodes"): "constraints.min_workers",
    ("constraints", "max_nodes"): "constraints.max_workers",
    ("compare", "nodes"): "compare.workers",
}


def auto_method(optimizer: str) -> tuple[str, str]:
    """``train.method: auto`` for ``train.optimizer``: (the method, why, in a sentence)."""
    if optimizer.lower() == "sgd":
        return "ags", (
            "train.method auto: AGS with SGD, the paper's setting, where it closes the "
            "large-batch generalization gap"
        )
    return "lbt", (
        f"train.method auto: plain large batch with {optimizer}, not SGD: with an adaptive "
        "optimizer plain large batch left AGS no gap to close on Tula's generalization suite "
        "(AdamW, cosine: AGS within the seeds' spread of it, or below it); name ags to use it "
        "anyway"
    )


def renamed_keys(raw: dict[str, Any]) -> list[str]:
    """Keys of an older config that are refused, each with what replaced it."""
    problems = [
        f"config key '{sec}.{key}' was renamed: use {new}"
        for (sec, key), new in RENAMED.items()
        if isinstance(raw.get(sec), dict) and key in raw[sec]
    ]
    pr = raw.get("pricing") if isinstance(raw.get("pricing"), dict) else {}
    if pr.get("model") == "node":
        problems.append(
            "config key 'pricing.model': `node` (it charged per worker) was renamed: use "
            "`worker_hour` with pricing.per_worker_hour, or `node_hour` with pricing.per_node_hour "
            "if whole nodes are billed"
        )
    elif pr.get("per_node_hour") is not None and pr.get("model") != "node_hour":
        problems.append(
            "config key 'pricing.per_node_hour': a whole node's price is used only by "
            "`pricing.model: node_hour`; set that, or give the price of one worker as "
            "pricing.per_worker_hour (per_node_hour meant per worker before)"
        )
    return problems


def _doublings(lo: int, hi: int) -> bool:
    """Whether ``hi`` is ``lo`` doubled a whole number of times (0 included)."""
    while lo < hi:
        lo *= 2
    return lo == hi


def problems(d: dict[str, Any]) -> list[str]:
    """What the schema cannot express, in the validated config ``d``; each names its key."""
    return (
        _grid_problems(d)
        + _other_problems(d)
        + _train_problems(d["train"])
        + _script_problems(d["workload"], d["objective"], d["train"]["accumulate"])
    )


# what workload.args may name, each put in at a point (tula.workers.script_run.script_argv)
PLACEHOLDERS = ("local_batch", "global_batch", "lr", "epochs")


def bad_placeholders(args: list[str]) -> list[str]:
    """What is wrong with the placeholders of ``workload.args``, each naming the argument."""
    problems = []
    for i, arg in enumerate(args):
        try:
            names = [n for _, n, _, _ in string.Formatter().parse(arg) if n is not None]
        except ValueError as exc:
            problems.append(
                f"config key 'workload.args[{i}]': {arg!r}: {exc} (a literal brace is doubled)"
            )
            continue
        for name in names:
            if name not in PLACEHOLDERS:
                problems.append(
                    f"config key 'workload.args[{i}]': {{{name}}} is not one of "
                    + ", ".join("{" + p + "}" for p in PLACEHOLDERS)
                )
    return problems


# what a user's script is not measured for: the gradient noise scale (Tula's own probes only)
SCRIPT_OBJECTIVES_OUT = ("time_to_accuracy", "cost_to_accuracy")


def _script_problems(w: dict[str, Any], objective: str, accumulate: Any) -> list[str]:
    """workload.script: a file that is there, arguments whose placeholders Tula fills, an
    objective its probes measure what for, and no micro-batches Tula cannot make."""
    if w["script"] is None:
        said = (
            "config key 'workload.args': arguments without workload.script, the script they are for"
        )
        return [said] if w["args"] else []
    problems = bad_placeholders(w["args"])
    if not Path(w["script"]).is_file():
        problems.append(
            f"config key 'workload.script': {w['script']} is not a file (from {Path.cwd()})"
        )
    if objective in SCRIPT_OBJECTIVES_OUT:
        problems.append(
            f"config key 'objective': {objective} needs the gradient noise scale, which Tula's "
            "own loop measures and a workload.script's probes do not; choose time, cost or knee"
        )
    if accumulate not in ("auto", 1):
        problems.append(
            f"config key 'train.accumulate': {accumulate} micro-batches are your script's to "
            "make (Tula runs it at the batch it gives it); leave it auto: a script's grid has "
            "no point past b_max"
        )
    return problems


SCHEDULES = ("step", "cosine", "onecycle", "constant")
# train's own keys, which optimizer_args must not set a second time
_OWN_ARGS = {"lr": "train.lr", "weight_decay": "train.weight_decay", "momentum": "train.momentum"}


def _train_problems(t: dict[str, Any]) -> list[str]:
    """The way of training: names that are neither built in nor an import path, arguments given
    twice, and pairs that cannot go together. Whether torch's class takes an argument is the
    workload check's (``tula check``: it builds the optimizer, before any job)."""
    problems = [
        f"config key 'train.{key}': {t[key]!r} is neither {' nor '.join(map(repr, names))} nor "
        "an import path `package.module:callable`"
        for key, names in (
            ("schedule", SCHEDULES),
            ("loss", ("cross_entropy",)),
            ("metric", ("accuracy",)),
        )
        if t[key] not in names and ":" not in t[key]
    ]
    problems += [
        f"config key 'train.optimizer_args.{k}': set {own} instead (it is train's own key)"
        for k, own in _OWN_ARGS.items()
        if k in t["optimizer_args"]
    ]
    if t["lr_decay_epochs"] and t["schedule"] != "step":
        problems.append(
            f"config key 'train.lr_decay_epochs': the decay epochs are the `step` schedule's, "
            f"and train.schedule is {t['schedule']!r}; remove them (lr_decay_epochs: [])"
        )
    if t["method"] == "lars" and t["optimizer"].lower() != "sgd":
        problems.append(
            f"config key 'train.method': lars is the layer-wise trust ratio around momentum SGD; "
            f"train.optimizer is {t['optimizer']!r} (use optimizer: sgd, or another method)"
        )
    if t["method"] == "lars" and t["no_weight_decay"]:
        problems.append(
            "config key 'train.no_weight_decay': lars applies the weight decay itself and "
            "exempts 1-D parameters (biases, norms) with train.lars_exclude_1d; leave it empty"
        )
    if t["method"] == "polo" and t["ema_decay"] is not None:
        problems.append(
            "config key 'train.ema_decay': post-local SGD's workers hold different weights "
            "between averages, so there is no one average to keep; unset it, or another method"
        )
    if t["metric"] == "accuracy" and t["metric_goal"] != "max":
        problems.append("config key 'train.metric_goal': accuracy's goal is max")
    if t["loss"] != "cross_entropy" and t["label_smoothing"]:
        problems.append(
            "config key 'train.label_smoothing': it is cross-entropy's; train.loss is "
            f"{t['loss']!r} (smooth the labels in your loss, or set label_smoothing: 0)"
        )
    return problems


def _grid_problems(d: dict[str, Any]) -> list[str]:
    """The grid: batch_max is batch_min doubled, B divisible by N, whole nodes."""
    g = d["grid"]
    problems: list[str] = []
    if g["batch_min"] > g["batch_max"]:
        problems.append(
            f"config key 'grid.batch_min': {g['batch_min']} is larger than "
            f"grid.batch_max={g['batch_max']}"
        )
    elif not _doublings(g["batch_min"], g["batch_max"]):
        lo = g["batch_min"]
        above = next(lo << k for k in range(64) if lo << k > g["batch_max"])
        near = (above // 2, above)
        problems.append(
            f"config key 'grid.batch_max': {g['batch_max']} is not grid.batch_min={lo} doubled "
            f"(the grid's B are batch_min, 2*batch_min, 4*batch_min, ...); use "
            f"{' or '.join(map(str, near))}"
        )
    wpn = d["cluster"]["workers_per_node"]
    for n in g["workers"]:
        if g["batch_min"] % n:
            problems.append(
                f"config key 'grid.workers': N={n} does not divide the global batch "
                f"B={g['batch_min']} (grid.batch_min); every B must split evenly over N workers"
            )
        if n > wpn and n % wpn:
            problems.append(
                f"config key 'grid.workers': N={n} does not fill whole nodes of "
                f"cluster.workers_per_node={wpn}: a job of more workers than one node holds takes "
                f"whole nodes, alike for probe and production; use a multiple of {wpn} (or fewer "
                f"than {wpn + 1})"
            )
    return problems


def _other_problems(d: dict[str, Any]) -> list[str]:
    """Pricing, constraints, the suite, the input pipeline, the backend and checkpoints."""
    problems: list[str] = []
    wpn = d["cluster"]["workers_per_node"]
    if d["pricing"]["model"] == "node_hour" and d["pricing"]["per_node_hour"] is None:
        problems.append(
            "config key 'pricing.per_node_hour': `pricing.model: node_hour` needs the price of one "
            "node-hour"
        )
    c = d["constraints"]
    for lo, hi in (("min_workers", "max_workers"), ("min_batch", "max_batch")):
        if c[lo] is not None and c[hi] is not None and c[lo] > c[hi]:
            problems.append(
                f"config key 'constraints.{lo}': {c[lo]} is larger than constraints.{hi}={c[hi]}"
            )
    cmp = d["compare"]
    if cmp["workers"] > wpn and cmp["workers"] % wpn:
        problems.append(
            f"config key 'compare.workers': {cmp['workers']} does not fill whole nodes of "
            f"cluster.workers_per_node={wpn}"
        )
    for b in cmp["batches"]:
        if b % cmp["workers"]:
            problems.append(
                f"config key 'compare.batches': B={b} is not divisible by "
                f"compare.workers={cmp['workers']}"
            )
    hw = d["hardware"]
    dt = d["data"]
    if dt["resize"] is not None and dt["resize"] < dt["image_size"]:
        problems.append(
            f"config key 'data.resize': {dt['resize']} is smaller than "
            f"data.image_size={dt['image_size']}; the test transform resizes, then center-crops "
            "image_size"
        )
    if hw["backend"] == "nccl" and hw["device"] == "cpu":
        problems.append(
            "config key 'hardware.backend': nccl needs CUDA devices but hardware.device is cpu"
        )
    ln = d["launch"]
    if ln["checkpoint_every_steps"] is None and ln["checkpoint_every_epochs"] is None:
        problems.append(
            "config key 'launch.checkpoint_every_epochs': null together with "
            "launch.checkpoint_every_steps null means no checkpoint at all, and a preempted or OOM "
            "job would start over; set one"
        )
    return problems


DEFAULT_DEVICE_MEMORY_GB = 16.0  # the budget per worker where neither the GPU nor a figure is given


def device_memory(raw: dict[str, Any]) -> str:
    """Before the schema fills defaults: ``hardware.device_memory_gb`` and where it came from
    (``hardware.device_memory_why``), decided once here for every reader (``tula check``,
    the Snakefile, the snapshot the jobs read): the config's own figure where it sets one,
    else the memory of the GPU ``hardware.gpu`` names, else DEFAULT_DEVICE_MEMORY_GB. The
    schema gives the key no default, so a validator that fills defaults first (Snakemake's
    ``validate``) cannot put 16 GB in front of the named GPU. A ``hardware.gpu`` name Tula
    does not know is an error naming the key and the names it knows."""
    hw = raw.setdefault("hardware", {})
    if not isinstance(hw, dict):
        return ""  # the schema says what is wrong with it
    gpu = hw.get("gpu")
    memory, named = None, None
    if isinstance(gpu, str):
        known = gpus.lookup(gpu)
        if known is None:
            return (
                f"config key 'hardware.gpu': unknown GPU {gpu!r}; Tula knows "
                f"{', '.join(gpus.names())}; for another, give its figures (memory_gb, "
                "bandwidth_gbs, fp32_tflops, and bf16_tflops where it has them)"
            )
        memory, named = known.memory_gb, known.name
    elif isinstance(gpu, dict):
        memory, named = gpu.get("memory_gb"), gpu.get("name") or "the GPU given"
    if hw.get("device_memory_why") and "device_memory_gb" in hw:
        return ""  # already decided (the snapshot of a resolved config)
    if "device_memory_gb" in hw:
        hw["device_memory_why"] = (
            "hardware.device_memory_gb: null in the config, no bound"
            if hw["device_memory_gb"] is None
            else "hardware.device_memory_gb in the config"
        )
    elif isinstance(memory, (int, float)):
        hw["device_memory_gb"] = memory
        hw["device_memory_why"] = f"hardware.gpu: {named}, {memory:g} GB"
    else:
        hw["device_memory_gb"] = DEFAULT_DEVICE_MEMORY_GB
        hw["device_memory_why"] = (
            f"the default {DEFAULT_DEVICE_MEMORY_GB:g} GB, no hardware.gpu named"
        )
    return ""


# Paper §IV-B: SGD, momentum 0.9; LR 0.05 for ResNet50, 0.01 for the others; weight decay
# 1e-4 for MobileNetV3, 5e-4 for the others. small_cnn is not a paper model: 0.05 / 5e-4.
def family_defaults(model: str) -> tuple[float, float]:
    """(lr, weight_decay) of the paper's setup for the model's family: train.lr and
    train.weight_decay where the config leaves them null."""
    if "resnet" in model or model == "small_cnn":
        return 0.05, 5e-4
    if "mobilenet" in model:
        return 0.01, 1e-4
    return 0.01, 5e-4


def defaults_validator():
    """Draft 2020-12 validator that fills ``default`` values while validating."""
    base = jsonschema.Draft202012Validator
    validate_properties = base.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, sub_schema):
        if isinstance(instance, dict):
            for name, prop in properties.items():
                if "default" in prop:
                    instance.setdefault(name, copy.deepcopy(prop["default"]))
        yield from validate_properties(validator, properties, instance, sub_schema)

    return jsonschema.validators.extend(base, {"properties": set_defaults})


def schema_problem(error: jsonschema.ValidationError) -> str:
    """The schema's error as a sentence naming its config key: the validator's message, or for
    a value that fails a pattern (or every one of its forms), what the value must be in words
    (the schema's ``x-pattern-says``) in place of the regular expression."""
    key = ".".join(str(p) for p in error.absolute_path) or "<top level>"
    says = error.schema.get("x-pattern-says") if isinstance(error.schema, dict) else None
    if error.validator in ("pattern", "oneOf") and says:
        return f"config key '{key}': {error.instance!r} is not {says}"
    return f"config key '{key}': {error.message}"
