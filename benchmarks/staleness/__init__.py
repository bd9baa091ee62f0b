"""Controlled-staleness research harness for D-ARL: see harness.py and run_study.py."""
