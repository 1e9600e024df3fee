"""The only code that reads the host: systemd (systemctl), NVML, /proc and cgroups, sockets, HTTP, the
openai client and credentials. Each probe is bounded by a timeout and returns plain observations
(probes.observations) or raises Unavailable; check, verify and cutover interpret them."""
