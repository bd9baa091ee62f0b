"""What keeps a run alive and resumable: atomic checkpoint files, the stop request, the rollout watch, the reward guard."""
