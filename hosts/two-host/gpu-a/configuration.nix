# gpu-a of the two-host example (hosts/two-host/deployment.toml): the prefill server (TP8).
# Built on that machine by `nixos-rebuild switch --flake .#two-host-gpu-a`.
# Every host of the example takes the same deployment file; hosts/example-node.nix does the rest.
{ ... }:
{
  imports = [
    (import ../../example-node.nix {
      deploymentFile = ../deployment.toml;
      name = "gpu-a";
    })
    ./hardware-configuration.nix
  ];
}
