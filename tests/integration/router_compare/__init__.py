"""The router comparison benchmark (issue 41, item 5): every fault of the container tier and the multi-host
tier's host faults, each run once behind smg 1.13.0 with the units exactly as pdserve renders them and once
behind sglang-router 0.3.2 (a drop-in over the rendered router unit) in front of the same workers, in one run
on one machine. Run it with `python -m tests.integration.router_compare` (see its --help); it prints one
table per tier with both routers side by side and writes a JSON record. Not a test: nothing here is
collected by pytest (tests/unit/test_router_compare.py tests its pure parts).
"""
