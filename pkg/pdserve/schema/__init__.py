"""The deployment schema, the lowest layer: the pydantic model, its field and cross-field rules, the
problem lines they produce, the pinned versions, reading TOML/JSON, and the embedded reference profile.
Pure: it imports nothing else of pdserve and never reads the host."""
