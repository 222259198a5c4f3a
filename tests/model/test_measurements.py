"""The measurements table (tula.model.measurements), the public contract of tula fit and tula
predict: a table written elsewhere loads, and a bad one names its file, row and column."""

import pandas as pd
import pytest

from tula.model import measurements


def test_external_measurements_contract(tmp_path):
    p = tmp_path / "ext.csv"
    pd.DataFrame(
        [
            dict(
                workers=4,
                global_batch=256,
                local_batch=64,
                step_time_s=0.3,
                compute_time_s=0.2,
                sync_time_s=0.1,
                peak_mem_bytes=5e9,
                status="ok",
            )
        ]
    ).to_csv(p, index=False)
    assert len(measurements.load(p)) == 1


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d.drop(columns=["sync_time_s"]), "missing column.*sync_time_s"),
        (lambda d: d.assign(step_time_s=["fast"]), "column step_time_s"),
        (lambda d: d.assign(local_batch=[32]), "local_batch x workers"),
    ],
)
def test_bad_measurements_name_file_and_column(tmp_path, change, message):
    p = tmp_path / "bad.csv"
    base = pd.DataFrame(
        [
            dict(
                workers=4,
                global_batch=256,
                local_batch=64,
                step_time_s=0.3,
                compute_time_s=0.2,
                sync_time_s=0.1,
                peak_mem_bytes=5e9,
                status="ok",
            )
        ]
    )
    change(base).to_csv(p, index=False)
    with pytest.raises(ValueError, match=message):
        measurements.load(p)


def test_source_rows_are_checked_for_what_they_must_carry(tmp_path):
    row = dict(
        workers=2,
        global_batch=64,
        local_batch=16,
        step_time_s=None,
        compute_time_s=None,
        sync_time_s=None,
        peak_mem_bytes=600,
        status="ok",
        source="sweep",
    )
    p = tmp_path / "m.csv"
    pd.DataFrame([row]).to_csv(p, index=False)
    # a sweep row is a compute time
    with pytest.raises(ValueError, match="row 2, column compute_time_s"):
        measurements.load(p)
    pd.DataFrame([row | {"source": "memory"}]).to_csv(p, index=False)
    assert measurements.load(p).loc[0, "peak_mem_bytes"] == 600  # a memory row needs no time
    pd.DataFrame([row | {"source": "guess"}]).to_csv(p, index=False)
    with pytest.raises(
        ValueError, match="column source: 'guess' is not one of probe, sweep, memory"
    ):
        measurements.load(p)
