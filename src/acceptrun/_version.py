"""acceptrun's version: the one place it is written (pyproject.toml reads it from here).

It changes with every release; every record file says which one wrote it
(:func:`acceptrun.record.models.stamp`), and provenance.json records it.
"""

import re

__version__ = "0.1.0"

# What a release number looks like, loosely (PEP 440): checked before one read from a record
# or given on the command line goes into a message or an install line.
RELEASE = re.compile(r"^[0-9][0-9A-Za-z.!+_-]{0,63}$")
