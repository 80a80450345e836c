"""The SSRF guard against the many ways to write an internal address, and network allow-list entries.

Numeric spellings (decimal, octal, hex, short forms) are not IP literals to `ipaddress`; the
system resolver turns them into the address a connection would reach, and that address is judged.
"""

from __future__ import annotations

import pytest

from router.image_source import allowed_networks
from tests.unit.image_source_helpers import check, check_refused, fake_resolver


@pytest.mark.parametrize(("url", "address"), [
    ("http://2130706433/", "127.0.0.1"),  # decimal
    ("http://017700000001/", "127.0.0.1"),  # octal, one number
    ("http://0x7f.1/", "127.0.0.1"),  # hex and a short form
    ("http://0x7f000001/", "127.0.0.1"),
    ("http://127.1/", "127.0.0.1"),
    ("http://0/", "0.0.0.0"),
    ("http://10.1/", "10.0.0.1"),
    ("http://0xa9.0xfe.0xa9.0xfe/", "169.254.169.254"),  # metadata in hex
    ("http://2852039166/", "169.254.169.254"),  # metadata in decimal
    ("http://localhost/", "127.0.0.1"),
])
def test_numeric_and_named_spellings_are_refused(url, address):
    message = check_refused(url)  # the real system resolver: these never leave the machine
    assert f"resolves to {address}, which is not allowed" in message or "resolves to ::1" in message


@pytest.mark.parametrize("url", [
    "http://0177.0.0.1/",  # dotted octal: httpx refuses to parse it at all
    "http://[::ffff:7f00:1]/",  # IPv4-mapped, hex form
    "http://[::ffff:169.254.169.254]/",
    "http://[0:0:0:0:0:0:0:1]/",
    "http://[::]/",
    "http://[ff02::1]/",
    "http://[2002:7f00:1::]/",  # 6to4 wrapping 127.0.0.1
])
def test_other_spellings_are_refused(url):
    check_refused(url, resolver=fake_resolver({}))


def test_a_network_entry_allows_addresses_inside_it_and_connects_to_the_checked_one():
    allowed = frozenset({"10.0.0.0/8"})
    resolver = fake_resolver({"internal.example": ["10.0.0.7"], "other.example": ["192.168.0.1"]})
    assert check("http://internal.example/a.png", allowed, resolver=resolver) == "10.0.0.7"
    assert check("http://10.9.9.9/", allowed, resolver=resolver) == "10.9.9.9"
    assert "resolves to 192.168.0.1" in check_refused("http://other.example/", allowed, resolver=resolver)
    assert "address 127.0.0.1" in check_refused("http://127.0.0.1/", allowed, resolver=resolver)


def test_a_network_entry_must_cover_every_answer():
    resolver = fake_resolver({"mixed.example": ["10.0.0.7", "127.0.0.1"]})
    assert "resolves to 127.0.0.1" in check_refused("http://mixed.example/", frozenset({"10.0.0.0/8"}),
                                                    resolver=resolver)


def test_ipv6_network_entry():
    assert check("http://[::1]:8080/", frozenset({"::1/128"}), resolver=fake_resolver({})) == "::1"


def test_malformed_network_entry():
    with pytest.raises(ValueError, match="not a network"):
        allowed_networks(frozenset({"10.0.0.0/99"}))
    assert allowed_networks(frozenset({"images.example", "127.0.0.1"})) == []


def test_an_overlong_url_is_refused_before_parsing():
    from router.image_source import MAX_URL_CHARS
    from tests.unit.image_source_helpers import refused

    message = refused("http://images.example/" + "a" * MAX_URL_CHARS)
    assert f"the limit is {MAX_URL_CHARS}" in message
