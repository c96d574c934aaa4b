import sys

from composer_pipeline.cli import main

sys.exit(main())
