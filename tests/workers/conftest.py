"""The worker tests share tests/conftest.py's fixtures: `tiny_model_path` and `run_python` (verl in a
fresh process with VERL_PLATFORM=cpu)."""
