"""The test suite's own helper that reads a subprocess's result (tests/subprocess_json.py), on the output it met."""

from subprocess_json import last_json_object


def test_the_last_json_object_is_read_past_a_log_line_written_onto_its_line():
    # the fresh-clone failure: a vLLM server's log line forwarded by Ray between the JSON text and its newline
    out = ('(pid=1) INFO start\n{"a": 1}\n{"engine_start_s": 25.6, "n": [1, 2]}\x1b[36m(vLLMHttpServer pid=3955)\x1b[0m '
           'INFO setting pause state to PAUSED_NEW\n(pid=1) INFO done\n')
    assert last_json_object(out) == {"engine_start_s": 25.6, "n": [1, 2]}
    # a log line without its newline before the object; a line with braces that is not JSON after it
    assert last_json_object('(pid=2) INFO x{"b": {"c": 2}}\n{not json}\n') == {"b": {"c": 2}}
    assert last_json_object("no result\n") is None
    # a script whose result is the empty object (tests/workers/test_dp_update.py prints "{}"), after a log line with braces
    assert last_json_object("(pid=3) INFO {not json}\n{}\n(pid=3) INFO done\n") == {}
