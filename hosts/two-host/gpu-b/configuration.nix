# gpu-b of the two-host example (hosts/two-host/deployment.toml): the decode server (TP8) and the router, the public endpoint.
# Built on that machine by `nixos-rebuild switch --flake .#two-host-gpu-b`.
# Every host of the example takes the same deployment file; hosts/example-node.nix does the rest.
{ ... }:
{
  imports = [
    (import ../../example-node.nix {
      deploymentFile = ../deployment.toml;
      name = "gpu-b";
      publishRouter = true;
    })
    ./hardware-configuration.nix
  ];
}
