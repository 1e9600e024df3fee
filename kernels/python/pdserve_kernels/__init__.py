"""CUDA kernels for pdserve, loaded as a prebuilt fatbin through the CUDA driver API (no torch C++ extension).

Build the fatbins with ``kernels/build.sh`` (or the Nix derivation ``kernels/default.nix``); the launcher
finds it through ``$PDSERVE_KERNELS_FATBIN``, next to this package, or in ``kernels/build/``.
"""

from .dsa_indexer import DsaIndexer, dsa_indexer_topk
from .sparse_mla_decode import SparseMlaDecode, sparse_mla_decode

__all__ = ["DsaIndexer", "SparseMlaDecode", "dsa_indexer_topk", "sparse_mla_decode"]
