"""rltrain's config schema in Hydra's ConfigStore and the resolvers conf/train.yaml uses (rltrain/cli/schema.py).
Hydra imports every module under ``hydra_plugins`` before it composes a config, so both exist wherever
conf/train.yaml is composed: the ``rltrain`` command, ``rltrain.train``, ``rltrain-check``, a sweep's jobs and
``hydra.compose``."""

from rltrain.cli.schema import register

register()
