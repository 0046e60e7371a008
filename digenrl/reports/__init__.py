"""Reports on the simulator, outside the importable core (nothing of the runtime imports this package): the
simulated results tables (:mod:`~digenrl.reports.tables`), the simulator against real runs
(:mod:`~digenrl.reports.validation`, :mod:`~digenrl.reports.validation_runs`) and the command-line
dispatch of ``experiments/simulate.py`` / ``measure.py`` (:mod:`~digenrl.reports.cli`). The result and
cost folders are arguments: the ``experiments/`` scripts, which know the checkout, pass them."""
