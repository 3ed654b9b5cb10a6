"""``rltrain-eval``: evaluate a trained policy from a checkpoint or run dir (the episodes: trainers/episodes.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rltrain.errors import ConfigError

DEFAULT_EPISODES = 10


def main(argv: list[str] | None = None) -> int:
    """``rltrain-eval <checkpoint or run dir> [--episodes N] [--stochastic] [--video] [--seed S] [--allow-import]``."""
    p = argparse.ArgumentParser(prog="rltrain-eval", description="Evaluate a trained rltrain policy.")
    p.add_argument("path", help="a checkpoint file (.pt) or a run directory (its best, final or latest checkpoint)")
    p.add_argument("--episodes", type=int, default=None,
                   help=f"episodes to run (default {DEFAULT_EPISODES}; a checkpoint whose env is stepped by importing "
                        "its module runs none unless --allow-import: the policy is then shown, not evaluated)")
    p.add_argument("--stochastic", action="store_true", help="sample actions instead of taking the mode")
    p.add_argument("--video", action="store_true", help="record every episode to <run dir>/videos (needs moviepy)")
    p.add_argument("--seed", type=int, default=None, help="eval seed base (default: the run's eval seed)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--allow-import", action="store_true",
                   help="let a module named in the checkpoint (env.id module:Attr, to step the env; model.imports) "
                        "be imported: that runs code from the checkpoint's author, so only for checkpoints you trust")
    p.add_argument("overrides", nargs="*", metavar="eval.KEY=VALUE",
                   help="the training config's spelling also works: eval.episodes=5 eval.video=true "
                        "eval.deterministic=false")
    args = p.parse_args(argv)
    for item in args.overrides:
        key, _, value = item.partition("=")
        flag = value.strip().lower() in ("1", "true", "yes", "on")
        if key == "eval.episodes" and value.lstrip("-").isdigit():
            args.episodes = int(value)
        elif key == "eval.video":
            args.video = flag
        elif key == "eval.deterministic":
            args.stochastic = not flag
        elif key == "eval.seed" and value.isdigit():
            args.seed = int(value)
        else:
            p.error(f"unknown override {item!r} (valid: eval.episodes=N, eval.video=BOOL, eval.deterministic=BOOL, "
                    "eval.seed=N)")
    if args.video:
        _private_runtime_dir()
    try:
        return _evaluate(args)
    except ConfigError as err:
        print(f"rltrain-eval: error: {err}", file=sys.stderr)
        return 2


def _evaluate(args: argparse.Namespace) -> int:
    import torch

    from rltrain.cli.loading import load_policy, refuse_stepping
    from rltrain.trainers.episodes import evaluate

    if args.episodes is not None and args.episodes <= 0:
        raise ConfigError(f"--episodes={args.episodes} must be > 0")
    loaded = load_policy(Path(args.path), device=args.device, allow_import=args.allow_import)
    if loaded.step_imports and args.episodes is None and not args.video:
        # nothing asked that steps the env: show the policy that loaded, and how to evaluate it
        spec = loaded.spec
        print(f"checkpoint: {loaded.checkpoint}")
        params = sum(p.numel() for p in loaded.policy.parameters())
        print(f"policy: algo={loaded.config['algo']['_target_'].rpartition('.')[2]}  env.id={spec.env_id}  "
              f"observation {spec.observation.name}  action {spec.describe()}  {params:,} parameters")
        print(f"episodes: none run: stepping the env imports the module of {loaded.step_imports[0]}, which runs its "
              "code; pass --allow-import (and --episodes N) to evaluate it")
        return 0
    refuse_stepping(loaded)
    episodes = args.episodes or DEFAULT_EPISODES
    video_dir = loaded.checkpoint.parent.parent / "videos" if args.video else None
    seed = loaded.eval_seed if args.seed is None else args.seed
    rets = evaluate(loaded.policy, loaded.env.make, episodes=episodes, eval_seed=seed,
                    deterministic=not args.stochastic, device=torch.device(args.device), video_dir=video_dir,
                    real_scores=loaded.env.real_scores)
    print(f"checkpoint: {loaded.checkpoint}")
    print(f"episodes: {episodes}  mean return: {rets.mean():.2f}  std: {rets.std():.2f}  "
          f"min: {rets.min():.2f}  max: {rets.max():.2f}")
    if video_dir is not None:
        print(f"videos: {video_dir}")
    return 0


def _private_runtime_dir() -> None:
    """Rendering initialises SDL, which prints ``error: XDG_RUNTIME_DIR is invalid or not set`` on headless
    machines (and the run still succeeds): give the render process a private one when none is set."""
    import os
    import tempfile

    current = os.environ.get("XDG_RUNTIME_DIR")
    if not current or not os.path.isdir(current):
        os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="rltrain-xdg-")  # mode 0700, as XDG requires


if __name__ == "__main__":
    sys.exit(main())
