"""What a run built, in words: per network its encoder (per Dict key: which encoder and its output width), core,
heads and parameter count. The CLI prints it at the start of a run and stores it as ``model.txt`` in the run dir,
so the choices ``model.encoder=auto`` and ``model.shared=auto`` made are never hidden.
"""

from __future__ import annotations

from torch import nn

from rltrain.models.cores import Core
from rltrain.models.encoders import Encoder, FlatInput, MultiInputEncoder
from rltrain.models.layers import TwinMLP


def count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _mlp(seq: nn.Sequential) -> str | None:
    """``Linear + activation`` stacks as ``in -> w1 -> w2 (act)``; None for anything else."""
    linears = [m for m in seq if isinstance(m, nn.Linear)]
    if not linears or any(not isinstance(m, nn.Linear) and next(m.parameters(), None) is not None for m in seq):
        return None
    acts = {type(m).__name__.lower() for m in seq if not isinstance(m, nn.Linear)}
    widths = " -> ".join(str(w) for w in [linears[0].in_features, *(m.out_features for m in linears)])
    return f"MLP {widths}" + (f" ({', '.join(sorted(acts))})" if acts else "")


def _encoder(enc: Encoder, indent: str) -> list[str]:
    if isinstance(enc, FlatInput):
        how = f"one-hot of {enc.n}" if enc.n else "flattened"
        return [f"FlatInput ({how}) -> {enc.out_dim}"]
    head = f"{type(enc).__name__} -> {enc.out_dim} features ({count(enc):,} parameters)"
    if not isinstance(enc, MultiInputEncoder):
        return [head]
    lines = [head]
    for key, part in zip(enc.keys, enc.parts, strict=True):
        sub = _encoder(part, indent + "  ")
        lines.append(f"{indent}  key {key!r}: {sub[0]}")
        lines += sub[1:]
    mlp = _mlp(enc.mlp)
    lines.append(f"{indent}  after concatenation: {mlp or 'none'}")
    return lines


def _walk(module: nn.Module, indent: str, depth: int, path: str, seen: dict[int, str]) -> list[str]:
    """``seen``: id -> where it was shown, for modules two networks share (SAC's critic encoder)."""
    lines: list[str] = []
    for name, child in module.named_children():
        if id(child) in seen and count(child):
            lines.append(f"{indent}{name}: {seen[id(child)]}'s (shared: one set of weights, counted once in the total)")
            continue
        seen[id(child)] = f"{path}.{name}"
        if isinstance(child, Encoder):
            sub = _encoder(child, indent)
            if getattr(module, "detached_encoder", False):  # models/sac_networks.py CriticEncoderActor
                sub[0] += "; the critic's, read detached: its loss trains it, the actor's does not"
            lines += [f"{indent}{name}: {sub[0]}", *sub[1:]]
        elif isinstance(child, Core):
            kind = getattr(child, "kind", type(child).__name__) if child.recurrent else "identity"
            lines.append(f"{indent}{name}: {kind} -> {child.out_dim}" +
                         (f" ({count(child):,} parameters)" if child.recurrent else ""))
        elif isinstance(child, TwinMLP):
            widths = [child.weights[0].shape[1], *(w.shape[2] for w in child.weights[:-1])]
            lines.append(f"{indent}{name}: actor MLP {' -> '.join(map(str, widths))} -> {child.out_dims[0]} and "
                         f"critic MLP (same widths, own weights) -> {child.out_dims[1]} ({child.activation}; "
                         f"{count(child):,} parameters)")
        elif isinstance(child, nn.Linear):
            lines.append(f"{indent}{name}: Linear {child.in_features} -> {child.out_features}")
        elif isinstance(child, nn.Sequential) and _mlp(child):
            lines.append(f"{indent}{name}: {_mlp(child)}")
        elif count(child):
            lines.append(f"{indent}{name}: {type(child).__name__} ({count(child):,} parameters)")
            if depth < 3:
                lines += _walk(child, indent + "  ", depth + 1, f"{path}.{name}", seen)
    if getattr(module, "critic_encoder", 0) is None:
        lines.append(f"{indent}critic: shares the actor's encoder and core (model.shared)")
    return lines


def describe_model(networks: dict[str, nn.Module], notes: list[str] | tuple[str, ...] = ()) -> str:
    """One block of text: each named network (targets, copies of their online networks, left out), then
    ``notes`` (settings inferred from the env), then the total parameter count (a module two networks share,
    shown in full once, counted once)."""
    lines: list[str] = []
    seen: dict[int, str] = {}
    for name, net in networks.items():
        lines.append(f"{name}: {type(net).__name__} ({count(net):,} parameters)")
        lines += _walk(net, "  ", 1, name, seen)
    lines += list(notes)
    unique = {id(p): p.numel() for net in networks.values() for p in net.parameters()}
    lines.append(f"total: {sum(unique.values()):,} parameters")
    return "\n".join(lines)


def networks_of(algo: object) -> dict[str, nn.Module]:
    """An algorithm's trained networks (its ``nn.Module`` attributes; target copies left out), or what its
    ``networks()`` names (a multi-agent algorithm's: one per policy group)."""
    if callable(getattr(algo, "networks", None)):
        return algo.networks()
    return {k: v for k, v in vars(algo).items() if isinstance(v, nn.Module) and "target" not in k}
