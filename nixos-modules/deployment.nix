# One deployment of services.pdserve.deployments: its settings as pdserve reads them (only the keys the
# module reads are typed, each with pdserve's default from the committed JSON Schema), the router's
# firewall port and API key file, and the checked JSON the units read (set by units.nix).
{
  lib,
  pkgs,
  schema,
}:
{ name, config, ... }:
let
  inherit (lib) literalExpression mkOption types;
  json = pkgs.formats.json { };
  schemaDefault = section: key: schema."$defs".${section}.properties.${key}.default;
  bootLayouts = schema.properties.boot_layout.enum;

  portOption =
    section: key: description:
    mkOption {
      type = types.port;
      default = schemaDefault section key;
      defaultText = literalExpression "${toString (schemaDefault section key)} (pdserve's default)";
      inherit description;
    };

  # `[prefill]`: the one server of a single-host file (it listens on loopback); `[[prefill]]`: the
  # servers of a multi-host file, each placed on `hosts`. Only what the module reads is typed.
  serversOption =
    role: port:
    mkOption {
      type = types.either (types.submodule {
        freeformType = json.type;
        options.port = mkOption {
          type = types.port;
          example = port;
          description = "Port of the ${role} server (listens on loopback).";
        };
      }) (types.nonEmptyListOf (types.submodule {
        freeformType = json.type;
        options = {
          port = mkOption {
            type = types.port;
            example = port;
            description = "Port of this ${role} server (on its first host's cluster address).";
          };
          hosts = mkOption {
            type = types.nonEmptyListOf types.str;
            example = [ "node-a" ];
            description = "The `[hosts]` it runs on: one, or several for multi-node tensor parallelism.";
          };
        };
      }));
      description = "The ${role} server (a single-host file) or servers (`[[${role}]]` of a multi-host file).";
    };
in
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
          prefill = serversOption "prefill" 30000;
          decode = serversOption "decode" 30002;
          router = {
            host = mkOption {
              type = types.str;
              default = schemaDefault "RouterSpec" "host";
              example = "0.0.0.0";
              description = "Address the router (the only public endpoint) listens on.";
            };
            port = portOption "RouterSpec" "port" "Port of the router; `openFirewall` opens this one and no other.";
            prometheus_port = portOption "RouterSpec" "prometheus_port" "Port of the router's Prometheus metrics (stays closed in the firewall).";
          };
          transfer.bootstrap_port = portOption "TransferSpec" "bootstrap_port" "KV bootstrap port the prefill server binds; distinct per deployment.";
          systemd = {
            user = mkOption {
              type = types.str;
              default = schemaDefault "SystemdSpec" "user";
              description = "User the SGLang servers and the router run as.";
            };
            group = mkOption {
              type = types.str;
              default = schemaDefault "SystemdSpec" "group";
              description = "Group the SGLang servers and the router run as.";
            };
            wanted_by = mkOption {
              type = types.str;
              default = schemaDefault "SystemdSpec" "wanted_by";
              description = "Target that pulls in the units of `boot_layout` at boot.";
            };
          };
          boot_layout = mkOption {
            type = types.enum bootLayouts;
            default = schema.properties.boot_layout.default;
            example = "single";
            description = ''
              Which layout starts at boot: `"pd"` (prefill, decode and router wanted by
              `systemd.wanted_by`) or `"single"` (only the fallback). `pdserve cutover` switches
              what runs now; on NixOS it cannot change boot links (they are generated), so it
              names this line to change, and the next `nixos-rebuild switch` makes it so.
            '';
          };
        };
      };
    };

    openFirewall = mkOption {
      type = types.bool;
      default = false;
      description = ''
        Open the router's port (`settings.router.port`) in the firewall, and no other: prefill,
        decode, the bootstrap and the Prometheus ports stay closed (the workers bypass the
        router's API key). Requires a public `settings.router.host` and `apiKeyFile`.
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
        The deployment as the units read it: `settings` written as JSON and validated at build
        time by one `pdserve check` of every deployment of the host, with the real parsers of
        `services.pdserve.sglangPackage`; `nix run .#verify` passes it to `pdserve verify -c`.
      '';
    };
  };

  config.settings.router = lib.mkIf (config.apiKeyFile != null) {
    api_key_file = config.apiKeyFile;
  };
}
