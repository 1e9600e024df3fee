{
  description = "pdserve: SGLang prefill/decode disaggregated serving on one GPU host, and the proof that it works";

  inputs = {
    nixpkgs.url = "github:nixos/nixpkgs/nixos-unstable";

    pyproject-nix = {
      url = "github:nix-community/pyproject.nix";
      inputs.nixpkgs.follows = "nixpkgs";
    };

    uv2nix = {
      url = "github:pyproject-nix/uv2nix";
      inputs.pyproject-nix.follows = "pyproject-nix";
      inputs.nixpkgs.follows = "nixpkgs";
    };

    pyproject-build-systems = {
      url = "github:pyproject-nix/build-system-pkgs";
      inputs.pyproject-nix.follows = "pyproject-nix";
      inputs.uv2nix.follows = "uv2nix";
      inputs.nixpkgs.follows = "nixpkgs";
    };
  };

  outputs =
    {
      self,
      nixpkgs,
      pyproject-nix,
      uv2nix,
      pyproject-build-systems,
    }:
    let
      system = "x86_64-linux";
      inherit (nixpkgs) lib;

      # The one nixpkgs configuration: CUDA on, for the gpu-host's RTX PRO 6000 Blackwell (sm_120a)
      # only. The kernels (tested on H200, sm_90a) do not read cudaCapabilities: kernels/build.sh
      # passes its own -gencode for sm_90a and sm_120a, so their derivation is the same with or
      # without "9.0a" here (evaluated: same drvPath). Architecture-specific capabilities cannot be
      # built with forward compatibility.
      nixpkgsConfig = {
        cudaSupport = true;
        cudaCapabilities = [ "12.0a" ];
        cudaForwardCompat = false;
        # The CUDA licences named in the nixpkgs manual's CUDA chapter, the NVIDIA production driver
        # and its persistence daemon, and redistributable firmware (which a generated
        # hardware-configuration.nix enables) for the gpu-host; nothing else unfree.
        allowUnfreePredicate =
          package:
          builtins.elem (lib.getName package) [
            "nvidia-x11"
            "nvidia-persistenced"
          ]
          || builtins.all (
            license:
            license.free
            || builtins.elem license.shortName [
              "CUDA EULA"
              "cuDNN EULA"
              "cuSPARSELt EULA"
              "cuTENSOR EULA"
              "NVidia OptiX EULA"
              "unfreeRedistributableFirmware"
            ]
          ) (lib.toList package.meta.license);
      };

      pkgs = import nixpkgs {
        inherit system;
        config = nixpkgsConfig;
        overlays = [ self.overlays.default ];
      };

      # pdserve's Python set, built from the committed uv.lock.
      workspace = uv2nix.lib.workspace.loadWorkspace { workspaceRoot = ./.; };

      # Only what the wheel build reads, so editing tests or kernels does not rebuild pdserve.
      pdserveSource = lib.fileset.toSource {
        root = ./.;
        fileset = lib.fileset.unions [
          ./pyproject.toml
          ./README.md
          ./pkg/pdserve
        ];
      };

      # nvidia-ml-py loads libnvidia-ml.so.1 by bare name; on NixOS the driver's libraries live in
      # addDriverRunpath's driverLink (/run/opengl-driver/lib), which no loader path names.
      nvmlOverlay =
        driverLink: final: prev:
        lib.optionalAttrs (prev ? nvidia-ml-py) {
          nvidia-ml-py = prev.nvidia-ml-py.overrideAttrs (old: {
            postInstall = (old.postInstall or "") + ''
              substituteInPlace $out/${final.python.sitePackages}/pynvml.py \
                --replace-fail 'CDLL("libnvidia-ml.so.1")' \
                  'CDLL("${driverLink}/lib/libnvidia-ml.so.1")'
            '';
          });
        };

      pythonFor =
        final:
        (final.callPackage pyproject-nix.build.packages {
          python = final.python312;
        }).overrideScope
          (
            lib.composeManyExtensions [
              pyproject-build-systems.overlays.wheel
              (workspace.mkPyprojectOverlay { sourcePreference = "wheel"; })
              (nvmlOverlay final.addDriverRunpath.driverLink)
              (_: prev: {
                pdserve = prev.pdserve.overrideAttrs { src = pdserveSource; };
              })
            ]
          );

      sglangFor =
        final:
        import ./pkg/sglang-env {
          inherit (final) lib;
          pkgs = final;
          python = final.python312;
          inherit pyproject-nix uv2nix pyproject-build-systems;
          extraOverlays = [ (nvmlOverlay final.addDriverRunpath.driverLink) ];
        };

      pythonSet = pythonFor pkgs;
      sglang = sglangFor pkgs;

      gpuHost = self.nixosConfigurations.gpu-host;

      hostSystem =
        configuration:
        lib.nixosSystem {
          modules = [
            # The flake's one pkgs (CUDA configuration and overlay included); NixOS may not alter it.
            nixpkgs.nixosModules.readOnlyPkgs
            { nixpkgs.pkgs = pkgs; }
            self.nixosModules.default
            configuration
          ];
        };

      # The multi-host examples: one deployment file each (hosts/<example>/deployment.toml) and, for every
      # [hosts.<host>] in it, hosts/<example>/<host>/configuration.nix, evaluated as
      # nixosConfigurations.<example>-<host> (the examples are alternatives and share host names).
      exampleHosts =
        example:
        lib.mapAttrs' (
          host: _:
          lib.nameValuePair "${example}-${host}" (hostSystem ./hosts/${example}/${host}/configuration.nix)
        ) (lib.importTOML ./hosts/${example}/deployment.toml).hosts;

      formatter = pkgs.treefmt.withConfig {
        runtimeInputs = [ pkgs.nixfmt ];
        settings = {
          on-unmatched = "info";
          tree-root-file = "flake.nix";
          formatter.nixfmt = {
            command = "nixfmt";
            includes = [ "*.nix" ];
          };
        };
      };

      # The development environment: pdserve installed editable from $REPO_ROOT, with its test group.
      editablePythonSet = pythonSet.overrideScope (
        lib.composeManyExtensions [
          (workspace.mkEditablePyprojectOverlay { root = "$REPO_ROOT"; })
          (final: prev: {
            pdserve = prev.pdserve.overrideAttrs (old: {
              # An editable build needs only the metadata and the package's location.
              src = lib.fileset.toSource {
                root = ./.;
                fileset = lib.fileset.unions [
                  ./pyproject.toml
                  ./README.md
                  ./pkg/pdserve/__init__.py
                ];
              };
              # hatchling asks for `editables` when building an editable wheel (PEP 660); pip and uv
              # install it on the fly, Nix needs it declared.
              nativeBuildInputs = old.nativeBuildInputs ++ final.resolveBuildSystem { editables = [ ]; };
            });
          })
        ]
      );
    in
    {
      overlays.default = final: prev: {
        # Every CUDA consumer in this nixpkgs uses CUDA 13.0, the toolkit the kernels are built with.
        cudaPackages = final.cudaPackages_13_0;

        pdserve =
          let
            set = pythonFor final;
            inherit (final.callPackages pyproject-nix.build.util { }) mkApplication;
          in
          mkApplication {
            venv = set.mkVirtualEnv "pdserve-env" workspace.deps.default;
            package = set.pdserve;
          };

        pdserve-sglang-env = (sglangFor final).env;

        pdserve-kernels = final.callPackage ./kernels { };
      };

      packages.${system} = {
        inherit (pkgs) pdserve;
        sglang-env = pkgs.pdserve-sglang-env;
        kernels = pkgs.pdserve-kernels;
        default = pkgs.pdserve;
      };

      apps.${system}.verify = {
        type = "app";
        meta.description = "Check the running gpu-host deployment end to end (pdserve verify)";
        program = lib.getExe (
          pkgs.writeShellApplication {
            name = "pdserve-verify";
            # The deployment exactly as the gpu-host's units read it (apiKeyFile included).
            text = ''
              exec ${pkgs.pdserve}/bin/pdserve verify \
                -c ${gpuHost.config.services.pdserve.deployments.dsv4.configFile} "$@"
            '';
          }
        );
      };

      nixosModules.default = ./nixos-modules/pdserve.nix;

      # The reference host, and one system per host of each multi-host example: the host names are the
      # `[hosts]` of the example's deployment file, so the flake lists exactly the hosts it places servers on.
      nixosConfigurations = {
        gpu-host = hostSystem ./hosts/gpu-host/configuration.nix;
      }
      // exampleHosts "two-host"
      // exampleHosts "four-host";

      devShells.${system}.default = pkgs.mkShell {
        packages = [
          (editablePythonSet.mkVirtualEnv "pdserve-dev-env" workspace.deps.all)
          pkgs.uv
          pkgs.cudaPackages.cuda_nvcc
          pkgs.cudaPackages.cuda_cudart
          pkgs.numactl
          pkgs.nixfmt
          formatter
        ];
        env = {
          # uv only locks here (uv lock); Nix owns the environment.
          UV_NO_SYNC = "1";
          UV_PYTHON = editablePythonSet.python.interpreter;
          UV_PYTHON_DOWNLOADS = "never";
        };
        shellHook = ''
          unset PYTHONPATH
          export REPO_ROOT=$(git rev-parse --show-toplevel)
        '';
      };

      # GPU-free checks. Kernels and the GPU test tier need a GPU and stay out of here.
      checks.${system} = {
        pytest =
          let
            testEnv = pythonSet.mkVirtualEnv "pdserve-test-env" {
              pdserve = [ "test" ];
            };
          in
          pkgs.runCommand "pdserve-pytest"
            {
              src = lib.fileset.toSource {
                root = ./.;
                fileset = lib.fileset.unions [
                  ./pyproject.toml
                  ./pkg/pdserve
                  ./tests
                ];
              };
              nativeBuildInputs = [ testEnv ];
            }
            ''
              cp -r $src source
              chmod -R u+w source
              cd source
              export HOME=$TMPDIR
              pytest -p no:cacheprovider tests/unit
              touch $out
            '';

        treefmt =
          pkgs.runCommand "pdserve-treefmt"
            {
              nativeBuildInputs = [ formatter ];
            }
            ''
              export HOME=$TMPDIR
              cp -r ${self} source
              chmod -R u+w source
              cd source
              treefmt --fail-on-change
              touch $out
            '';

        # Evaluates the whole gpu-host system (every module, option and assertion) without building
        # it: building would fetch the NVIDIA driver and the CUDA wheels.
        gpu-host-eval = pkgs.writeText "gpu-host-toplevel-drv" (
          builtins.unsafeDiscardStringContext gpuHost.config.system.build.toplevel.drvPath
        );

        # The same for every host of the multi-host examples (nixosConfigurations.<example>-<host>).
        multi-host-eval = pkgs.writeText "multi-host-toplevel-drvs" (
          lib.concatMapStringsSep "\n" (
            name:
            "${name} ${builtins.unsafeDiscardStringContext self.nixosConfigurations.${name}.config.system.build.toplevel.drvPath}"
          ) (lib.attrNames (removeAttrs self.nixosConfigurations [ "gpu-host" ]))
        );

        # The gpu-host's deployment as the module writes it, through `pdserve check`.
        gpu-host-settings = gpuHost.config.services.pdserve.deployments.dsv4.configFile;

        vm-test = import ./tests/nix/vm-test.nix {
          inherit pkgs lib;
          inherit (pkgs) pdserve;
          routerEnv = sglang.routerEnv;
        };
      };

      formatter.${system} = formatter;
    };
}
