"""Every command in README.md and the install, data, running, cluster and evaluation docs runs as written, as far as
this machine allows: a launch script through its dry run (DARL_DRY_RUN=1; run.sh with DRY_RUN=1), a Python entry
point's flags and choices against its `--help`, a make target through `make -n`, a pip requirement file by its
existence. Commands that need a GPU or the network (nvidia-smi, `python -c "import torch..."`, pip installs by name)
are listed as skipped."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from cluster_helpers import ROOT, base_env

PAGES = ("README.md", "docs/install.md", "docs/data.md", "docs/running.md", "docs/cluster.md", "docs/evaluation.md")
PROGRAMS = ("python", "bash", "make", "pip", "for", "nvidia-smi")
SKIPPED = ("nvidia-smi", "python -c", "pip install --no-deps", "pip install flash-attn")
A_SCRIPT = "shells/one_step_off_grpo_1.7b_gsm8k_fsdp2_1_1_replay_4_pmis_sg.sh"  # for the placeholder SCRIPT


def commands(page: str) -> list[str]:
    """The shell commands of `page`'s code blocks: continuation lines joined, comments dropped, printed output (lines
    that do not start with an environment assignment or one of PROGRAMS) left out."""
    found = []
    for block in re.findall(r"```(?:bash|sh)?\n(.*?)```", (ROOT / page).read_text(), re.S):
        text = re.sub(r"\\\n\s*", " ", block)
        text = re.sub(r";\s*do\n\s*", "; do ", re.sub(r"\n\s*done\b", "; done", text))
        for line in text.splitlines():
            if re.match(rf"^\s*(?:[A-Z_]+=(?:\"[^\"]*\"|'[^']*'|\S+)\s+)*(?:{'|'.join(PROGRAMS)})\b", line):
                found.append(line.strip() if line.strip().startswith("for ") else shlex.join(shlex.split(line, comments=True)))
    return found


ALL = [(page, c) for page in PAGES for c in commands(page)]


def test_the_pages_hold_the_commands_this_test_checks():
    got = {_split_env(shlex.split(c))[1][0] for _, c in ALL}
    assert {"make", "pip", "bash", "for", "python"} <= got and len(ALL) >= 15, ALL


def _split_env(words: list[str]) -> tuple[dict[str, str], list[str]]:
    env, rest = {}, list(words)
    while rest and re.match(r"^[A-Z_]+=", rest[0]):
        key, _, value = rest.pop(0).partition("=")
        env[key] = value
    return env, rest


def _check_python_module(words: list[str], values: dict[str, list[str]]) -> None:
    """`python -m M ...`: M's --help runs, and every flag used and every value given to a flag with choices is in it."""
    module = words[2]
    out = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    for flag in (w for w in words[3:] if w.startswith("--")):
        assert flag in out.stdout, (module, flag)
    for flag, given in values.items():
        choices = re.search(rf"{re.escape(flag)} \{{([^}}]*)\}}", out.stdout)
        if choices:
            assert set(given) <= set(choices.group(1).split(",")), (flag, given, choices.group(1))


@pytest.mark.parametrize("page,command", ALL, ids=[f"{p}:{c[:60]}" for p, c in ALL])
def test_a_documented_command_runs_as_written(page, command, tmp_path):
    if command.startswith(SKIPPED) or " python -c " in f" {command} ":
        pytest.skip("needs a GPU or the network")
    if command.startswith("for "):  # for d in a b c; do python -m M --dataset $d ...; done
        loop = re.match(r"for (\w+) in (.*?); do (.*?); done", command)
        var, values, body = loop.groups()
        words = shlex.split(body)
        flag = next(words[i - 1] for i, w in enumerate(words) if w == f"${var}")
        return _check_python_module(words, {flag: values.split()})
    env_vars, words = _split_env(shlex.split(command))
    if words[0] == "make":
        out = subprocess.run(["make", "-n", *words[1:]], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
    elif words[0] == "pip":
        target = words[words.index("-r") + 1] if "-r" in words else "setup.py"
        assert (ROOT / target).exists(), target
    elif words[:2] == ["python", "-m"]:
        values = {w: [words[i + 1]] for i, w in enumerate(words[:-1]) if w.startswith("--")}
        _check_python_module(words, values)
    elif words[0] == "bash":
        _check_launch(env_vars, [w if w != "SCRIPT" else A_SCRIPT for w in words], page, tmp_path)
    else:
        pytest.fail(f"no check for {command!r}")


def _check_launch(env_vars: dict[str, str], words: list[str], page: str, tmp_path: Path) -> None:
    """A launch script through its dry run; run.sh with DRY_RUN=1 (it prints the sbatch command, or refuses a job
    the allocation cannot hold, as the page shows next to the command)."""
    env = base_env(tmp_path)
    env.update(env_vars)
    for key, value in env_vars.items():  # a path the page makes up (~/data/nope.parquet) stays as written
        env[key] = str(Path(value).expanduser()) if value.startswith("~") else value
    if words[1].endswith("run.sh"):
        env.setdefault("DRY_RUN", "1")
        env.update(VENV="none", LOG_DIR=str(tmp_path / "logs"))
    out = subprocess.run(words, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:  # a refusal the page documents: one of its output lines is printed
        printed = _normalized(out.stdout + out.stderr)
        shown = [line for line in _output_lines(page) if line and line in printed]
        assert shown, (words, out.stdout[-2000:], out.stderr[-2000:])
    elif words[1].endswith("run.sh"):
        assert out.stdout.startswith("+ sbatch "), out.stdout


def _normalized(text: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"\[run\.sh [^\]]*\]", "[run.sh]", text))


def _output_lines(page: str) -> list[str]:
    """The printed lines a page shows in its code blocks (errors, refusals), up to any `...` it elides."""
    lines = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", (ROOT / page).read_text(), re.S):
        for line in block.splitlines():
            if line.strip().startswith(("- ", "[run.sh")):
                lines.append(_normalized(line.split("...")[0]).strip())
    return lines
