"""`python -m gpuledger ...`: the same dispatcher as the `gpuledger` console script."""

from gpuledger.cli.main import main

raise SystemExit(main())
