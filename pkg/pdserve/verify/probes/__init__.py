"""The side-effect layer: each probe asks the host one thing, with a timeout, and returns an observation."""
