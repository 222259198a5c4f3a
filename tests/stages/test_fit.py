"""The fit stage and the stages after it run without torch."""


def test_fit_predict_select_and_report_import_no_torch():
    """The model stages run on a login node without torch being loaded (3.5 s import, GPU libs)."""
    import subprocess
    import sys

    code = ("import sys, tula.stages.fit, tula.stages.predict, tula.stages.select, tula.stages.report, tula.model.memory, tula.model.perf, tula.stages.plot; "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")  # fmt: skip
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]"
