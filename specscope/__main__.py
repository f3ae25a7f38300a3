import sys

from specscope.cli import main

sys.exit(main())
