"""What a checkpoint's record of its spaces may hold, read back checked: a crafted or foreign file's malformed
record is one ValueError naming the entry (the records are plain containers, ``torch.load(weights_only=True)``),
never a misbuilt network."""

from __future__ import annotations

from typing import Any


def checked(value: Any, kind: type, what: str) -> Any:
    """``value`` when it is a ``kind`` (float: any real number; never a bool for a number), else ValueError."""
    ok = isinstance(value, (int, float) if kind is float else kind)
    if not ok or (kind in (int, float) and isinstance(value, bool)):
        raise ValueError(f"{what} is {value!r}, not {'a number' if kind is float else kind.__name__}")
    return value


def typed(record: dict, key: str, kind: type) -> Any:
    if not isinstance(record, dict) or key not in record:
        raise ValueError(f"the space record has no {key!r}")
    return checked(record[key], kind, key)


def ints(record: dict, key: str) -> tuple[int, ...]:
    return tuple(checked(v, int, key) for v in typed(record, key, list))


def action_dtype_name(value: Any) -> str:
    if value in ("", "float16", "float64", "int8", "int16", "int32", "uint8", "uint16", "uint32", "uint64"):
        return value
    raise ValueError(f"env_action_dtype is {value!r}, not a numpy float or integer dtype name")  # a crafted file


def pairs(value: Any) -> list:
    if not isinstance(value, list) or not all(isinstance(p, list) and len(p) == 2 for p in value):
        raise ValueError("parts is not a list of [key, space] pairs")
    return value


def optional_ints(record: dict, key: str) -> tuple[int, ...] | None:
    """``ints`` of an entry that may be None or missing (a record written before the entry existed): None."""
    value = record.get(key)
    return None if value is None else tuple(checked(v, int, key) for v in checked(value, list, key))
