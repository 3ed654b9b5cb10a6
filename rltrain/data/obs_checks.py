"""Whether an observation handed to a loaded policy (``rltrain.load_policy(...).act``) fits the space the policy
was trained on. A wrong shape reaches the network as torch's ``mat1 and mat2 shapes cannot be multiplied``, or
worse as no error at all (a (2, 3) array read as one (3, 2) observation, its values in the wrong places), and an
index outside its Discrete space as ``Class values must be smaller than num_classes``: each is one ValueError here
naming the space and the shapes it takes, as SB3's ``predict`` says it. ``act`` is called once per step in a
user's loop, so the check is decided per stored array, on its shape, with one vectorised min / max for index
spaces: no per-element Python.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rltrain.data.structs import ObsSpace


def _leaves(space: ObsSpace, path: tuple[str, ...] = (), label: str = "") -> list:
    """(key path, space, how to name it) of each stored array, in ``obs_buffer`` / ``obs_leaves`` order."""
    if space.kind != "dict":
        return [(path, space, label)]
    # a Tuple's elements, keyed "0", "1", ... in the policy's Dict (TupleAsDict), are named by their index
    tuple_like = [k for k, _ in space.parts] == [str(i) for i in range(len(space.parts))]
    return [leaf for key, part in space.parts if part.kind != "unsupported"
            for leaf in _leaves(part, (*path, key), f"{label}[{key}]" if tuple_like else f"{label}[{key!r}]")]


def _accepted(shape: tuple[int, ...]) -> str:
    """The shapes an array of a space of ``shape`` may have: one observation, or a batch of them."""
    return f"{tuple(shape)} or (n_env{''.join(f', {n}' for n in shape)})"


class ObsCheck:
    """The check of one observation space: ``single(obs)`` says whether ``obs`` is one observation (the space's
    own shape) or a batch [N, ...] of them, and raises ValueError where any stored array fits neither."""

    def __init__(self, space: ObsSpace):
        self.space = space
        self.leaves = _leaves(space)
        # per leaf, the inclusive range its values must lie in (index spaces), or None (a Box: any value)
        self.ranges = [self._range(leaf) for _, leaf, _ in self.leaves]

    @staticmethod
    def _range(leaf: ObsSpace) -> tuple[Any, Any] | None:
        if leaf.kind == "discrete":
            return leaf.start, leaf.start + leaf.n - 1
        if leaf.kind == "multi_discrete":
            return 0, np.asarray(leaf.nvec).reshape(leaf.shape) - 1
        if leaf.kind == "multi_binary":
            return 0, 1
        return None

    def single(self, obs: Any) -> bool:
        space = self.space
        if space.kind == "dict" and not isinstance(obs, dict):
            keys = [k for k, part in space.parts if part.kind != "unsupported"]
            raise ValueError(f"observation must be a dict with keys {keys} ({space.name})")
        if space.kind != "dict" and isinstance(obs, dict):
            raise ValueError(f"observation is a dict with keys {list(obs)}, but the policy observes {space.name}; "
                             f"pass an array of shape {_accepted(space.shape)}")
        single, batch = None, None
        for (path, leaf, label), bounds in zip(self.leaves, self.ranges, strict=True):
            x = obs
            for key in path:
                x = x[key]
            shape = np.shape(x)  # an array's own; a list's or a number's as numpy reads it
            if single is None:  # the first array decides: the space's own axes, or one more in front
                single = shape == leaf.shape
                batch = None if single else shape[:1]
            if shape != (leaf.shape if single else (*batch, *leaf.shape)):
                raise ValueError(self._shape_error(label, leaf, shape, single, batch))
            if bounds is not None and not (type(x) is int and bounds[0] <= x <= bounds[1]):  # one index: no numpy
                self._check_values(np.asarray(x), label, leaf, bounds)
        return bool(single)

    def _shape_error(self, label: str, leaf: ObsSpace, shape: tuple[int, ...], single: bool,
                     batch: tuple[int, ...] | None) -> str:
        said = f"Unexpected observation{label} shape {shape} for {leaf.name or leaf.kind}, please use " \
               f"{_accepted(leaf.shape)}"
        first = self.leaves[0][2]
        if label != first:  # a later key: the first one decided one observation or a batch of them
            said += (f" (as observation{first} is one observation, {leaf.shape})" if single else
                     f" (as observation{first} is a batch of {batch[0]}, {(*batch, *leaf.shape)})")
        return said

    @staticmethod
    def _check_values(values: np.ndarray, label: str, leaf: ObsSpace, bounds: tuple[Any, Any]) -> None:
        if values.size == 0:
            return
        low, high = bounds
        if np.isscalar(high) and values.min() >= low and values.max() <= high:
            return  # the common case: one min and one max over the whole array
        if not np.isscalar(high) and values.min() >= low and (values <= high).all():
            return
        outside = values[(values < low) | (values > high)]
        allowed = f"{low} to {high}" if np.isscalar(high) else f"0 to nvec - 1 = {high.tolist()}"
        raise ValueError(f"observation{label} value {outside.reshape(-1)[0].item()!r} is outside "
                         f"{leaf.name or leaf.kind} (values {allowed})")
