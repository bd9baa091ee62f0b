"""Reading a subprocess's result: the last JSON object it printed (tests/conftest.py's run_python)."""

import json


def last_json_object(stdout: str) -> dict | None:
    """The last JSON object on its own line of `stdout` (`{}` included), text before or after it on that line
    ignored: print() writes a line's text and its newline in two calls, and Ray's log thread in the same process can
    write a worker's log line between them (the JSON, then a vLLM log line, on one line)."""
    decoder = json.JSONDecoder()
    for line in reversed(stdout.splitlines()):
        start = line.find("{")
        while start >= 0:
            try:
                found = decoder.raw_decode(line, start)[0]
            except json.JSONDecodeError:
                found = None
            if isinstance(found, dict):
                return found
            start = line.find("{", start + 1)
    return None
