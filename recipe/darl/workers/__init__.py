"""Code that runs inside verl's workers: the D-ARL loss in the FSDP2 actor, DARTS in the agent loop."""
