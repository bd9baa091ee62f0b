"""Data preparation: verl-format parquet for GSM8K, MATH, MATH-500, AIME24, HumanEval and LiveCodeBench
(`python -m recipe.darl.data.prepare`; docs/data.md)."""
