# The GPU side every host here shares: 8 x NVIDIA RTX PRO 6000 Blackwell (PCIe, no NVSwitch) on the
# production open driver, the tools pdserve's checks call, and the model directory. Imported by
# hosts/gpu-host/configuration.nix and by hosts/cluster-node.nix (the multi-host examples' hosts).
{ config, pkgs, ... }:
{
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

  # Where the deployments' model.path points. The weights are not managed by Nix; put them here
  # (e.g. `huggingface-cli download ... --local-dir /var/lib/models/DeepSeek-V4-Flash-NVFP4`).
  # Readable by the pdserve group, writable only by root.
  systemd.tmpfiles.rules = [
    "d /var/lib/models 0755 root root -"
    "d /var/lib/models/DeepSeek-V4-Flash-NVFP4 0750 root pdserve -"
  ];

  environment.systemPackages = [
    config.hardware.nvidia.package.bin # nvidia-smi
    pkgs.numactl
  ];

  services.openssh.enable = true;

  system.stateVersion = "26.05";
}
