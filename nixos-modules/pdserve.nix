# services.pdserve: a thin adapter from NixOS options to `pdserve`. The deployment schema, its rules
# and the unit files all live in the Python package; this module writes the settings as JSON, has
# `pdserve check` validate them while the system builds, has `pdserve render` write the units, ships
# those with systemd.packages, and adds what only NixOS knows: store paths, users, firewall, boot
# wiring, hardening drop-ins.
{
  config,
  lib,
  pkgs,
  ...
}:
let
  inherit (lib) literalExpression mkOption types;

  cfg = config.services.pdserve;
  json = pkgs.formats.json { };

  isLoopback =
    host:
    lib.elem host [
      "127.0.0.1"
      "::1"
      "localhost"
    ]
    || lib.hasPrefix "127." host;

  unitNames = d: {
    prefill = "sglang-${d.settings.name}-prefill";
    decode = "sglang-${d.settings.name}-decode";
    router = "sglang-${d.settings.name}-router";
    fallback = "sglang-${d.settings.name}";
  };

  deploymentModule =
    { name, config, ... }:
    {
      options = {
        settings = mkOption {
          description = ''
            The deployment, exactly as `pdserve` reads it (`pdserve schema` prints every field; the
            reference is hosts/gpu-host/deployment.toml, which can be read in with
            `builtins.fromTOML (builtins.readFile ./deployment.toml)`). Written to the Nix store as
            JSON and checked with `pdserve check` while the system builds. It is world-readable:
            put secrets in files (see `apiKeyFile`), never here.
          '';
          example = literalExpression ''
            builtins.fromTOML (builtins.readFile ./deployment.toml)
          '';
          type = types.submodule {
            freeformType = json.type;
            # Only the keys this module reads are typed here; pdserve's schema types the rest.
            options = {
              name = mkOption {
                type = types.strMatching "[a-z0-9][a-z0-9-]{0,40}";
                default = name;
                defaultText = literalExpression "<the attribute name under services.pdserve.deployments>";
                description = "Unit names derive from it: sglang-<name>-prefill, -decode, -router and the fallback sglang-<name>.";
              };
              prefill.port = mkOption {
                type = types.port;
                example = 30000;
                description = "Port of the prefill server (listens on loopback).";
              };
              decode.port = mkOption {
                type = types.port;
                example = 30002;
                description = "Port of the decode server (listens on loopback).";
              };
              router = {
                host = mkOption {
                  type = types.str;
                  default = "127.0.0.1";
                  example = "0.0.0.0";
                  description = "Address the router (the only public endpoint) listens on.";
                };
                port = mkOption {
                  type = types.port;
                  default = 30001;
                  description = "Port of the router; `openFirewall` opens this one and no other.";
                };
              };
              systemd = {
                user = mkOption {
                  type = types.str;
                  default = "pdserve";
                  description = "User the SGLang servers and the router run as.";
                };
                group = mkOption {
                  type = types.str;
                  default = "pdserve";
                  description = "Group the SGLang servers and the router run as.";
                };
                wanted_by = mkOption {
                  type = types.str;
                  default = "multi-user.target";
                  description = "Target that pulls in the prefill, decode and router units at boot.";
                };
              };
            };
          };
        };

        openFirewall = mkOption {
          type = types.bool;
          default = false;
          description = ''
            Open the router's port (`settings.router.port`) in the firewall. The worker ports stay
            closed: prefill and decode listen on loopback and bypass the router's API key.
          '';
        };

        apiKeyFile = mkOption {
          type = types.nullOr types.str;
          default = null;
          example = "/run/keys/pdserve-api-key";
          description = ''
            Absolute path of a file holding the API key clients must send to the router. It is
            outside the Nix store (a string, not a Nix path, so it is never copied there); the
            router reads it through systemd's `LoadCredential=`. Sets `settings.router.api_key_file`.
          '';
        };

        configFile = mkOption {
          type = types.package;
          readOnly = true;
          defaultText = literalExpression "<settings as JSON in the Nix store, checked by pdserve check>";
          description = ''
            The deployment as the units read it: `settings` written as JSON and validated by
            `pdserve check` at build time; `nix run .#verify` passes it to `pdserve verify -c`.
          '';
        };
      };

      config = {
        settings.router = lib.mkIf (config.apiKeyFile != null) {
          api_key_file = config.apiKeyFile;
        };
        configFile = checkedSettings config;
      };
    };

  deployments = lib.attrValues cfg.deployments;

  # Build-time validation, as nixpkgs' Prometheus module runs promtool: an invalid deployment fails
  # the build with pdserve's own messages (field, bad value, fix). Host checks (GPUs, NUMA nodes,
  # files) and SGLang's parsers need the real machine: `nix run .#verify` runs those there.
  checkedSettings =
    d:
    let
      file = json.generate "pdserve-${d.settings.name}.json" d.settings;
    in
    pkgs.runCommand "pdserve-${d.settings.name}.json"
      {
        nativeBuildInputs = [ cfg.package ];
      }
      ''
        ln -s ${file} $out
        pdserve check --no-host --no-parsers -c $out
      '';

  renderedUnits =
    d:
    let
      settingsFile = d.configFile;
    in
    pkgs.runCommand "pdserve-${d.settings.name}-units"
      {
        nativeBuildInputs = [ cfg.package ];
      }
      ''
        pdserve render -c ${settingsFile} --out "$TMPDIR/units" \
          --config-path ${settingsFile} \
          --sglang-python ${cfg.sglangPackage}/bin/python \
          --numactl ${pkgs.numactl}/bin/numactl \
          --pdserve ${cfg.package}/bin/pdserve
        mkdir -p $out/lib/systemd/system $out/share/pdserve
        mv "$TMPDIR"/units/*.service $out/lib/systemd/system/
        # The deployment with every default filled in, as the units see it: for reading, not loading.
        mv "$TMPDIR"/units/pdserve-*.json $out/share/pdserve/
      '';

  # Drop-ins on top of the rendered units (which already set NoNewPrivileges, PrivateTmp,
  # ProtectSystem=full, ProtectHome=read-only). The base is ollama's hardening block in nixpkgs.
  hardening = {
    ProtectSystem = "strict"; # StateDirectory/CacheDirectory (HOME, caches) stay writable
    ProtectHome = true;
    CapabilityBoundingSet = [ "" ];
    LockPersonality = true;
    ProtectClock = true;
    ProtectControlGroups = true;
    ProtectHostname = true;
    ProtectKernelLogs = true;
    ProtectKernelModules = true;
    ProtectKernelTunables = true;
    RestrictNamespaces = true;
    RestrictRealtime = true;
    RestrictSUIDSGID = true;
    # AF_NETLINK: getifaddrs(), which NCCL and UCX use to enumerate interfaces, speaks netlink.
    RestrictAddressFamilies = [
      "AF_INET"
      "AF_INET6"
      "AF_UNIX"
      "AF_NETLINK"
    ];
    SystemCallArchitectures = "native";
    UMask = "0077";
    # Not set, on purpose:
    # - MemoryDenyWriteExecute: PyTorch and Triton JIT-compile kernels and map them executable.
    # - RemoveIPC: it removes every SysV/POSIX IPC object of the *user* when one unit stops, and
    #   prefill and decode run as the same user and share memory for the KV hand-off.
    # - PrivateUsers, PrivateIPC, PrivatePIDs: prefill and decode exchange KV through NIXL/UCX
    #   (CUDA IPC between the two units' processes); separate namespaces per unit have not been
    #   tried with that path, so this module does not introduce them.
    # - SystemCallFilter: which system calls the CUDA driver, NCCL and UCX need has not been
    #   measured here; add a filter with a drop-in after checking it on the host.
  };

  gpuRelaxations = {
    # PrivateDevices=true would hide /dev/nvidia*; access is limited by DevicePolicy instead.
    PrivateDevices = false;
    DevicePolicy = "closed";
    # Every NVIDIA character device group in /proc/devices (nvidia-frontend: /dev/nvidia[0-9]* and
    # /dev/nvidiactl; nvidia-uvm; nvidia-caps; nvidia-nvswitch and nvidia-nvlink on NVSwitch hosts).
    # systemd matches the group name as a glob.
    DeviceAllow = [ "char-nvidia* rw" ];
    # The CUDA driver and NVML read /proc/driver/nvidia, which ProcSubset=pid would hide.
    ProcSubset = "all";
  };

  gpuEnvironment = {
    # Triton finds libcuda.so.1 through `ldconfig -p`, which has no answer on NixOS; this is its
    # own knob for the driver's library directory.
    TRITON_LIBCUDA_PATH = "${pkgs.addDriverRunpath.driverLink}/lib";
  };

  unitsOf =
    d:
    let
      names = unitNames d;
      worker = {
        serviceConfig = hardening // gpuRelaxations;
        environment = gpuEnvironment;
        # SGLang binds its scheduler processes to each GPU's NUMA node with numactl, looked up on PATH.
        path = [ pkgs.numactl ];
      };
      pd = {
        wantedBy = [ d.settings.systemd.wanted_by ];
      };
    in
    {
      ${names.prefill} = worker // pd;
      ${names.decode} = worker // pd;
      # The router runs on the CPU only: no GPU device access at all.
      ${names.router} = pd // {
        serviceConfig = hardening // {
          PrivateDevices = true;
        };
      };
      # Installed, not wanted: `pdserve cutover` (or `systemctl start`) switches to it.
      ${names.fallback} = worker;
    };

  ports = d: [
    d.settings.prefill.port
    d.settings.decode.port
    d.settings.router.port
  ];
  allPorts = lib.concatMap ports deployments;
  allNames = map (d: d.settings.name) deployments;
  users = lib.unique (map (d: d.settings.systemd.user) deployments);
  groups = lib.unique (map (d: d.settings.systemd.group) deployments);
in
{
  options.services.pdserve = {
    enable = lib.mkEnableOption "pdserve: SGLang prefill/decode disaggregated serving behind sglang-router";

    package = lib.mkPackageOption pkgs "pdserve" {
      extraDescription = ''
        It renders and validates the units and runs their readiness gates. pdserve's flake adds it
        to `pkgs` through `overlays.default`; without that overlay set this option to
        `pdserve.packages.x86_64-linux.pdserve`.
      '';
    };

    sglangPackage = lib.mkPackageOption pkgs "pdserve-sglang-env" {
      extraDescription = ''
        An environment whose `bin/python` has sglang, sglang-router and NIXL (pdserve's flake builds
        it from pkg/sglang-env/uv.lock: `pdserve.packages.x86_64-linux.sglang-env`). Kept apart from
        `package` so torch never enters the orchestrator's closure.
      '';
    };

    createUsers = mkOption {
      type = types.bool;
      default = true;
      description = ''
        Create the system users and groups named in each deployment's `settings.systemd.user` and
        `settings.systemd.group`. Turn off to manage them yourself.
      '';
    };

    deployments = mkOption {
      type = types.attrsOf (types.submodule deploymentModule);
      default = { };
      example = literalExpression ''
        {
          dsv4.settings = builtins.fromTOML (builtins.readFile ./deployment.toml);
          dsv4.apiKeyFile = "/run/keys/pdserve-api-key";
        }
      '';
      description = ''
        PD deployments: each gets prefill, decode and router units (started at boot) and a
        single-server fallback unit (installed, not started).
      '';
    };
  };

  config = lib.mkIf cfg.enable {
    assertions =
      [
        {
          assertion = cfg.deployments != { };
          message = ''
            services.pdserve is enabled without a deployment. Add one, e.g.
              services.pdserve.deployments.dsv4.settings = builtins.fromTOML (builtins.readFile ./deployment.toml);
          '';
        }
        {
          assertion = lib.allUnique allNames;
          message = ''
            services.pdserve.deployments: two deployments share settings.name (${lib.concatStringsSep ", " allNames}),
            so their units would collide. Give each a distinct settings.name.
          '';
        }
        {
          assertion = lib.allUnique allPorts;
          message = ''
            services.pdserve.deployments: a port is used twice across prefill.port, decode.port and
            router.port of all deployments (${lib.concatMapStringsSep ", " toString allPorts}).
            Give every server its own port.
          '';
        }
      ]
      ++ lib.concatLists (
        lib.mapAttrsToList (
          attrName: d:
          let
            at = "services.pdserve.deployments.${attrName}";
            keyFile = d.settings.router.api_key_file or null;
        in
        [
          {
            assertion = d.openFirewall -> !(isLoopback d.settings.router.host);
            message = ''
              ${at}.openFirewall opens port ${toString d.settings.router.port}, but the router listens on
              ${d.settings.router.host} only. Write ${at}.settings.router.host = "0.0.0.0"; (and set
              ${at}.apiKeyFile), or drop openFirewall.
            '';
          }
          {
            assertion = d.apiKeyFile == null || lib.hasPrefix "/" d.apiKeyFile;
            message = ''
              ${at}.apiKeyFile = "${toString d.apiKeyFile}" is not an absolute path. Write the full
              path of the key file, e.g. ${at}.apiKeyFile = "/run/keys/pdserve-api-key";
            '';
          }
          {
            assertion = keyFile == null || !(lib.hasPrefix builtins.storeDir (toString keyFile));
            message = ''
              ${at}: the API key file ${toString keyFile} is in the Nix store, which every user can
              read. Keep the key outside the store (e.g. /run/keys/pdserve-api-key, provisioned by
              agenix, sops-nix or by hand) and write ${at}.apiKeyFile = "/run/keys/pdserve-api-key";
            '';
          }
        ]
        ) cfg.deployments
      );

    warnings =
      lib.concatLists (
        lib.mapAttrsToList (
          attrName: d:
          lib.optional (!(isLoopback d.settings.router.host) && (d.settings.router.api_key_file or null) == null) ''
            services.pdserve: deployment ${attrName}'s router listens on ${d.settings.router.host}
            without an API key: anyone who reaches port ${toString d.settings.router.port} can use the model.
            Set services.pdserve.deployments.${attrName}.apiKeyFile.
          ''
        ) cfg.deployments
      )
      ++ lib.optional (!config.hardware.graphics.enable) ''
        services.pdserve: hardware.graphics.enable is false, so /run/opengl-driver/lib (where the
        SGLang environment looks for libcuda) stays empty. On a GPU host write
        hardware.graphics.enable = true; together with the hardware.nvidia settings.
      '';

    environment.systemPackages = [ cfg.package ];

    users.users = lib.mkIf cfg.createUsers (
      lib.genAttrs users (user: {
        isSystemUser = true;
        # The first deployment that names this user decides its primary group.
        group = (lib.findFirst (d: d.settings.systemd.user == user) null deployments).settings.systemd.group;
        description = "pdserve SGLang servers and router";
      })
    );
    users.groups = lib.mkIf cfg.createUsers (lib.genAttrs groups (_: { }));

    systemd.packages = map renderedUnits deployments;
    systemd.services = lib.mkMerge (map unitsOf deployments);

    networking.firewall.allowedTCPPorts = lib.mkMerge (
      map (d: lib.mkIf d.openFirewall [ d.settings.router.port ]) deployments
    );
  };
}
