"""rltrain's Optuna sweeper (Hydra instantiates plugins only from ``hydra_plugins``; the logic lives in
rltrain.sweeps.replicates)."""

try:  # the 'sweep' extra; without it Hydra's plugin scan must not fail
    from hydra_plugins.hydra_optuna_sweeper.optuna_sweeper import OptunaSweeper as _OptunaSweeper
except ImportError:
    _OptunaSweeper = None

if _OptunaSweeper is not None:
    from rltrain.sweeps.replicates import Replicated

    class ReplicatedOptunaSweeper(Replicated, _OptunaSweeper):
        pass
