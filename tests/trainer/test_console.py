"""The compact console: one line per step from the metrics verl logs, swapped into verl's own Tracking."""

from omegaconf import OmegaConf
from verl.utils.tracking import Tracking

from recipe.darl.trainers.console import CompactConsole, CompactTracking, compact_console

STEP = {"critic/score/mean": 0.53125, "replay/selected": 32, "replay/replayed_trained": 8,
        "replay/staleness_mean": 1.25, "timing_s/step": 3.0, "actor/pg_loss": 0.1, "val-core/a/acc/mean@1": 0.4,
        "val-core/b/reward/mean@1": 0.5, "val-aux/a/x": 9.0}


def test_one_line_per_step_by_hand():
    lines = []
    console = CompactConsole(lambda: 40, write=lines.append)
    console.log(STEP, 12)
    console.log({**STEP, "timing_s/step": 5.0}, 13)
    # val: the mean of the two val-core mean@ values; ETA: (40 - 13) steps x mean(3, 5) s = 108 s
    assert lines == ["[darl] step 12/40 | reward 0.531 | val 0.450 | trained 32 groups, 8 replayed | staleness 1.2 "
                     "| 3.0 s/step | ETA 0:01:24",
                     "[darl] step 13/40 | reward 0.531 | val 0.450 | trained 32 groups, 8 replayed | staleness 1.2 "
                     "| 5.0 s/step | ETA 0:01:48"]
    bare = CompactConsole(lambda: None, write=lines.append)
    bare.log({"timing_s/step": 2.0}, 1)
    assert lines[-1] == "[darl] step 1 | 2.0 s/step"  # no replay, no schedule, no validation: only what is there


def test_verl_tracking_gets_the_compact_console_unless_full(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    compact = compact_console(Tracking("p", "e", default_backend=["console"]), OmegaConf.create({}), lambda: 4)
    compact.log(STEP, 1)
    out = capsys.readouterr().out
    assert out.startswith("[darl] step 1/4 | reward 0.531") and "actor/pg_loss" not in out
    full = compact_console(Tracking("p", "e", default_backend=["console"]), OmegaConf.create({"console": "full"}), lambda: 4)
    full.log(STEP, 1)
    assert "actor/pg_loss" in capsys.readouterr().out  # verl's line, every metric


def test_a_trainers_logger_assignment_installs_it():
    class Trainer:
        logger = CompactTracking()
        config = OmegaConf.create({"console": "compact"})
        total_training_steps = 7

    t = Trainer()
    assert not hasattr(t, "logger")
    t.logger = Tracking("p", "e", default_backend=["console"])  # what verl's fit does
    assert isinstance(t.logger.logger["console"], CompactConsole)
    assert t.logger.logger["console"].total_steps() == 7
