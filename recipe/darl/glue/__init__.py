"""The verl glue both trainers share: the replay step over verl's fit-step hooks (`ReplayStepMixin`), the
conversions between verl's DataProto and replay groups, the D-ARL loss for verl's actor (`set_loss_fn`), and
the config checks that run before Ray starts."""
