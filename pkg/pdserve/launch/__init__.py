"""What the units execute besides SGLang itself. gate: `pdserve wait-ready`, the readiness gate of
ExecStartPost=/ExecStartPre=. keyed_launch and parse_check run inside SGLang's own Python and import
nothing from pdserve (that Python does not have it)."""
