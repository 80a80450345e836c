"""Secure by default: every server binds loopback unless told otherwise, and no code unpickles."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from epd.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("epd", "router", "encoder_svc", "prefill_svc", "decode_svc", "colocated_svc")


def _subcommands(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield name, sub
                yield from ((f"{name} {n}", s) for n, s in _subcommands(sub))


def test_every_server_binds_loopback_by_default(monkeypatch):
    monkeypatch.delenv("EPD_HOST", raising=False)
    hosts = {name: sub.get_default("host") for name, sub in _subcommands(build_parser())
             if any("--host" in a.option_strings for a in sub._actions)}
    assert {"serve", "router", "encoder", "prefill", "decode", "colocated"} <= hosts.keys()
    assert set(hosts.values()) == {"127.0.0.1"}, hosts


def test_no_pickle_anywhere():
    # pickle.loads runs code; torch.load and numpy's allow_pickle are pickle underneath.
    banned = re.compile(r"^\s*(import pickle|from pickle|import cPickle|import dill)"
                        r"|torch\.load\(|allow_pickle\s*=\s*True|pickle\.loads?\(", re.M)
    found = [f"{path.relative_to(ROOT)}: {match.group(0).strip()}"
             for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))
             for match in banned.finditer(path.read_text())]
    assert found == []
