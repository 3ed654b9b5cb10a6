"""rltrain's submitit launchers (Hydra instantiates plugins only from ``hydra_plugins``; the logic lives in
rltrain.sweeps.requeue)."""

try:  # the 'slurm' extra; without it Hydra's plugin scan must not fail
    from hydra_plugins.hydra_submitit_launcher import submitit_launcher as _plugin
except ImportError:
    _plugin = None

from rltrain.sweeps.requeue import Resumable

if _plugin is not None:

    class SlurmLauncher(Resumable, _plugin.SlurmLauncher):
        pass

    class LocalLauncher(Resumable, _plugin.LocalLauncher):
        pass
