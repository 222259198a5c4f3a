"""The memory probe (tula.stages.memprobe, tula.runtime.memprobe_worker): measured peaks, b_max, and the measurement at it."""

import pytest
import torch

from tula.runtime.measure import cpu_step_peak_bytes, measure_step
from tula.runtime.nets import build_model


def peaks(batches):
    torch.manual_seed(0)
    model = build_model("small_cnn", (1, 8, 8), 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    def forward_loss(x, y):
        logits = model(x)
        return logits, loss_fn(logits, y)

    def step(b):
        x, y = torch.randn(b, 1, 8, 8), torch.randint(0, 10, (b,))
        opt.zero_grad(set_to_none=True)
        forward_loss(x, y)[1].backward()
        opt.step()

    out = {}
    for b in batches:
        x, y = torch.randn(b, 1, 8, 8), torch.randint(0, 10, (b,))
        eq3 = measure_step(model, opt, forward_loss, x, y).total_bytes  # also creates the momentum buffers
        out[b] = (cpu_step_peak_bytes(model, opt, lambda: step(b)), eq3)
    return out


def test_measured_cpu_peak_covers_eq3_and_is_linear_in_batch():
    p = peaks([32, 64, 128])
    for measured, eq3 in p.values():
        assert eq3 <= measured <= 1.3 * eq3  # Eq. 3 terms plus backward's transient buffers
    # linear in b: equal steps in b give equal steps in bytes (to allocator granularity, ~512 B)
    assert p[128][0] - p[64][0] == pytest.approx(2 * (p[64][0] - p[32][0]), rel=1e-3)


def test_memory_probe_gives_b_max_and_the_search_set_stays_below_it(tiny_raw, tmp_path, venv_path):
    """One real worker at a few local batches; with an 8 MB device (7.2 MB after the 10 % margin)
    small_cnn fits b=64 (6.9 MiB measured) but not b=128 (12 MiB): partial search then probes
    N=1 at B=64 instead of B=128."""
    import json

    import yaml

    from tula import config
    from tula.stages import memprobe
    from tula.model.grid import Point, search_set
    from tula.model.memory import MemoryModel, max_local_batch

    tiny_raw["hardware"] = {"device_memory_gb": 0.008}
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(yaml.safe_dump(tiny_raw))
    out = tmp_path / "memory_probe.json"
    rec = memprobe.run(cfg_file, out)
    assert json.loads(out.read_text())["max_local_batch"] == rec["max_local_batch"] == max_local_batch(out)
    pts = rec["points"]
    assert [p["local_batch"] for p in pts] == [16, 64, 128] and all(p["status"] == "ok" for p in pts)
    assert all(p["peak_mem_bytes"] == max(p["plain_peak_bytes"], p["refresh_peak_bytes"]) for p in pts)
    model = MemoryModel.from_dict(rec["memory_model"])
    bmax = rec["max_local_batch"]
    assert 64 <= bmax < 128
    assert model.predict_bytes(bmax) <= 0.008e9 * 0.9 < model.predict_bytes(bmax + 1)
    cfg = config.load(cfg_file)
    assert search_set(cfg, bmax) == [Point(1, 32), Point(1, 64), Point(2, 32), Point(2, 128)]
    assert not list(tmp_path.glob(".*ranks"))


def test_the_memory_probe_measures_at_the_b_max_it_predicts():
    from tula import config
    from tula.model.memory import next_probe_batch as next_batch
    from tula.model.memory import probe_batches as default_batches

    cfg = config.from_dict({"grid": {"nodes": [1, 2], "batch_min": 32, "batch_max": 1024},
                            "hardware": {"device_memory_gb": (1000 + 100 * 700) / 0.9 / 1e9}})  # fmt: skip
    first = default_batches(cfg)
    assert first == [16, 64, 256]
    pts = [{"local_batch": b, "status": "ok", "peak_mem_bytes": 1000 + 100 * b} for b in first]
    assert next_batch(cfg, pts) == 512  # the largest grid local batch under the predicted b_max = 700
    oom = pts + [{"local_batch": 512, "status": "oom"}]
    assert next_batch(cfg, oom) is None  # below the OOM, 256 is the largest and was measured
    ran = pts + [{"local_batch": 512, "status": "ok", "peak_mem_bytes": 1000 + 100 * 512}]
    assert next_batch(cfg, ran) is None
