"""Child-process test runner for code rewards: `python -I _runner.py SPEC.json`.

Runs in its own process, never in the trainer's. It first lowers its own resource limits (address
space, CPU seconds, file size), reads and deletes the spec file, then runs the candidate program
against the tests and prints one final line `<token> PASS <n>` when every test passed. Anything
else (an exception, a failed test, a timeout enforced by the parent, a crash) leaves that line out.
Uses only the standard library.

Spec (JSON): {"kind": "assert" | "stdin" | "functional", "code": str, "token": str,
"memory_mb": int, "cpu_s": int, and per kind: "test" + "entry_point" (assert), "tests": [{"input",
"output"}] (stdin, functional), "fn_name" (functional)}.
"""

import io
import json
import math
import os
import resource
import sys

# what LiveCodeBench-style and HumanEval solutions commonly assume is already imported
PRELUDE = (
    "import sys, os, math, re, heapq, bisect, itertools, functools, collections, string, random, copy, operator\n"
    "from typing import *\n"
    "from collections import *\n"
    "from itertools import *\n"
    "from functools import *\n"
    "from heapq import *\n"
    "from bisect import *\n"
)


def set_limits(memory_mb: int, cpu_s: int) -> None:
    mem = int(memory_mb) * 1024 * 1024
    for which, value in ((resource.RLIMIT_AS, mem), (resource.RLIMIT_CPU, int(cpu_s)), (resource.RLIMIT_FSIZE, 16 * 1024 * 1024)):
        try:
            resource.setrlimit(which, (value, value))
        except (ValueError, OSError):
            pass
    try:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (ValueError, OSError):
        pass


def outputs_match(got: str, expected: str) -> bool:
    """Line by line after stripping; tokens that are numbers may differ by 1e-6 (relative or absolute)."""
    got_lines = [line.strip() for line in got.strip().splitlines()]
    exp_lines = [line.strip() for line in expected.strip().splitlines()]
    if got_lines == exp_lines:
        return True
    if len(got_lines) != len(exp_lines):
        return False
    for g, e in zip(got_lines, exp_lines):
        gt, et = g.split(), e.split()
        if len(gt) != len(et):
            return False
        for a, b in zip(gt, et):
            if a == b:
                continue
            try:
                if not math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=1e-6):
                    return False
            except ValueError:
                return False
    return True


def _normalize(value):
    if isinstance(value, tuple):
        return [_normalize(v) for v in value]
    if isinstance(value, list):
        return [_normalize(v) for v in value]
    if isinstance(value, dict):
        return {k: _normalize(v) for k, v in value.items()}
    return value


def run_stdin(code: str, tests: list) -> bool:
    program = compile(PRELUDE + code, "<solution>", "exec")
    real_stdin, real_stdout = sys.stdin, sys.stdout
    for test in tests:
        # byte-backed streams, so `sys.stdin.buffer.read()` and `sys.stdout.buffer.write()` work too
        captured = io.BytesIO()
        sys.stdin = io.TextIOWrapper(io.BytesIO(test["input"].encode()), encoding="utf-8")
        sys.stdout = io.TextIOWrapper(captured, encoding="utf-8", write_through=True)
        try:
            exec(program, {"__name__": "__main__"})
        except SystemExit as e:
            if e.code not in (None, 0):
                return False
        finally:
            try:
                sys.stdout.flush()
            except Exception:
                pass
            got = captured.getvalue().decode("utf-8", errors="replace")
            sys.stdin, sys.stdout = real_stdin, real_stdout
        if not outputs_match(got, test["output"]):
            return False
    return True


def run_functional(code: str, fn_name: str, tests: list) -> bool:
    namespace = {"__name__": "__solution__"}
    real_stdout = sys.stdout
    sys.stdout = io.StringIO()
    try:
        exec(compile(PRELUDE + code, "<solution>", "exec"), namespace)
        owner = namespace["Solution"]() if "Solution" in namespace else None
        fn = getattr(owner, fn_name) if owner is not None else namespace[fn_name]
        for test in tests:
            args = [json.loads(line) for line in test["input"].split("\n") if line.strip()]
            expected = json.loads(test["output"])
            if _normalize(fn(*args)) != _normalize(expected):
                return False
    finally:
        sys.stdout = real_stdout
    return True


def run_assert(code: str, test: str, entry_point: str) -> bool:
    namespace = {"__name__": "__solution__"}
    real_stdout = sys.stdout
    sys.stdout = io.StringIO()
    try:
        exec(compile(PRELUDE + code + "\n\n" + test + f"\n\ncheck({entry_point})\n", "<solution>", "exec"), namespace)
    finally:
        sys.stdout = real_stdout
    return True


def main() -> int:
    spec_path = sys.argv[1]
    with open(spec_path) as f:
        spec = json.load(f)
    os.remove(spec_path)
    set_limits(spec.get("memory_mb", 1024), spec.get("cpu_s", 10))
    token, kind = spec.pop("token"), spec["kind"]
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))
    try:
        if kind == "assert":
            ok, n = run_assert(spec["code"], spec["test"], spec["entry_point"]), 1
        elif kind == "stdin":
            ok, n = run_stdin(spec["code"], spec["tests"]), len(spec["tests"])
        elif kind == "functional":
            ok, n = run_functional(spec["code"], spec["fn_name"], spec["tests"]), len(spec["tests"])
        else:
            return 2
    except BaseException:  # a failing assert, any error in the program, or SystemExit in assert/functional code
        return 1
    if ok:
        sys.__stdout__.write(f"{token} PASS {n}\n")
        sys.__stdout__.flush()
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
