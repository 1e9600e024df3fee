"""The `pdserve` command line, the thin adapter over everything else: one -c option, one way to load
a deployment, one exit-code table (cli.exits)."""
