import sys

from rvqlm.cli import main

sys.exit(main())
