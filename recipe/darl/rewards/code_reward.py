"""Code answers (HumanEval, LiveCodeBench) scored by running their tests in a child process.

The program never runs in the caller's process: `compute_score` writes a spec file and starts
`python -I recipe/darl/rewards/_runner.py SPEC` in a new session, with a wall-clock limit
(`timeout_s`, the whole process group is killed when it passes), and the child lowers its own
limits first (address space `memory_mb`, CPU seconds, 16 MiB file size, no core dumps). The child's
environment is reduced to PATH/HOME/LANG, so secrets in the trainer's environment (API keys) do not
reach it. Score: 1.0 when the child prints its pass line (a per-call random token) and exits 0;
0.0 on a failed test, a timeout, a crash, an early `exit`, or a response without usable code.

This bounds runaway programs; it is not a security sandbox. For untrusted models at scale use
verl's sandbox_fusion (`reward.sandbox_fusion.url`) or run the trainer inside a container.

Ground truth: a JSON string (one parquet column type for every code dataset):
  {"kind": "assert", "test": "<def check(candidate): ...>", "entry_point": "f", "prompt": "<signature + docstring>"}
  {"kind": "stdin", "tests": [{"input": "...", "output": "..."}, ...]}
  {"kind": "functional", "fn_name": "maxScore", "tests": [{"input": "<one JSON value per line>", "output": "<JSON>"}]}
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

RUNNER = Path(__file__).with_name("_runner.py")
DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MEMORY_MB = 1024
_CODE_BLOCK = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def extract_code(response: str) -> str | None:
    """The last fenced code block after any `</think>`; None when the response has none."""
    if not isinstance(response, str):
        return None
    text = response.rsplit("</think>", 1)[1] if "</think>" in response else response
    blocks = [b for b in _CODE_BLOCK.findall(text) if b.strip()]
    return blocks[-1] if blocks else None


def build_program(code: str, spec: dict) -> str:
    """HumanEval: a completion that only has the body (no `def <entry_point>`) is appended to the prompt."""
    if spec.get("kind") == "assert":
        entry = spec.get("entry_point", "")
        if not re.search(rf"^\s*def\s+{re.escape(entry)}\s*\(", code, re.MULTILINE):
            return spec.get("prompt", "") + code
    return code


def run_tests(code: str, spec: dict, timeout_s: float = DEFAULT_TIMEOUT_S, memory_mb: int = DEFAULT_MEMORY_MB) -> bool:
    """Runs `code` against `spec`'s tests in a child process; True only when every test passed."""
    token = secrets.token_hex(16)
    payload = dict(spec, code=code, token=token, memory_mb=int(memory_mb), cpu_s=max(1, int(timeout_s) + 1))
    payload.pop("prompt", None)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": tempfile.gettempdir(), "LANG": "C.UTF-8",
           "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    with tempfile.TemporaryDirectory(prefix="darl_code_") as work:
        spec_path = os.path.join(work, "spec.json")
        with open(spec_path, "w") as f:
            json.dump(payload, f)
        out_path = os.path.join(work, "stdout")
        with open(out_path, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-I", str(RUNNER), spec_path],
                cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            try:
                rc = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                return False
            finally:
                _kill_group(proc)  # reap anything the program left running in its session
        try:
            with open(out_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 4096))
                tail = f.read().decode("utf-8", errors="replace").strip().splitlines()
        except OSError:
            return False
    return rc == 0 and bool(tail) and tail[-1].startswith(f"{token} PASS ")


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:  # pragma: no cover
        pass


def compute_score(solution_str: str, ground_truth, timeout_s: float = DEFAULT_TIMEOUT_S,
                  memory_mb: int = DEFAULT_MEMORY_MB) -> float:
    """1.0 when the response's last code block passes every test, else 0.0 (never raises)."""
    try:
        spec = json.loads(ground_truth) if isinstance(ground_truth, str) else dict(ground_truth)
        if spec.get("kind") not in ("assert", "stdin", "functional"):
            return 0.0
        if spec["kind"] in ("stdin", "functional") and not spec.get("tests"):
            return 0.0
        code = extract_code(solution_str)
        if code is None:
            return 0.0
        return 1.0 if run_tests(build_program(code, spec), spec, timeout_s=timeout_s, memory_mb=memory_mb) else 0.0
    except Exception:
        return 0.0
