# pdserve's CUDA kernels: one fatbin per kernel (sm_90a + sm_120a cubins) and its metadata (<module>.json:
# kernel names, threads, shared memory, parameter-struct layout; the launcher reads it) built with exactly the
# flags of kernels/build.sh (the build script is what runs here), plus the ctypes launcher package with both
# installed next to it, where the launcher looks first.
#
#   packages.kernels = pkgs.callPackage ./kernels { };
#
# The SGLang environment does not take the package from here: SGLang finds the plugin through a
# distribution's entry points, so pkg/sglang-env/kernels.nix builds kernels/python as one (its own build
# backend, so its dist-info and entry_points.txt) with this derivation's fatbins and metadata inside, from
# share/pdserve-kernels/.
#
# Builds need no GPU. The output is bit-identical for a given nvcc (tests/kernels checks two build
# directories against each other); sm_120a needs CUDA >= 12.8, the flags were checked with nvcc 13.0.
{
  lib,
  cudaPackages,
}:

cudaPackages.backendStdenv.mkDerivation {
  pname = "pdserve-kernels";
  version = "0.1.0";

  src = lib.fileset.toSource {
    root = ./.;
    fileset = lib.fileset.unions [
      ./build.sh
      ./kernel_metadata.cpp
      ./common
      ./dsa_indexer
      ./sparse_mla_decode
      ./python
    ];
  };

  # nvcc drives the host compiler of backendStdenv (a gcc version nvcc supports) for preprocessing, and
  # compiles the host-only metadata program (kernel_metadata.cpp) with it.
  nativeBuildInputs = [ cudaPackages.cuda_nvcc ];
  buildInputs = [
    cudaPackages.cuda_cudart # cuda_runtime.h, which nvcc includes implicitly
    cudaPackages.cccl # CUB and libcu++ headers (nixpkgs renamed cuda_cccl to cccl)
  ];

  dontConfigure = true;

  buildPhase = ''
    runHook preBuild
    NVCC=nvcc bash ./build.sh "$PWD/out"
    runHook postBuild
  '';

  installPhase = ''
    runHook preInstall
    mkdir -p "$out/lib/pdserve-kernels"
    cp -r python/pdserve_kernels "$out/lib/pdserve-kernels/"
    for k in dsa_indexer sparse_mla_decode; do
      for f in $k.fatbin $k.json; do
        install -Dm444 out/$f "$out/share/pdserve-kernels/$f"
        install -m444 out/$f "$out/lib/pdserve-kernels/pdserve_kernels/$f"
      done
    done
    runHook postInstall
  '';

  passthru.pythonPath = "lib/pdserve-kernels";

  meta = {
    description = "DSA lightning indexer with fused exact top-k and sparse MLA decode (sm_90a, sm_120a), with a ctypes launcher";
    license = lib.licenses.mit;
    platforms = [ "x86_64-linux" ];
  };
}
