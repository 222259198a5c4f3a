"""The model layer's records are values: every dataclass of tula.model that says it is frozen
is, so a record shared between stages (a fit, a plan, a probe's measurement) cannot be changed
in place by one of them. The three that are not frozen are named here: a drift detector keeps
its window as it is fed; a choice and a drift decision are the choice's and the detector's
own working records."""

import dataclasses
import importlib
import pkgutil

import pytest

import tula.model

BUILT_UP = {"Choice", "Drift", "Detector"}  # not frozen, by design


def _records():
    for info in pkgutil.iter_modules(tula.model.__path__):
        module = importlib.import_module(f"tula.model.{info.name}")
        for name, obj in vars(module).items():
            if dataclasses.is_dataclass(obj) and obj.__module__ == module.__name__:
                yield f"{info.name}.{name}", obj


RECORDS = dict(_records())


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_each_record_is_frozen_unless_built_up(name):
    frozen = RECORDS[name].__dataclass_params__.frozen
    assert frozen is (name.split(".")[1] not in BUILT_UP), name


def test_the_records_are_all_found():
    assert len(RECORDS) >= 31 and {"noise.NoiseScale", "linfit.LinearFit"} <= set(RECORDS)


def test_a_probes_steps_by_default_are_the_configs_defaults():
    """ProbeSteps() (what a test or a bench builds without a config) probes as an empty
    config does: the same warm-up, timed steps, limit and precision."""
    from tula import config, model_inputs
    from tula.model.inputs import ProbeSteps

    made, default = ProbeSteps(), model_inputs.probe_steps(config.from_dict({}))
    assert (made.warmup_steps, made.timed_steps, made.timeout_s, made.precision) == (
        default.warmup_steps,
        default.timed_steps,
        default.timeout_s,
        default.precision,
    )
