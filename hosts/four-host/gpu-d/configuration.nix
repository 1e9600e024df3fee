# gpu-d of the four-host example (hosts/four-host/deployment.toml): node 1 of the TP16 decode server.
# Built on that machine by `nixos-rebuild switch --flake .#four-host-gpu-d`.
# Every host of the example takes the same deployment file; hosts/example-node.nix does the rest.
{ ... }:
{
  imports = [
    (import ../../example-node.nix {
      deploymentFile = ../deployment.toml;
      name = "gpu-d";
    })
    ./hardware-configuration.nix
  ];
}
