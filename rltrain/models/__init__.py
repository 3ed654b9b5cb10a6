from rltrain.models import grid as _grid  # noqa: F401  (registers model.encoder=grid and its auto rule)
