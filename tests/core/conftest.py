"""The core's tests resolve strategy names through the registry, which is empty until the built-ins register
(importing gpuledger.strategies does): each test file then runs on its own as it does in the suite."""

import gpuledger.strategies  # noqa: F401
