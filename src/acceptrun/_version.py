"""acceptrun's version: the one place it is written (pyproject.toml reads it from here).

It changes with every release; every record file says which one wrote it
(:func:`acceptrun.record.models.stamp`), and provenance.json records it.
"""

__version__ = "0.1.0"
