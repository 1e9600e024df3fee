# gpu-c of the four-host example (hosts/four-host/deployment.toml): node 0 of the TP16 decode server (its HTTP API, dist-init) and the router, the public endpoint.
# Built on that machine by `nixos-rebuild switch --flake .#four-host-gpu-c`; every host of the example
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

  networking.hostName = "gpu-c";
  # The cluster address of [hosts.gpu-c], on the NIC of the cluster network (adapt the interface name):
  # the servers placed here listen on it and the firewall opens their ports to the other hosts' addresses.
  networking.interfaces.ens1f0.ipv4.addresses = [
    {
      inherit (deployment.hosts.gpu-c) address;
      prefixLength = 24;
    }
  ];

  services.pdserve = {
    enable = true;
    # This machine's name among the deployment's [hosts] (the default is networking.hostName).
    host = "gpu-c";
    deployments.dsv4 = {
      settings = deployment;
      # This host runs the router: publish its port (router.host = "0.0.0.0" and router.api_key_file in the
      # deployment file; the key stays outside the store, e.g. provisioned by agenix or sops-nix).
      openFirewall = true;
    };
  };
}
