import pandas as pd

from tula.report import _cell, _table


def test_cells_are_readable():
    assert _cell("error", float("nan")) == ""
    assert _cell("peak_mem_bytes", 3 * 2**20) == "3.00"
    assert _cell("step_time_s", 0.0123456) == "0.01235"


def test_table_marks_selection_and_converts_headers():
    df = pd.DataFrame({"nodes": [1, 2], "global_batch": [64, 64], "mem_bytes": [2**20, 2**21]})
    html = _table(df, highlight=(2, 64))
    assert "<th>mem (MiB)</th>" in html and html.count("class=sel") == 1 and "nan" not in html
