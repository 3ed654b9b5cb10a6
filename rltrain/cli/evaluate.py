"""``rltrain-eval``: evaluate a trained policy from a checkpoint or run dir (the episodes: trainers/episodes.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rltrain.cli.args import CHECKPOINT_CHOICES, OneLineParser, check_episodes_and_seed, pick_checkpoint
from rltrain.errors import ConfigError, UnknownEnv
from rltrain.run.signals import StopFlag, StopRequested

DEFAULT_EPISODES = 10


def main(argv: list[str] | None = None) -> int:
    """``rltrain-eval <checkpoint or run dir> [--episodes N] [--stochastic] [--video] [--seed S] [--allow-import]``."""
    p = OneLineParser(prog="rltrain-eval", description="Evaluate a trained rltrain policy.")
    p.add_argument("path", help="a checkpoint file (.pt) or a run directory (its checkpoint chosen by --checkpoint)")
    p.add_argument("--checkpoint", choices=CHECKPOINT_CHOICES, default="final",
                   help="for a run directory: final (default; the latest while it has none), best (the best "
                        "periodic evaluation) or latest (the most env steps)")
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
    stop = StopFlag().install()  # a stop signal ends the evaluation at once, in one line
    try:
        return _evaluate(args, stop)
    except UnknownEnv as err:  # this is a new process: an id a notebook or a script registered is not known here
        print(f"rltrain-eval: error: {err}; an env id registered in a notebook or a script is known in that process "
              "only: evaluate there with rltrain.evaluate(path)", file=sys.stderr)
        return 2
    except ConfigError as err:
        print(f"rltrain-eval: error: {err}", file=sys.stderr)
        return 2
    except StopRequested as err:
        print(f"rltrain-eval: stopped ({err.reason}) before the evaluation ended", file=sys.stderr)
        return err.exit_code
    finally:
        stop.uninstall()


def _evaluate(args: argparse.Namespace, stop: StopFlag) -> int:
    import torch

    from rltrain.cli.loading import load_policy, refuse_stepping
    from rltrain.run.process import init_process
    from rltrain.trainers.episodes import evaluate

    check_episodes_and_seed(DEFAULT_EPISODES if args.episodes is None else args.episodes, args.seed)
    if args.video:
        from rltrain.trainers.episodes import headless_sdl

        headless_sdl()  # before the env is built: MuJoCo reads MUJOCO_GL when it is imported
    loaded = load_policy(pick_checkpoint(Path(args.path), args.checkpoint), device=args.device,
                         allow_import=args.allow_import)
    # the threads the run trained with (default 1): more spin against the envs on a busy machine
    init_process(torch_threads=int(loaded.config.get("torch_threads") or 1))
    if loaded.step_imports and args.episodes is None and not args.video:
        # nothing asked that steps the env: show the policy that loaded, and how to evaluate it
        spec = loaded.spec
        print(f"checkpoint: {loaded.checkpoint}")
        if getattr(loaded.policy, "group_list", None) is not None:  # a multi-agent env: each agent and its policy
            # the policies' own parameters, as training counts them: a self-play pool's past versions are copies
            params = sum(p.numel() for p in loaded.policy.groups.parameters())
            algo = algo_of(loaded.config)
            pool = loaded.policy.pool
            kept = f" (and a self-play pool of {pool.size} past versions)" if pool is not None else ""
            print(f"policies: algo={algo}  env.id={spec.env_id}  {len(spec.agents)} agents in "
                  f"{len(loaded.policy.group_list)} policy groups  {params:,} parameters{kept}")
            for agent, s in zip(spec.agents, spec.specs, strict=True):
                print(f"  {agent}: policy {loaded.policy.group_of(agent).name}  observation {s.observation.name}  "
                      f"action {s.describe()}")
        else:
            print(f"policy: {describe_policy(loaded.policy, spec, loaded.config)}")
        print(f"episodes: none run: stepping the env imports the module of {loaded.step_imports[0]}, which runs its "
              "code; pass --allow-import (and --episodes N) to evaluate it")
        return 0
    refuse_stepping(loaded)
    episodes = args.episodes or DEFAULT_EPISODES
    video_dir = loaded.checkpoint.parent.parent / "videos" if args.video else None
    seed = loaded.eval_seed if args.seed is None else args.seed
    mode = "sampled" if args.stochastic else "greedy"  # which the numbers are of: the mode or a draw per step
    with stop.raising("the evaluation"):
        if getattr(loaded.policy, "group_list", None) is not None:  # a multi-agent env's policies (models/agents.py)
            if args.video:
                raise ConfigError("--video records single-agent envs; this checkpoint is a multi-agent env's")
            lines = evaluate_agents_lines(loaded.policy, loaded.env, episodes=episodes, eval_seed=seed,
                                          deterministic=not args.stochastic, device=torch.device(args.device),
                                          eval_steps=loaded.eval_steps)
            lines[0] += f"  actions: {mode}"
            print(f"checkpoint: {loaded.checkpoint}")
            print("\n".join(lines))
            return 0
        successes: list[bool] = []
        rets = evaluate(loaded.policy, loaded.env.make, episodes=episodes, eval_seed=seed,
                        deterministic=not args.stochastic, device=torch.device(args.device), video_dir=video_dir,
                        real_scores=loaded.env.real_scores, successes=successes,
                        max_episode_steps=loaded.eval_steps)
    print(f"checkpoint: {loaded.checkpoint}")
    print(f"episodes: {episodes}  mean return: {rets.mean():.2f}  std: {rets.std():.2f}  "
          f"min: {rets.min():.2f}  max: {rets.max():.2f}"
          + (f"  success rate: {sum(successes) / len(successes):.2f}" if successes else "") + f"  actions: {mode}")
    if video_dir is not None:
        print(f"videos: {video_dir}")
    return 0


def algo_of(config: dict) -> str:
    """The class name of the checkpoint's algorithm (``PPO``); ``?`` for a config that records none."""
    return str((config.get("algo") or {}).get("_target_", "?")).rpartition(".")[2]


def describe_policy(policy, spec, config: dict) -> str:
    """One policy in one line, as ``rltrain-eval`` shows it and ``LoadedPolicy``'s repr: its algorithm, env id,
    spaces and parameter count."""
    params = sum(p.numel() for p in policy.parameters())
    return (f"algo={algo_of(config)}  env.id={spec.env_id}  observation {spec.observation.name}  action "
            f"{spec.describe()}  {params:,} parameters")


def evaluate_agents_lines(policies, env, *, episodes: int, eval_seed: int, deterministic: bool, device,
                          eval_steps: int | None = None) -> list[str]:
    """A multi-agent env's evaluation in words: the mean over agents and each agent's mean return (a constant-sum
    game's marked, with its policies against random legal moves beside); with self-play, the learner against
    random legal moves (win / draw / loss) and against its latest pool version. ``eval_steps``: the run's
    ``eval.max_episode_steps``, where its own evaluation cut an episode."""
    from rltrain.trainers.matches import evaluate_agents, evaluate_match, game_constant, outcomes, step_cap

    common = {"episodes": episodes, "eval_seed": eval_seed, "deterministic": deterministic, "device": device,
              "max_steps": step_cap(eval_steps, env.max_episode_steps)}
    lines, opponents = [], ("random", "latest")
    if policies.pool is None:
        agents = policies.spec.agents
        rets = evaluate_agents(policies, env.make, **common)
        per_agent = "  ".join(f"{a}: {r:.2f}" for a, r in zip(agents, rets.mean(0), strict=True))
        lines = [f"episodes: {episodes}  mean return over agents: {rets.mean():.2f}  std: {rets.mean(1).std():.2f}",
                 f"per agent: {per_agent}"]
        games = [dict(zip(agents, r, strict=True)) for r in rets.tolist()]
        constant = game_constant(games, env.make, policies.spec, seed=eval_seed)
        if constant is None:
            return lines
        # a constant-sum game: the mean over agents is the constant over their number whatever they learnt; each
        # policy against random moves, as the run's own evaluation reports it (final_eval_return)
        share = constant / len(agents)
        lines[0] += ("  (zero-sum: 0 whatever is learnt)" if constant == 0 else
                     f"  (constant-sum {constant:g}: {share:.2f} whatever is learnt)")
        opponents = ("random",)
    else:
        share = 0.0  # self-play: a zero-sum game (cli/multiagent.py checks it)
    for opponent in opponents:
        rets, _ = evaluate_match(policies, env.make, opponent=opponent, **common)
        o = outcomes(rets, share=share)
        lines.append(f"vs {opponent}: episodes: {episodes}  mean return: {rets.mean():.2f}  win {o['win']:.2f}  "
                     f"draw {o['draw']:.2f}  loss {o['loss']:.2f}  (seats alternate)")
    return lines


if __name__ == "__main__":
    sys.exit(main())
