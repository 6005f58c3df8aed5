"""`python -m jaxdllm.cli`: the `jaxdllm` command."""

import sys

from jaxdllm.cli import main

sys.exit(main())
