# What every host of the multi-host examples (hosts/two-host, hosts/four-host) shares: the GPU side of
# hosts/gpu-host (gpu-driver.nix: 8 x RTX PRO 6000 Blackwell, the production open driver) plus
# the RDMA NICs (ConnectX, mlx5) the deployments name in ib_devices for KV between hosts. Each host's
# configuration.nix imports this and adds its name, its cluster address and services.pdserve.
{ ... }:
{
  imports = [ ./gpu-driver.nix ];

  # RDMA for NIXL/UCX (rc) and Mooncake: the InfiniBand verbs of the mlx5 NICs. `ibv_devices` (nixpkgs'
  # rdma-core) lists the names the deployment's ib_devices must match; add pkgs.rdma-core to
  # environment.systemPackages to have it (left out here: its man pages build with pandoc, which the
  # evaluation tier's nixpkgs, without Haskell packages, cannot evaluate).
  boot.kernelModules = [
    "mlx5_ib"
    "ib_uverbs"
    "rdma_ucm"
  ];

  # Every port the deployment does not open to a named host stays closed (NixOS' default).
  networking.firewall.enable = true;
}
