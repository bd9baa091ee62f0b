"""Data preparation: verl-format parquet for GSM8K, MATH, MATH-500, AIME24, HumanEval and LiveCodeBench.

`python -m recipe.darl.data.prepare --dataset NAME --out DIR [--offline | --source FILE --split SPLIT]`;
see `prepare.py` and docs/running.md, 'Prepare the data'.
"""
