"""`pdserve bench`: how well the deployment serves, measured through its public endpoint.

The load comes from SGLang's own client (`python -m sglang.benchmark.serving`, run by the SGLang Python the
deployment runs, so the client is pinned with the server). The pure core: workloads and their checks
(workload), the client's command line (client_argv), its result read into typed figures (figures), a layout's
sweep (sweep), the tables and the comparison of layouts (table), the history file (history), the order of a
comparison and its way back (layouts). The thin edges: the client's run (client), the servers' metrics
scrape (kv_transfer), the plot (plot). measure runs one layout's sweep point by point; runs puts a whole run
together, on whatever serves or across layouts through the cutover.
"""
