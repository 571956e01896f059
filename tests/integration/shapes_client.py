"""The client shape of tests/shapes_train.py: a script that imports acceptrun (tests only)."""

import runpy
import sys
from pathlib import Path

import acceptrun  # noqa: F401  (the script uses the client API: run.log only)

sys.argv[1:1] = ["--report", "client"]
runpy.run_path(str(Path(__file__).with_name("shapes_train.py")), run_name="__main__")
