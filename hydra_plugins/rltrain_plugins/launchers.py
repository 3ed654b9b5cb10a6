"""rltrain's launchers: submitit's (resume after a requeue) and joblib's (one process per job, so a job killed
from outside fails alone). Hydra instantiates plugins only from ``hydra_plugins``; the logic lives in
rltrain.sweeps.requeue and rltrain.sweeps.jobs."""

try:  # the 'slurm' extra; without it Hydra's plugin scan must not fail
    from hydra_plugins.hydra_submitit_launcher import submitit_launcher as _plugin
except ImportError:
    _plugin = None
try:  # the 'joblib' extra
    from hydra_plugins.hydra_joblib_launcher import joblib_launcher as _joblib
except ImportError:
    _joblib = None

from rltrain.sweeps.jobs import SeparateProcesses
from rltrain.sweeps.requeue import Resumable

if _plugin is not None:

    class SlurmLauncher(Resumable, _plugin.SlurmLauncher):
        pass

    class LocalLauncher(Resumable, _plugin.LocalLauncher):
        pass

if _joblib is not None:

    class JoblibLauncher(SeparateProcesses, _joblib.JoblibLauncher):
        pass
