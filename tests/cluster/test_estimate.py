"""The cost estimate before a launch (recipe/darl/estimate.py): each figure by hand from the measured costs, and a
launch script's dry run through it."""

import math

import pytest

from cluster_helpers import SHELLS, base_env
from recipe.darl import estimate as est
from recipe.darl.main_one_step_off import MODE as ONE

GIB = 2**30


def _cfg(**replay):
    return {"actor_rollout_ref": {"model": {"path": "Qwen/Qwen3-1.7B"},
                                  "rollout": {"n": 8, "tensor_model_parallel_size": 1, "gpu_memory_utilization": 0.8},
                                  "actor": {"ppo_mini_batch_size": 32, "ppo_max_token_len_per_gpu": 16384, "ppo_epochs": 1}},
            "data": {"train_batch_size": 128, "max_prompt_length": 512, "max_response_length": 1024,
                     "train_files": "/d/gsm8k/train.parquet"},
            "trainer": {"nnodes": 1, "n_gpus_per_node": 2, "total_epochs": 2, "total_training_steps": None},
            "rollout": {"nnodes": 1, "n_gpus_per_node": 1}, "replay": replay}


def test_each_figure_by_hand():
    cost = est.MODELS["qwen3-1.7b"]
    e = est.estimate(_cfg(enable=True, k=4), ONE)
    # 128 groups x 8 responses of 250 tokens after prompts of 250; the preset's additive replay: up to 1.5 x 128 groups
    assert e["groups per step (trained, at most)"] == "128 (192)"
    train = 192 * 8 * (250 + 250) * (1 + 1 / 3) / (cost.train_tokens_per_s * 2)
    assert e["training s/step"] == pytest.approx(train)
    # one replica: every step of the longest response (625 tokens) pays the fixed cost, each token its sequence's
    # share, each context token its share (sum over a response's steps: 250 x 250 + 250^2 / 2)
    gen = (625 * cost.decode_fixed_ms + 1024 * 250 * cost.decode_per_seq_ms
           + 1024 * (250 * 250 + 250 * 250 / 2) * cost.decode_per_ctx_token_ms) / 1e3
    assert e["generation s/step"] == pytest.approx(gen)
    assert e["step s"] == pytest.approx(max(train, gen)) and e["tokens/s (generated)"] == pytest.approx(1024 * 250 / e["step s"])
    # FSDP2 state sharded over 2 GPUs, activations for 16,384-token micro-batches (twice the measured 8,192)
    assert e["trainer GPU memory GiB"] == pytest.approx(16 * 1.72e9 / GIB / 2 + 2 * cost.activation_gib)
    assert e["rollout GPU memory GiB"] == pytest.approx(64.0)
    assert e["replay buffer host MiB"] == pytest.approx(4 * 128 * 8 * (250 + 250 / 8) * 19.04 / 2**20)
    assert e["steps"] == 2 * 7473 // 128 and e["hours"] == pytest.approx(e["steps"] * e["step s"] / 3600)
    plain = est.estimate(_cfg(enable=False), ONE)  # no replay: the fresh groups only, no buffer
    assert plain["groups per step (trained, at most)"] == "128 (128)" and plain["replay buffer host MiB"] == 0
    assert est.estimate(_cfg(), ONE, mean_response=100)["mean response tokens (assumed)"] == 100
    with pytest.raises(SystemExit, match="measured for qwen3-1.7b, qwen3-4b only"):
        est.estimate({**_cfg(), "actor_rollout_ref": {**_cfg()["actor_rollout_ref"], "model": {"path": "Llama-8B"}}}, ONE)


def test_a_launch_script_through_its_dry_run(tmp_path, monkeypatch, capsys):
    for key, value in base_env(tmp_path).items():
        monkeypatch.setenv(key, value)
    (tmp_path / "Qwen3-1.7B").mkdir()  # a local copy of the model: its folder's name says which
    monkeypatch.setenv("MODEL_PATH", str(tmp_path / "Qwen3-1.7B"))
    script = SHELLS / "one_step_off_grpo_1.7b_gsm8k_fsdp2_1_1_replay_4_pmis_sg.sh"
    assert est.main([str(script), "trainer.total_training_steps=100"]) == 0
    out = capsys.readouterr().out
    assert "groups per step (trained, at most) 128 (192)" in " ".join(out.split())
    hours = float(out.split("hours")[1].split()[0])
    step = float(out.split("step s")[1].split()[0])
    assert math.isclose(hours, 100 * step / 3600, rel_tol=0.01)


def test_checkpoint_disk_by_hand():
    """fp32 model shards (4 bytes a parameter) and AdamW's two fp32 moments (8), plus the replay buffer; kept:
    max_actor_ckpt_to_keep, and one more while a save is written before the oldest is removed."""
    cfg = {"actor_rollout_ref": {"model": {"path": "Qwen/Qwen3-1.7B"},
                                 "actor": {"checkpoint": {"save_contents": ["model", "optimizer", "extra"]}}},
           "trainer": {"save_freq": 20, "max_actor_ckpt_to_keep": 3}}
    d = est.checkpoint_disk(cfg, steps=290, replay_mib=512)
    each = 12 * 1.72e9 / GIB + 0.5
    assert d["checkpoint GiB (each)"] == pytest.approx(each) and 19 < each < 20.5
    assert d["checkpoints saved"] == 15 and d["checkpoints kept (max_actor_ckpt_to_keep)"] == 3  # 20, 40, ..., 280, 290
    assert d["checkpoint disk GiB (at most)"] == pytest.approx(4 * each)
    cfg["trainer"]["max_actor_ckpt_to_keep"] = None  # verl's default: every checkpoint stays
    assert est.checkpoint_disk(cfg, steps=290)["checkpoint disk GiB (at most)"] == pytest.approx(15 * 12 * 1.72e9 / GIB)
    cfg["actor_rollout_ref"]["actor"]["checkpoint"]["save_contents"] += ["hf_model"]  # a full fp32 copy besides
    assert est.checkpoint_disk(cfg, steps=None)["checkpoint GiB (each)"] == pytest.approx(16 * 1.72e9 / GIB)
    cfg["trainer"]["save_freq"] = -1
    assert est.checkpoint_disk(cfg, steps=290)["checkpoint disk GiB (at most)"] == 0


def test_the_printed_estimate_says_the_disk(tmp_path, monkeypatch, capsys):
    for key, value in base_env(tmp_path).items():
        monkeypatch.setenv(key, value)
    (tmp_path / "Qwen3-4B").mkdir()
    monkeypatch.setenv("MODEL_PATH", str(tmp_path / "Qwen3-4B"))
    script = SHELLS / "one_step_off_grpo_4b_math_fsdp2_2_2_replay_4_pmis_sg.sh"
    assert est.main([str(script), "trainer.total_training_steps=100"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    each = float(out.split("checkpoint GiB (each)")[1].split()[0])
    assert 12 * 4.02e9 / GIB < each < 12 * 4.02e9 / GIB + 1  # model and optimizer, plus the replay buffer
    assert "checkpoints saved 5" in out and "checkpoints kept (max_actor_ckpt_to_keep) 3" in out
    assert float(out.split("checkpoint disk GiB (at most)")[1].split()[0]) == pytest.approx(4 * each, abs=0.2)
