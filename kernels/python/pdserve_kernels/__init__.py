"""CUDA kernels for pdserve, loaded as a prebuilt fatbin through the CUDA driver API (no torch C++ extension).

Build the fatbin with ``kernels/build.sh`` (or the Nix derivation ``kernels/default.nix``); the launcher
finds it through ``$PDSERVE_KERNELS_FATBIN``, next to this package, or in ``kernels/build/``.
"""

from .dsa_indexer import DsaIndexer, dsa_indexer_topk

__all__ = ["DsaIndexer", "dsa_indexer_topk"]
