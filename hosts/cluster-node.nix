# What every host of the multi-host examples (hosts/two-host, hosts/four-host) shares: the GPU host of
# hosts/gpu-host (8 x RTX PRO 6000 Blackwell, PCIe, two NUMA domains, the production open driver) plus
# the RDMA NICs (ConnectX, mlx5) the deployments name in ib_devices for KV between hosts. Each host's
# configuration.nix imports this and adds its name, its cluster address and services.pdserve.
{ config, pkgs, ... }:
{
  services.xserver.videoDrivers = [ "nvidia" ];
  hardware.nvidia = {
    branch = "production";
    open = true;
    nvidiaSettings = false;
    nvidiaPersistenced = true;
  };
  hardware.graphics.enable = true;

  # RDMA for NIXL/UCX (rc) and Mooncake: the InfiniBand verbs of the mlx5 NICs. `ibv_devices` (nixpkgs'
  # rdma-core) lists the names the deployment's ib_devices must match; add pkgs.rdma-core to
  # environment.systemPackages to have it (left out here: its man pages build with pandoc, which the
  # evaluation tier's nixpkgs, without Haskell packages, cannot evaluate).
  boot.kernelModules = [
    "mlx5_ib"
    "ib_uverbs"
    "rdma_ucm"
  ];
  environment.systemPackages = [
    config.hardware.nvidia.package.bin # nvidia-smi
    pkgs.numactl
  ];
  # Where the deployments' model.path points (not managed by Nix), readable by the pdserve group.
  systemd.tmpfiles.rules = [
    "d /var/lib/models 0755 root root -"
    "d /var/lib/models/DeepSeek-V4-Flash-NVFP4 0750 root pdserve -"
  ];

  # Every port the deployment does not open to a named host stays closed (NixOS' default).
  networking.firewall.enable = true;
  services.openssh.enable = true;

  system.stateVersion = "26.05";
}
