"""docs/contributing.md "An encoder or an action distribution": the worked example (a registered encoder) runs
as the page shows it, from the command line, in-process and in worker processes that must register it
themselves."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rltrain.errors import ConfigError
from rltrain.run.checkpoint import load_checkpoint

PAGE = Path(__file__).resolve().parent.parent / "docs" / "contributing.md"


def example_section() -> str:
    return PAGE.read_text().split("### An encoder or an action distribution", 1)[1].split("\n## ", 1)[0]


def example_module() -> str:
    """The ``my_encoders.py`` code block of the page's "An encoder or an action distribution" section."""
    blocks = re.findall(r"```python\n(.*?)```", example_section(), re.S)
    module = [b for b in blocks if b.startswith("# my_encoders.py")]
    assert len(module) == 1, "the section has one '# my_encoders.py' block"
    return module[0]


def example_overrides() -> list[str]:
    """The overrides of the section's ``rltrain`` command (tests/test_docs.py only parses that block: it is run
    here, as written plus the smoke budget)."""
    (block,) = re.findall(r"```bash\n(.*?)```", example_section(), re.S)
    argv = shlex.split(block, comments=True)
    assert argv[0] == "rltrain" and "model.imports=[my_encoders]" in argv, argv
    return argv[1:]


@pytest.mark.parametrize("trainer", ["sequential", "subprocess_actors"])
def test_readme_encoder_example_trains_from_the_cli(tmp_path, trainer):
    (tmp_path / "my_encoders.py").write_text(example_module())
    run_dir = tmp_path / "run"
    extra = ["algo=impala", "trainer.num_actors=1"] if trainer == "subprocess_actors" else []
    # the console script, as a user runs it: the launch directory is not on its sys.path by itself
    rltrain = str(Path(sys.executable).with_name("rltrain"))
    cmd = [rltrain, *example_overrides(), "debug=smoke", "logger=quiet", f"trainer={trainer}", *extra,
           f"hydra.run.dir={run_dir}"]
    # the workers of subprocess_actors are started by spawn / forkserver: they import my_encoders themselves
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
    state, _ = load_checkpoint(run_dir / "checkpoints" / "final.pt", key="checkpoint")
    norms = [k for k in state["algo"]["policy"] if k.startswith("torso.actor_encoder.net.") and "weight" in k]
    assert norms, "the policy's actor encoder is the registered one"


def test_registered_encoder_is_used_in_process_and_unknown_names_are_refused(tmp_path, monkeypatch):
    from rltrain.data.structs import EnvSpec
    from rltrain.models import encoders
    from rltrain.models.factory import ModelSettings, build

    (tmp_path / "my_encoders.py").write_text(example_module())
    monkeypatch.syspath_prepend(str(tmp_path))
    # the registration lasts for this test only: a fresh registry, and the module imported anew
    monkeypatch.setattr(encoders, "REGISTERED", {})
    sys.modules.pop("my_encoders", None)

    spec = EnvSpec("x", (5,), "discrete", (), n_actions=3)
    settings = ModelSettings(imports=("my_encoders",), encoder="layernorm_mlp", hidden_sizes=(16,))
    policy = build(spec, settings, "actor_critic")
    assert type(policy.torso.actor_encoder).__name__ == "LayerNormMLP"
    out = policy.act(torch.zeros(4, 5))
    assert out.action.shape == (4,)
    with pytest.raises(ConfigError, match=r"model.encoder=layernorm_mpl: unknown.*did you mean"):
        ModelSettings(imports=("my_encoders",), encoder="layernorm_mpl")
    with pytest.raises(ConfigError, match=r"model.imports: cannot import 'no_such_module_here'"):
        ModelSettings(imports=("no_such_module_here",))
    sys.modules.pop("my_encoders", None)
