import sys

from nebula_mq.cli import main

sys.exit(main())
