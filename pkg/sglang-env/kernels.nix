# pdserve's kernels as a Python distribution of the SGLang environment (an overlay of its package set).
# SGLang loads plugins from the entry points of the distributions on sys.path (group sglang.srt.plugins;
# kernels/python/pyproject.toml names pdserve_kernels.sglang_plugin:load), so the environment needs the
# distribution's dist-info, not only the package directory. It is built by the project's own build backend
# (setuptools, from kernels/python), so the dist-info and its entry_points.txt are the backend's. The fatbins
# and their metadata come from `kernels` (kernels/default.nix, the CUDA build); they are put beside the
# package before the build, where its package-data takes them into the wheel and the launchers look first
# (pdserve_kernels/_driver.py locate_fatbin).
{
  lib,
  pyproject-nix,
  python,
  kernels,
}:
let
  root = ../../kernels/python;
  project = pyproject-nix.lib.project.loadPyproject { projectRoot = root; };
  environ = pyproject-nix.lib.pep508.mkEnviron python;
in
final: _prev: {
  pdserve-kernels = final.callPackage (
    {
      stdenv,
      pyprojectHook,
      resolveBuildSystem,
    }:
    let
      rendered = pyproject-nix.build.lib.renderers.mkDerivation { inherit project environ; } {
        inherit pyprojectHook resolveBuildSystem;
      };
    in
    stdenv.mkDerivation (
      rendered
      // {
        # Only what the wheel build reads (not build_wheel.sh, the wheel build outside Nix).
        src = lib.fileset.toSource {
          inherit root;
          fileset = lib.fileset.unions [
            (root + "/pyproject.toml")
            (root + "/pdserve_kernels")
          ];
        };
        preBuild = ''
          for module in dsa_indexer sparse_mla_decode; do
            for file in $module.fatbin $module.json; do
              install -m444 ${kernels}/share/pdserve-kernels/$file pdserve_kernels/$file
            done
          done
        '';
        passthru = rendered.passthru // {
          inherit kernels;
        };
      }
    )
  ) { };
}
