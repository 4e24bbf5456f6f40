"""Benchmarks run against a vLLM-served checkpoint, scored by the benchmark's own checker.

    slca-exp eval RUN_OR_SWEEP benchmark=bfcl_v3 [benchmark.KEY=V ...] [eval=cpu] [eval.KEY=V ...]

- :mod:`~slca_exp.evaluation.benchmark`: the ``benchmark`` option (``benchmark/<name>.yaml``):
  which benchmark, its version, categories and sample; checked before anything starts.
- :mod:`~slca_exp.evaluation.settings`: the ``eval`` option (``eval/<name>.yaml``): how the
  checkpoint is served (vLLM's CUDA or CPU build, the tool-call parser) and where.
- :mod:`~slca_exp.evaluation.environment`: the benchmark's own Python environment, built once
  under a lock and recorded (BFCL's pins clash with the project's).
- :mod:`~slca_exp.evaluation.bfcl_driver`: what runs inside that environment: BFCL's own
  generation and checker against the served checkpoint.
- :mod:`~slca_exp.evaluation.scoring`: a run's checkpoint, served and scored, its scores logged
  to the run that trained it (``eval/bfcl/<category>``, ``eval/bfcl/overall``, the item table).
- :mod:`~slca_exp.evaluation.jobs`: one run's eval, here or as a SLURM job of its own.
"""
