"""The README's example runs as written and prints a selection from more than one source."""

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_example_runs():
    (code,) = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.startswith("selected groups [")
    assert "sources [2, 3]" in out
