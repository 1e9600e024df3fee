# One host of a multi-host example, as a NixOS module: its name among the deployment's [hosts], its
# cluster address (from the same deployment file) on the NIC of the cluster network, and pdserve with
# the whole deployment; the module installs only the units placed on this host. Each
# hosts/<example>/<host>/configuration.nix imports this with its name.
{
  deploymentFile,
  name,
  # The NIC of the cluster network (adapt to the machine).
  interface ? "ens1f0",
  # The router's host publishes its port (router.host = "0.0.0.0" and router.api_key_file in the deployment
  # file; the key stays outside the store, e.g. provisioned by agenix or sops-nix).
  publishRouter ? false,
}:
{ lib, ... }:
let
  deployment = lib.importTOML deploymentFile;
in
{
  imports = [ ./cluster-node.nix ];

  networking.hostName = name;
  # The servers placed here listen on the cluster address of [hosts.<name>]; the firewall opens their
  # ports to the other hosts' addresses.
  networking.interfaces.${interface}.ipv4.addresses = [
    {
      inherit (deployment.hosts.${name}) address;
      prefixLength = 24;
    }
  ];

  services.pdserve = {
    enable = true;
    # This machine's name among the deployment's [hosts] (the module's default is networking.hostName).
    host = name;
    deployments.${deployment.name} = {
      settings = deployment;
    }
    // lib.optionalAttrs publishRouter { openFirewall = true; };
  };
}
