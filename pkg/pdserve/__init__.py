"""pdserve: deploy an SGLang model as a prefill/decode disaggregated service, and prove it works."""

__version__ = "0.1.0"
