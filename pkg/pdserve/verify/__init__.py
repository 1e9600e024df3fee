"""`pdserve verify`: prove a running PD deployment works.

Layout: `expect` turns the deployment into what must be observed; `probes/` are the thin side-effect
layer (HTTP, systemd, NVML, /proc and /sys, sockets, the openai client) returning plain observations;
`checks/` are pure functions from observations and expectations to a `CheckResult`; `runner` selects,
times and retries checks; `report` prints the table or the JSON; `command` is the click command.
"""
