"""``rltrain-eval``: evaluate a trained policy from a checkpoint or run dir (the episodes: trainers/episodes.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rltrain.errors import ConfigError


def main(argv: list[str] | None = None) -> int:
    """``rltrain-eval <checkpoint or run dir> [--episodes N] [--stochastic] [--video] [--seed S] [--allow-import]``."""
    p = argparse.ArgumentParser(prog="rltrain-eval", description="Evaluate a trained rltrain policy.")
    p.add_argument("path", help="a checkpoint file (.pt) or a run directory (its best, final or latest checkpoint)")
    p.add_argument("--episodes", type=int, default=10)
    p.add_argument("--stochastic", action="store_true", help="sample actions instead of taking the mode")
    p.add_argument("--video", action="store_true", help="record every episode to <run dir>/videos (needs moviepy)")
    p.add_argument("--seed", type=int, default=None, help="eval seed base (default: the run's eval seed)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--allow-import", action="store_true",
                   help="let an env.id import path (module:Attr) stored in the checkpoint import its module: "
                        "that runs code from the checkpoint's author, so only for checkpoints you trust")
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
        import torch

        from rltrain.cli.build import env_factory
        from rltrain.cli.loading import load_policy
        from rltrain.trainers.episodes import evaluate

        policy, cfg, ckpt_path, eval_seed = load_policy(Path(args.path), device=args.device,
                                                          allow_import=args.allow_import)
        if args.episodes <= 0:
            raise ConfigError(f"--episodes={args.episodes} must be > 0")
        video_dir = ckpt_path.parent.parent / "videos" if args.video else None
        env = env_factory(cfg["env"], cfg.get("algo"))
        seed = eval_seed if args.seed is None else args.seed
        if getattr(policy, "group_list", None) is not None:  # a multi-agent env's policies (models/agents.py)
            if args.video:
                raise ConfigError("--video records single-agent envs; this checkpoint is a multi-agent env's")
            lines = evaluate_agents_lines(policy, env, episodes=args.episodes, eval_seed=seed,
                                          deterministic=not args.stochastic, device=torch.device(args.device))
            print(f"checkpoint: {ckpt_path}")
            print("\n".join(lines))
            return 0
        rets = evaluate(policy, env.make, episodes=args.episodes, eval_seed=seed,
                        deterministic=not args.stochastic, device=torch.device(args.device), video_dir=video_dir,
                        real_scores=env.real_scores)
    except ConfigError as err:
        print(f"rltrain-eval: error: {err}", file=sys.stderr)
        return 2
    print(f"checkpoint: {ckpt_path}")
    print(f"episodes: {args.episodes}  mean return: {rets.mean():.2f}  std: {rets.std():.2f}  "
          f"min: {rets.min():.2f}  max: {rets.max():.2f}")
    if video_dir is not None:
        print(f"videos: {video_dir}")
    return 0


def evaluate_agents_lines(policies, env, *, episodes: int, eval_seed: int, deterministic: bool, device) -> list[str]:
    """A multi-agent env's evaluation in words: the mean over agents and each agent's mean return; with
    self-play, the learner against random legal moves (win / draw / loss) and against its latest pool version."""
    from rltrain.trainers.matches import evaluate_agents, evaluate_match, outcomes

    common = {"episodes": episodes, "eval_seed": eval_seed, "deterministic": deterministic, "device": device,
              "max_steps": env.max_episode_steps}
    if policies.pool is None:
        rets = evaluate_agents(policies, env.make, **common)
        per_agent = "  ".join(f"{a}: {r:.2f}" for a, r in zip(policies.spec.agents, rets.mean(0), strict=True))
        return [f"episodes: {episodes}  mean return over agents: {rets.mean():.2f}  std: {rets.mean(1).std():.2f}",
                f"per agent: {per_agent}"]
    lines = []
    for opponent in ("random", "latest"):
        rets, _ = evaluate_match(policies, env.make, opponent=opponent, **common)
        o = outcomes(rets)
        lines.append(f"vs {opponent}: episodes: {episodes}  mean return: {rets.mean():.2f}  win {o['win']:.2f}  "
                     f"draw {o['draw']:.2f}  loss {o['loss']:.2f}  (seats alternate)")
    return lines


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
