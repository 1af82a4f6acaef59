"""One module per `rvqlm` subcommand; each defines `register(subparsers)`."""
