"""``slca-exp serve``: the frozen judge and simulator as SLURM jobs of their own.

``definitions.py`` loads a ``service`` option with its cluster profile and checks them together,
``job.py`` is what the service's job runs (the server, then its record), ``cli.py`` the command.
Runs find a service through the registry (:mod:`slca_exp.services.served`).
"""
