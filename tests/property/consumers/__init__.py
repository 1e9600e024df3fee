"""The real consumers of pdserve's outputs, run in batches: systemd, the shell, nftables, promtool."""
