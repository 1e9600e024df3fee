# SGLang's serving environment, built with uv2nix from ./uv.lock (only wheels: the lock has no
# sdist-only package), and pdserve's kernels as a Python distribution (./kernels.nix). The flake calls
# this with its pinned inputs; the result's `env` is packages.sglang-env, whose bin/python the units run.
{
  lib,
  pkgs,
  python,
  pyproject-nix,
  uv2nix,
  pyproject-build-systems,
  # Overlays shared with pdserve's own Python set (e.g. the NVML library lookup).
  extraOverlays ? [ ],
  # pdserve's kernels (kernels/default.nix: the fatbins, built with CUDA). The flake's pkgs has its
  # overlay (CUDA 13.0), so this is packages.kernels itself.
  kernels ? pkgs.callPackage ../../kernels { },
}:
let
  workspace = uv2nix.lib.workspace.loadWorkspace { workspaceRoot = ./.; };

  lockedPackages = (lib.importTOML ./uv.lock).package;
  lockedNames = lib.unique (map (package: package.name) lockedPackages);
  # The lock's own dependency lists (a name may be locked twice, for different markers: either
  # entry names the same wheels as far as which libraries are needed).
  lockedByName = lib.listToAttrs (map (package: lib.nameValuePair package.name package) lockedPackages);

  # Wheels that ship shared libraries other wheels link against: NVIDIA's CUDA libraries and torch
  # (sglang-kernel and NIXL's torch plugin link libtorch and libc10).
  isLibraryWheel = name: lib.hasPrefix "nvidia-" name || name == "torch";

  # A dependency is a name with the extras asked of it; an extra's own dependencies come from the
  # package's optional-dependencies (torch reaches the CUDA libraries through cuda-toolkit's extras).
  # Read from uv.lock, not from the packages' passthru: the overlay below decides its attribute
  # names from this closure, and names that depend on the package set's values recurse forever
  # (evaluation showed it: uv2nix's overlay builds every package with `final.callPackage`).
  dependenciesOf =
    { name, extras, ... }:
    let
      locked = lockedByName.${name} or { };
      asItems = map (dep: {
        key = "${dep.name}[${lib.concatStringsSep "," (dep.extra or [ ])}]";
        inherit (dep) name;
        extras = dep.extra or [ ];
      });
    in
    asItems (locked.dependencies or [ ])
    ++ lib.concatMap (extra: asItems (locked.optional-dependencies.${extra} or [ ])) extras;

  closure =
    name:
    lib.unique (
      map (item: item.name) (
        builtins.genericClosure {
          startSet = dependenciesOf {
            inherit name;
            extras = [ ];
          };
          operator = dependenciesOf;
        }
      )
    );

  # pyproject.nix patches every wheel with autoPatchelfHook, which only searches the package itself
  # and its buildInputs. The CUDA wheels find each other through RUNPATHs relative to one shared
  # site-packages, which separate store paths do not have, so each wheel gets the library wheels of
  # its (transitive, locked) dependencies as buildInputs, and the driver's directory as a runpath.
  cudaWheels =
    final: prev:
    let
      libraryDependencies = name: lib.filter (dep: isLibraryWheel dep && prev ? ${dep}) (closure name);
      needsCuda = name: isLibraryWheel name || libraryDependencies name != [ ];
      fixup =
        name:
        prev.${name}.overrideAttrs (old: {
          nativeBuildInputs = (old.nativeBuildInputs or [ ]) ++ [ pkgs.autoAddDriverRunpath ];
          buildInputs = (old.buildInputs or [ ]) ++ map (dep: final.${dep}) (libraryDependencies name);
          # The driver's libraries are not in any wheel; they come from
          # /run/opengl-driver/lib at run time (the runpath autoAddDriverRunpath adds).
          autoPatchelfIgnoreMissingDeps = (old.autoPatchelfIgnoreMissingDeps or [ ]) ++ [
            "libcuda.so.1"
            "libnvidia-ml.so.1"
          ];
        });
    in
    lib.genAttrs (lib.filter (name: prev ? ${name} && needsCuda name) lockedNames) fixup;

  pythonSet =
    (pkgs.callPackage pyproject-nix.build.packages {
      inherit python;
    }).overrideScope
      (
        lib.composeManyExtensions (
          [
            pyproject-build-systems.overlays.wheel
            (workspace.mkPyprojectOverlay { sourcePreference = "wheel"; })
            cudaWheels
            (import ./kernels.nix {
              inherit
                lib
                pyproject-nix
                python
                kernels
                ;
            })
          ]
          ++ extraOverlays
        )
      );
in
{
  inherit pythonSet workspace;

  # pdserve-sglang-env is a virtual project: its default dependencies are the whole serving stack. With
  # them, pdserve's kernels and their SGLang plugin (./kernels.nix): off until a unit sets
  # PDSERVE_DSA_KERNELS=pdserve (the deployment's attention_kernels).
  env =
    let
      venv = pythonSet.mkVirtualEnv "pdserve-sglang-env" (
        workspace.deps.default // { pdserve-kernels = [ ]; }
      );
    in
    venv.overrideAttrs (old: {
      # What the evaluation tier reads (tests/nix/test_eval.py); no part of the derivation.
      passthru = (old.passthru or { }) // {
        kernelsPackage = pythonSet.pdserve-kernels;
      };
    });

  # Only the router and its dependencies (no torch): the VM test pairs it with the stand-in worker.
  routerEnv = pythonSet.mkVirtualEnv "pdserve-router-env" { smg = [ ]; };
}
