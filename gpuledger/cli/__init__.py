"""The operator commands (`gpuledger status|nodes|workloads|submit|strategy|watch|health|generate-template`).

One module per command, each exposing `main(argv) -> int` for the dispatcher in `main`; shared flags, output
and exit codes live in gpuledger.cli.common. Commands only read the API, or write through it.
"""
