"""`pdserve bench`: how well the deployment serves, measured through its public endpoint.

The load comes from SGLang's own client (`python -m sglang.bench_serving`, run by the SGLang Python the
deployment runs, so the client is pinned with the server). The pure core is here: workloads and their
checks (workload), the client's command line (client_argv), its result read into typed figures
(figures), a sweep's table and the comparison of layouts (table, compare_table), the history file's
change against the last run (history). The edges are thin: the client run (client), the servers'
metrics scrape (kv_transfer), the layouts switched by the cutover (layouts), the plot (plot).
"""
