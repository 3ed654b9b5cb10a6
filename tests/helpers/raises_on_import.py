"""An env module whose import fails (a user module with a broken dependency):
env.id=tests.helpers.raises_on_import:Env."""

raise ImportError("libsimulator.so.3: cannot open shared object file")
