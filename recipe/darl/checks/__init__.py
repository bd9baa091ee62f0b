"""Checks of a launch before Ray starts: the config, the data files, the trackers."""
