# Replace with what `nixos-generate-config --show-hardware-config` prints on gpu-d (less its
# nixpkgs.hostPlatform line). Until then the reference host's generic UEFI machine, enough to evaluate.
import ../../gpu-host/hardware-configuration.nix
