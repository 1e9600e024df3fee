# gpu-c of the four-host example (hosts/four-host/deployment.toml): node 0 of the TP16 decode server (its HTTP API, dist-init) and the router, the public endpoint.
# Built on that machine by `nixos-rebuild switch --flake .#four-host-gpu-c`.
# Every host of the example takes the same deployment file; hosts/example-node.nix does the rest.
{ ... }:
{
  imports = [
    (import ../../example-node.nix {
      deploymentFile = ../deployment.toml;
      name = "gpu-c";
      publishRouter = true;
    })
    ./hardware-configuration.nix
  ];
}
