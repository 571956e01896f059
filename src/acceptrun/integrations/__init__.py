"""Framework integrations: a framework's own loop and checkpoint files become an accepted run.

* :mod:`acceptrun.integrations.transformers`: ``AcceptrunCallback`` for the Hugging Face
  ``Trainer`` (``pip install acceptrun[transformers]``);
* :mod:`acceptrun.integrations.accelerate`: ``track(accelerator)`` for a plain Accelerate
  loop (``pip install acceptrun[accelerate]``);
* ``acceptrun.integrations._base``: the framework-neutral part they share
  (:class:`~acceptrun.integrations._base.FrameworkRun`).

Importing this package imports no framework: each submodule imports its own.
"""

__all__: list[str] = []
