"""Hosts joined by rate-limited links, made of Linux network namespaces.

    with NetnsLink("1gbit") as link:              # two hosts, one link between them
        subprocess.run(link.exec_prefix(0) + ["some", "command"])   # runs on host A
        # host A is link.ns[0] at link.ip[0] on link.dev[0]; host B is index 1
    with NetnsLink("1gbit", hosts=4) as link:     # four hosts on one switch

Two hosts: namespaces gsb-a-PID and gsb-b-PID with a veth pair between them.
More: one namespace per host (gsb-a-PID, gsb-b-PID, ...) and a switch
namespace (gsb-s-PID) holding a bridge; each host has a veth to a port of the
bridge: a non-blocking switch whose every port runs at the rate (a rack's
top-of-rack switch). Addresses 10.231.X.(i+1)/24 for host i, X taken from the
pid; lo and the veths up (IPv4 only), and a tbf qdisc on BOTH ends of every
veth, so each direction's egress is shaped to the rate (a host's sends, and
the switch port's sends to that host). The namespaces have no other interface
and no default route: nothing in them can reach any address but each other
and their own loopback. On exit the namespaces are deleted (which deletes the
veths and the bridge), after errors too. Needs root (CAP_NET_ADMIN) and
iproute2 (ip, tc).

tbf parameters (the defaults; a real 1 Gbit/s Ethernet port is the model):
  burst 128kb   the bucket must hold at least one whole GSO/TSO super-packet
                (64 KiB; smaller, tbf must split or drop them); 128 KiB is two
                of them, about 1 ms at 1 Gbit/s: the link never runs faster
                than its rate for more than ~1 ms, close to a wire's strict
                pacing, without the under-delivery of a tiny bucket.
  latency 25ms  the most a packet may wait in the queue: a queue of
                rate * 25 ms (~3 MiB at 1 Gbit/s), about twice a 1000-packet
                txqueue of 1500-byte frames (a real NIC's qdisc plus its ring).
                Deep enough that a few TCP streams per daemon pair do not
                tail-drop, shallow enough that queueing cannot hide the rate.
(This kernel has no netem, so the link adds no propagation delay: a same-rack
link, RTT set by the queue.)
"""

import json
import os
import subprocess

DEFAULT_BURST = "128kb"
DEFAULT_LATENCY = "25ms"


def _ip(*args):
    subprocess.run(["ip", *args], check=True, stdout=subprocess.DEVNULL)


class NetnsLink:
    def __init__(self, rate, burst=DEFAULT_BURST, latency=DEFAULT_LATENCY, hosts=2):
        if hosts < 2 or hosts > 26:
            raise ValueError(f"netns_link: 2 to 26 hosts, not {hosts}")
        pid = os.getpid()
        self.rate, self.burst, self.latency, self.hosts = rate, burst, latency, hosts
        letters = [chr(ord("a") + i) for i in range(hosts)]
        self.ns = [f"gsb-{x}-{pid}" for x in letters]
        self.dev = [f"gsb{pid}{x}" for x in letters]  # <= 15 characters (IFNAMSIZ)
        # With a switch: its namespace, and the bridge's port facing each host.
        self.switch = f"gsb-s-{pid}" if hosts > 2 else None
        self.port = [f"gsw{pid}{x}" for x in letters] if hosts > 2 else []
        subnet = pid % 250 + 1  # different runs at once rarely share X (and may: separate namespaces)
        self.ip = [f"10.231.{subnet}.{i + 1}" for i in range(hosts)]

    def describe(self):
        ends = ", ".join(f"{ns} ({ip})" for ns, ip in zip(self.ns, self.ip))
        shape = f"tbf rate {self.rate} burst {self.burst} latency {self.latency}, each way"
        if self.switch is None:
            return f"{self.rate} link ({shape}) between namespaces {ends}"
        return f"{self.hosts} hosts on a switch with {self.rate} ports ({shape}): {ends}"

    def exec_prefix(self, host):
        """Command prefix that runs a program in host `host`'s namespace (ip netns
        exec execs it in place: the child's pid is the program's)."""
        return ["ip", "netns", "exec", self.ns[host]]

    def tx_bytes(self):
        """Bytes each host has sent so far (its veth end's egress): [A, B, ...]."""
        out = []
        for ns, dev in zip(self.ns, self.dev):
            j = subprocess.run(["ip", "-n", ns, "-j", "-s", "link", "show", "dev", dev], check=True,
                               capture_output=True, text=True).stdout
            out.append(json.loads(j)[0]["stats64"]["tx"]["bytes"])
        return out

    def _shape(self, ns, dev):
        subprocess.run(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate",
                        self.rate, "burst", self.burst, "latency", self.latency], check=True)

    def __enter__(self):
        if os.geteuid() != 0:
            raise PermissionError("netns_link: creating network namespaces needs root")
        try:
            for ns in self.ns + ([self.switch] if self.switch else []):
                _ip("netns", "add", ns)
                # No IPv6 on the veths (devices created from now on): no link-local
                # addresses, so no neighbour discovery or MLD multicast on the link.
                subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-qw",
                                "net.ipv6.conf.default.disable_ipv6=1"], check=True)
            # Both ends are created inside their namespaces: nothing appears in the caller's.
            if self.switch is None:
                _ip("link", "add", self.dev[0], "netns", self.ns[0], "type", "veth",
                    "peer", "name", self.dev[1], "netns", self.ns[1])
            else:
                _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
                _ip("-n", self.switch, "link", "set", "br0", "up")
                for ns, dev, port in zip(self.ns, self.dev, self.port):
                    _ip("link", "add", dev, "netns", ns, "type", "veth",
                        "peer", "name", port, "netns", self.switch)
                    _ip("-n", self.switch, "link", "set", port, "master", "br0")
                    _ip("-n", self.switch, "link", "set", port, "up")
                    self._shape(self.switch, port)
            for ns, dev, ip in zip(self.ns, self.dev, self.ip):
                _ip("-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
                _ip("-n", ns, "link", "set", "lo", "up")
                _ip("-n", ns, "link", "set", dev, "up")
                self._shape(ns, dev)
        except BaseException:
            self.close()
            raise
        return self

    def close(self):
        # Deleting a namespace deletes its veth end, and so the pair. Errors are
        # ignored: after a failed set-up some of it may not exist.
        for ns in self.ns + ([self.switch] if self.switch else []):
            subprocess.run(["ip", "netns", "del", ns], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)

    def __exit__(self, *exc):
        self.close()
        return False
