#!/usr/bin/env bash
# The tuning build: sparse_mla_decode with the wrong-by-design wg probe kernels (_x1/_x2/_x3: no conversion, no
# wgmma, neither) into OUTDIR (default kernels/build) as sparse_mla_decode_tuning.{fatbin,json}. Same flags as
# the production build (it is kernels/build.sh with TUNING=1); never installed, never picked by the launcher.
# It also holds the experimental kernels and those retired from production (sparse_mla_decode.h).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TUNING=1 exec bash "$here/../build.sh" "$@"
