"""A tiny authoritative DNS server on loopback for discovery tests: names -> A/AAAA records, changeable."""

from __future__ import annotations

import ipaddress
import socket
import threading

import dns.message
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset


class LoopbackDns:
    """Answers UDP queries on 127.0.0.1:<port> from `records` (name -> addresses); other names: NXDOMAIN."""

    def __init__(self) -> None:
        self.records: dict[str, list[str]] = {}
        self._lock = threading.Lock()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        self.address = f"127.0.0.1:{self._sock.getsockname()[1]}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def set(self, name: str, addresses: list[str]) -> None:
        with self._lock:
            self.records[name.rstrip(".") + "."] = list(addresses)

    def remove(self, name: str) -> None:
        with self._lock:
            self.records.pop(name.rstrip(".") + ".", None)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self._sock.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                data, peer = self._sock.recvfrom(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            self._sock.sendto(self._answer(dns.message.from_wire(data)).to_wire(), peer)

    def _answer(self, query: dns.message.Message) -> dns.message.Message:
        reply = dns.message.make_response(query)
        question = query.question[0]
        with self._lock:
            addresses = self.records.get(question.name.to_text())
        if addresses is None:
            reply.set_rcode(dns.rcode.NXDOMAIN)
            return reply
        family = 4 if question.rdtype == dns.rdatatype.A else 6
        matching = [a for a in addresses if ipaddress.ip_address(a).version == family]
        if matching:
            reply.answer.append(dns.rrset.from_text_list(question.name, 5, dns.rdataclass.IN, question.rdtype,
                                                         matching))
        return reply
