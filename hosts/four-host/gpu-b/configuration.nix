# gpu-b of the four-host example (hosts/four-host/deployment.toml): prefill server 2 (TP8).
# Built on that machine by `nixos-rebuild switch --flake .#four-host-gpu-b`; every host of the example
# takes the same deployment file, and the module installs only the units placed on this one.
{ lib, ... }:
let
  deployment = lib.importTOML ../deployment.toml;
in
{
  imports = [
    ../../cluster-node.nix
    ./hardware-configuration.nix
  ];

  networking.hostName = "gpu-b";
  # The cluster address of [hosts.gpu-b], on the NIC of the cluster network (adapt the interface name):
  # the servers placed here listen on it and the firewall opens their ports to the other hosts' addresses.
  networking.interfaces.ens1f0.ipv4.addresses = [
    {
      inherit (deployment.hosts.gpu-b) address;
      prefixLength = 24;
    }
  ];

  services.pdserve = {
    enable = true;
    # This machine's name among the deployment's [hosts] (the default is networking.hostName).
    host = "gpu-b";
    deployments.dsv4 = {
      settings = deployment;
    };
  };
}
