import sys

from acceptrun.cli import main

sys.exit(main())
