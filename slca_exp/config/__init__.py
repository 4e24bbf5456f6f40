"""The typed config of a run: its schema, per-field checks, tool weights and run paths.

    schema   one dataclass per config group, stored in Hydra's ConfigStore
    services the judge's and the simulator's schemas: a served model, or a CPU stand-in
    fields   ``param(...)``: a field with its help and its check, declared together
    weights  the HierR tool weights, normalised in one place
    paths    where a run's files live (the tracking root, each run's folder)

Composing a config from ``conf/`` and validating it (which consults the registries of engines,
estimators, judges and simulators) is :mod:`slca_exp.preflight`'s, above the packages that register.
"""
