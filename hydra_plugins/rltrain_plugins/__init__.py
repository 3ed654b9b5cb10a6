"""rltrain's Hydra plugins: submitit launchers that resume after a requeue, Optuna with seed replicates."""
