"""Comparing runs: what ``slca-exp compare`` reads, estimates, draws and writes.

``runs`` (which runs, grouped how, one observation each), ``estimates`` (a difference's),
``differences`` (per cell, along a numeric factor, dose-response), ``comparability`` (the
guard), ``tables``, ``plots``, ``report``.
"""
