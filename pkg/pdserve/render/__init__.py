"""From a deployment to what runs: argv, environment and NUMA binding per role (argv), the tool paths
(toolchain), the unit files (units), the limits a rendered line must fit (fit) and the plan people read.
Pure functions of pdserve.schema; nothing here reads the host except finding tools on PATH."""
