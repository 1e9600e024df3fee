"""Listen addresses that the Nix side must judge as pdserve does (pdserve.schema.rules.is_loopback):
every spelling of loopback Python's ipaddress accepts, and near misses that are host names or other
addresses. The expected answer is always Python's, computed where the cases are used."""

from __future__ import annotations

LOOPBACK_SPELLINGS = [
    "127.0.0.1", "127.0.0.2", "127.255.255.254", "localhost",
    "::1", "0::1", "::0001", "0:0:0:0:0:0:0:1", "0000:0000:0000:0000:0000:0000:0000:0001", "0::0:1",
    "::0.0.0.1", "0:0:0:0:0:0:0.0.0.1", "::1%lo",
]
NOT_LOOPBACK = [
    # Host names that start like loopback (the module once took any "127." prefix for loopback).
    "127.foo", "127.0.0.1.nip.io", "127.1", "127.0.0.01", "127.256.0.1", "LOCALHOST", "localhost.localdomain",
    "0.0.0.0", "10.0.0.1", "128.0.0.1", "192.168.1.127",
    "::", "::2", "1::", "::1:0", "1:0:0:0:0:0:0:1", "fe80::1", "::127.0.0.1", "::ffff:127.0.0.1",
]
HOSTS = LOOPBACK_SPELLINGS + NOT_LOOPBACK
