import json

import pandas as pd
import yaml

from tula import config
from tula.compare import run_suite, runs, table_markdown


def test_runs_enumerate_the_suite():
    cfg = config.from_dict({"compare": {"batches": [64, 128], "methods": ["lbt", "ags"], "seeds": 3}})
    rs = runs(cfg)
    assert len(rs) == 2 * 2 * 2 * 3  # 2 default workloads x 2 batches x 2 methods x 3 seeds
    assert len({r.id for r in rs}) == len(rs)


def test_table_marks_best_and_summarises_ags_against_lbt():
    rows = []
    for b, accs in ((256, {"lbt": (0.80, 0.82), "lrs": (0.90, 0.92), "ags": (0.905, 0.905)}),
                    (1024, {"lbt": (0.60, 0.62), "lrs": (0.70, 0.70), "ags": (0.75, 0.77)})):  # fmt: skip
        for m, (a0, a1) in accs.items():
            for seed, acc in enumerate((a0, a1)):
                rows.append(dict(model="m", dataset="d", global_batch=b, method=m, seed=seed, status="ok", test_acc=acc))
    md = table_markdown(pd.DataFrame(rows))
    assert "| m | d | 1024 | 61.00 ± 1.41 | 70.00 ± 0.00 | **76.00 ± 1.41** |" in md
    assert "**91.00 ± 1.41**" in md  # LRS best at B=256 ...
    assert "AGS − LBT, averaged over the 2 rows: +12.25 points." in md  # ((90.5-81) + (76-61)) / 2
    assert "AGS best or within 1 point of the best in 2/2 rows." in md  # 90.5 is within 1 of 91


def test_compare_runs_real_training_and_resumes(tmp_path, venv_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"compare": {"workloads": [{"model": "small_cnn", "dataset": "digits"}],
                                               "batches": [128], "methods": ["lbt", "ags"], "seeds": 1,
                                               "epochs": 1}}))  # fmt: skip
    df = run_suite(cfg, tmp_path / "out")
    assert list(df["status"]) == ["ok", "ok"]
    # each row is its run's own final test accuracy, and one epoch of 12 steps learns well past chance:
    # 0.1 +- 0.016 (one standard deviation over the 360 test samples); measured 0.39 and 0.43
    for row in df.itertuples():
        final = json.loads(next((tmp_path / "out" / "runs").glob(f"*{row.method}*/final.json")).read_text())
        assert final["method"] == row.method and final["final_test_acc"] == row.test_acc
    assert (df["test_acc"] > 0.3).all(), df["test_acc"].tolist()
    assert (tmp_path / "out" / "heatmap.png").read_bytes()[:4] == b"\x89PNG"
    finals = sorted((tmp_path / "out" / "runs").glob("*/final.json"))
    mtimes = [f.stat().st_mtime_ns for f in finals]
    again = run_suite(cfg, tmp_path / "out")  # finished runs are reused, not retrained
    assert [f.stat().st_mtime_ns for f in finals] == mtimes and again["test_acc"].tolist() == df["test_acc"].tolist()
