# gpu-d of the four-host example (hosts/four-host/deployment.toml): node 1 of the TP16 decode server.
# Built on that machine by `nixos-rebuild switch --flake .#four-host-gpu-d`; every host of the example
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

  networking.hostName = "gpu-d";
  # The cluster address of [hosts.gpu-d], on the NIC of the cluster network (adapt the interface name):
  # the servers placed here listen on it and the firewall opens their ports to the other hosts' addresses.
  networking.interfaces.ens1f0.ipv4.addresses = [
    {
      inherit (deployment.hosts.gpu-d) address;
      prefixLength = 24;
    }
  ];

  services.pdserve = {
    enable = true;
    # This machine's name among the deployment's [hosts] (the default is networking.hostName).
    host = "gpu-d";
    deployments.dsv4 = {
      settings = deployment;
    };
  };
}
