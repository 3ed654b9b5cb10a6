# Put this directory first on PYTHONPATH to run as if MuJoCo were not installed: importing it fails as a
# missing package does.
raise ModuleNotFoundError("No module named 'mujoco'", name="mujoco")
