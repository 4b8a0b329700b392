"""`python -m gpuledger.node_agent`: the node agent's entry point (the DaemonSet runs
`gpuledger node-agent`)."""

import sys

from gpuledger.node_agent.agent import main

raise SystemExit(main(sys.argv[1:]))
