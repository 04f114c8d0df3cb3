"""How NCCL picks its network interfaces, for every stand-in that plays an
NCCL rank (trtllm.py's trtllm-serve and Dynamo worker ranks, nccl_tests.py's
all_reduce_perf): one copy of NCCL's rules (github.com/NVIDIA/nccl
src/misc/socket.cc ncclFindInterfaces, src/os/linux.cc ncclOsFindInterfaces,
src/misc/utils.cc parseStringList) and of what it says when none matches
(src/bootstrap.cc). Standard library only (it runs in the simulated images)."""

from __future__ import annotations

import fcntl
import socket
import struct

NCCL_INVALID_USAGE = "invalid usage (run with NCCL_DEBUG=WARN for details)"
IFF_RUNNING = 0x40  # <net/if.h>
SIOCGIFFLAGS, SIOCGIFADDR = 0x8913, 0x8915  # <linux/sockios.h>


# --- NCCL's interface choice (src/misc/socket.cc ncclFindInterfaces, src/os/linux.cc) ----------
def match(name: str, spec: str) -> bool:
    """ncclOsFindInterfaces' test of one interface name against a list: prefixes
    (``=``: exact names; ``^``: everything but these; ``name:port`` reads the name)."""
    neg = spec.startswith("^")
    spec = spec[1:] if neg else spec
    exact = spec.startswith("=")
    spec = spec[1:] if exact else spec
    prefixes = [p.split(":", 1)[0] for p in spec.split(",") if p.split(":", 1)[0]]
    hit = not prefixes or any(name == p if exact else name.startswith(p) for p in prefixes)
    return hit != neg


def find_interfaces(spec: str | None, interfaces: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The (name, IPv4 address) NCCL would use, from the running interfaces
    with an address, in order: ``NCCL_SOCKET_IFNAME`` when it is longer than
    one character, else ``ib``, then anything but docker/lo/virbr, then
    docker, lo, virbr."""
    if spec is not None and len(spec) > 1:
        return [i for i in interfaces if match(i[0], spec)]
    for auto in ("ib", "^docker,lo,virbr", "docker", "lo", "virbr"):
        found = [i for i in interfaces if match(i[0], auto)]
        if found:
            return found
    return []


def local_interfaces() -> list[tuple[str, str]]:
    """This host's running interfaces with an IPv4 address: (name, address)."""
    out = []
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for _, name in socket.if_nameindex():
            req = struct.pack("256s", name.encode()[:15])
            try:
                flags = struct.unpack("H", fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, req)[16:18])[0]
                if not flags & IFF_RUNNING:
                    continue
                addr = socket.inet_ntoa(fcntl.ioctl(s.fileno(), SIOCGIFADDR, req)[20:24])
            except OSError:
                continue  # no IPv4 address
            out.append((name, addr))
    finally:
        s.close()
    return out
