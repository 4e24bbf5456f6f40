"""Helpers every layer may use; they import nothing from slca_exp outside this package.

    problems   Problem, ConfigError: a problem named by its config key, with its fix
    hashing    sha256 of files, cached per file version
    checking   the context a check runs in: may it create files, are this host's resources the run's
    process    ranks, stop signals and the exceptions a stopped run raises
    preemption SLURM's preemption and time-limit signals routed to a stop or a requeue
    task       the SLURM / torchrun task this process is: rank, hosts, ports, resources
    names      every metric name slca-exp logs
    tags       every MLflow run tag slca-exp writes or reads
    rows       Row, the one view of a data row: its prompt, ground truth, tools, recorded responses

The layer contract (``[tool.importlinter]`` in ``pyproject.toml``) keeps it at the bottom.
"""
