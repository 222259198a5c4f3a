"""The predict stage (tula.stages.predict): where the training set's size D comes from. The
predictions themselves are tula.model.predictions' (tests/model/test_predictions.py)."""

import json

import pandas as pd
import pytest

from tula.stages import predict as predict_mod


def test_the_training_set_size_comes_from_the_probes_else_from_tula_checks_workload_json(tmp_path):
    """D without loading the dataset: --train-samples, else the probes' record, else
    results/workload.json; neither is an error that says what to pass."""

    probes = pd.DataFrame({"workers": [1], "train_samples": [1437]})
    bare = pd.DataFrame({"workers": [1]})
    workload = tmp_path / "workload.json"
    workload.write_text(json.dumps({"train_samples": 300}))
    assert predict_mod.train_samples_of(probes, 50, workload) == 50
    assert predict_mod.train_samples_of(probes, None, workload) == 1437
    assert predict_mod.train_samples_of(bare, None, workload) == 300
    with pytest.raises(ValueError, match="--train-samples or --workload results/workload.json"):
        predict_mod.train_samples_of(bare, None, tmp_path / "missing.json")
