# Replace this file with the one `nixos-generate-config --show-hardware-config` prints on the real
# machine (disks, file systems, boot loader, CPU microcode, kernel modules of its storage and network
# controllers), less its `nixpkgs.hostPlatform` line: the flake hands NixOS a finished, read-only
# pkgs. What is here is only enough for `nix flake check` to evaluate the gpu-host: a generic x86_64
# UEFI machine whose root file system is labelled "nixos" and EFI partition "boot".
{ modulesPath, ... }:
{
  imports = [ (modulesPath + "/installer/scan/not-detected.nix") ];

  boot.loader.systemd-boot.enable = true;
  boot.loader.efi.canTouchEfiVariables = true;

  boot.initrd.availableKernelModules = [
    "nvme"
    "xhci_pci"
    "ahci"
    "sd_mod"
  ];

  fileSystems."/" = {
    device = "/dev/disk/by-label/nixos";
    fsType = "ext4";
  };
  fileSystems."/boot" = {
    device = "/dev/disk/by-label/boot";
    fsType = "vfat";
    options = [ "umask=0077" ];
  };
}
