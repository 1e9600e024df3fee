# gpu-a of the four-host example (hosts/four-host/deployment.toml): prefill server 1 (TP8).
# Built on that machine by `nixos-rebuild switch --flake .#four-host-gpu-a`.
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
