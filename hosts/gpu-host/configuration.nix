# The reference host, the one the seed ran on: 8 x NVIDIA RTX PRO 6000 Blackwell (SM120, 96 GB each,
# PCIe, no NVSwitch) in two NUMA domains (GPUs 0-3 on node 0, 4-7 on node 1) serving
# DeepSeek-V4-Flash (NVFP4) as prefill TP4 + decode TP4 behind the smg router, with the
# single-server fallback installed. Built by `nixos-rebuild switch --flake .#gpu-host`.
#
# The flake supplies `pkgs` (CUDA configuration, pdserve's overlay) and the pdserve module; this
# file is the host's own part (the driver, tools and model directory: ../gpu-driver.nix). Adapt
# hardware-configuration.nix and the model directory first.
{ ... }:
{
  imports = [
    ../gpu-driver.nix
    ./hardware-configuration.nix
  ];

  networking.hostName = "gpu-host";

  services.pdserve = {
    enable = true;
    deployments.dsv4 = {
      # The same file `pdserve check -c hosts/gpu-host/deployment.toml` reads on any Linux host;
      # tests/nix checks that Nix reads it exactly as pdserve does.
      settings = builtins.fromTOML (builtins.readFile ./deployment.toml);
      # Uncomment to require an API key (the file stays outside the Nix store, e.g. provisioned
      # by agenix or sops-nix), then publish the router with settings.router.host = "0.0.0.0":
      # apiKeyFile = "/run/keys/pdserve-api-key";
      # openFirewall = true;
    };
  };
}
