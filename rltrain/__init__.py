"""rltrain: train reinforcement-learning agents from Hydra configs, from one process to a SLURM cluster."""

__version__ = "0.2.0"
