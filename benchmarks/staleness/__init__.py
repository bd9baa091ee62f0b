"""Controlled-staleness research harness for D-ARL (issue 6): see harness.py and run_study.py."""
