"""The README's example runs as written and prints the selection worked out by hand, from two sources."""

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_example_runs():
    (code,) = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    # fresh groups 0 and 1 first, then the least reused of the replayed groups 2 (reused once) and 3 (never)
    assert out.startswith("selected groups [0, 1, 3]")
    assert "sources [1, 3]" in out
