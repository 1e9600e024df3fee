"""`pdserve check`: a deployment against the pinned SGLang and router argument parsers (parsers) and,
on the target host, against the host itself (host); run ties them together."""
