"""The demo's plot (recipe/darl/plot.py): verl's jsonl log in, one PNG out, every panel's metric drawn."""

import gzip
import json

from recipe.darl.plot import PANELS, plot, read_log

VAL = "val-core/darl/arithmetic/acc/mean@1"


def _log(path, steps: int = 3) -> None:
    keys = [k for _, ks in PANELS if not isinstance(ks, str) for k in ks]
    lines = []
    for step in range(1, steps + 1):
        data = {key: 0.1 * step for key in keys}
        data.update({VAL: 0.2, "replay/warmup": True, "note": "text"})  # a bool and a string are left out
        lines.append(json.dumps({"step": step, "data": data}))
    path.write_bytes(gzip.compress("\n".join(lines).encode()) if path.suffix == ".gz" else "\n".join(lines).encode())


def test_read_log_keeps_numbers_per_step(tmp_path):
    for name in ("run.jsonl", "run.jsonl.gz"):
        _log(tmp_path / name)
        series = read_log(tmp_path / name)
        assert series["replay/replayed_trained"] == [(1, 0.1), (2, 0.2), (3, 0.1 * 3)]
        assert series[VAL] == [(1, 0.2), (2, 0.2), (3, 0.2)]
        assert "replay/warmup" not in series and "note" not in series


def test_plot_writes_a_png_and_draws_every_panel(tmp_path, monkeypatch):
    import matplotlib.axes

    _log(tmp_path / "run.jsonl")
    drawn = []
    original = matplotlib.axes.Axes.plot
    monkeypatch.setattr(matplotlib.axes.Axes, "plot",
                        lambda self, *a, **k: (drawn.append(k["label"]), original(self, *a, **k))[1])
    out = plot(read_log(tmp_path / "run.jsonl"), tmp_path / "png" / "run.png", title="t")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    wanted = [k.split("/", 1)[-1] for _, ks in PANELS if not isinstance(ks, str) for k in ks] + [VAL.split("/", 1)[-1]]
    assert sorted(drawn) == sorted(wanted)
