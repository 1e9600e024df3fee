# The reference host, the one the seed ran on: 8 x NVIDIA RTX PRO 6000 Blackwell (SM120, 96 GB each,
# PCIe, no NVSwitch) in two NUMA domains (GPUs 0-3 on node 0, 4-7 on node 1) serving
# DeepSeek-V4-Flash (NVFP4) as prefill TP4 + decode TP4 behind sglang-router, with the
# single-server fallback installed. Built by `nixos-rebuild switch --flake .#gpu-host`.
#
# The flake supplies `pkgs` (CUDA configuration, pdserve's overlay) and the pdserve module; this
# file is the host's own part. Adapt hardware-configuration.nix and the model directory first.
{ config, pkgs, ... }:
{
  imports = [ ./hardware-configuration.nix ];

  networking.hostName = "gpu-host";

  # The regular production driver: RTX PRO 6000 Blackwell is a workstation/server PCIe card, not an
  # NVSwitch system, so neither the datacenter driver (hardware.nvidia.datacenter) nor the fabric
  # manager it brings belongs here. `videoDrivers` is how nixpkgs' nvidia module is switched on; it
  # starts no X server (services.xserver.enable stays false).
  services.xserver.videoDrivers = [ "nvidia" ];
  hardware.nvidia = {
    branch = "production";
    # The open kernel modules: the only ones NVIDIA supports on Blackwell.
    open = true;
    # Headless: no GUI settings tool.
    nvidiaSettings = false;
    # Keep the driver initialised between jobs, so a unit start does not pay the GPU init.
    nvidiaPersistenced = true;
  };
  # Populates /run/opengl-driver/lib (libcuda, libnvidia-ml), where the SGLang environment's
  # libraries look for the driver.
  hardware.graphics.enable = true;

  # Where deployment.toml's model.path points. The weights are not managed by Nix; put them here
  # (e.g. `huggingface-cli download ... --local-dir /var/lib/models/DeepSeek-V4-Flash-NVFP4`).
  # Readable by the pdserve group, writable only by root.
  systemd.tmpfiles.rules = [
    "d /var/lib/models 0755 root root -"
    "d /var/lib/models/DeepSeek-V4-Flash-NVFP4 0750 root pdserve -"
  ];

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

  environment.systemPackages = [
    config.hardware.nvidia.package.bin # nvidia-smi
    pkgs.numactl
  ];

  services.openssh.enable = true;

  system.stateVersion = "26.05";
}
