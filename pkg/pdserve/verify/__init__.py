"""`pdserve verify`: prove a running PD deployment works.

Layout: `expect` turns the deployment into what must be observed; `context` is what a run reads the host
through (pdserve.probes, bounded by the run's options) and `registry` names every check and gathers its
observations; `checks/` are pure functions from observations and expectations to a `CheckResult`;
`runner` selects, times and retries checks; `report` builds the table or the JSON (the click command is
pdserve.cli.verify).
"""
