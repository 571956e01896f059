import sys

from acceptrun.cli.main import main

sys.exit(main())
