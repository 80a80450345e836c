"""Write deploy/CONFIGURATION.md, every `epd` command's flags, from the parsers themselves.

    .venv/bin/python scripts/gen_config_reference.py          # regenerate
    .venv/bin/python scripts/gen_config_reference.py --check  # exit 1 if the file is stale (a test runs this)

Flags that also read an environment variable are found by building the parsers with
`epd.worker_args.env_default` swapped for a recorder, so the table names the variable each flag
really reads (they are not all EPD_<FLAG>). Run it in a fresh process: the swap must happen
before the command modules are imported.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = ROOT / "deploy" / "CONFIGURATION.md"


@dataclass(frozen=True)
class FromEnv:
    """What `env_default(name, default)` returns while the reference is built."""

    variable: str
    default: object

    def __repr__(self) -> str:
        return repr(self.default)


def _record_env_defaults() -> None:
    import epd.worker_args

    epd.worker_args.env_default = lambda name, default: FromEnv(f"EPD_{name.upper()}", default)


def _rows(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        flag = ", ".join(f"`{o}`" for o in action.option_strings) or f"`{action.dest}`"
        default = action.default.default if isinstance(action.default, FromEnv) else action.default
        env = f"`{action.default.variable}`" if isinstance(action.default, FromEnv) else ""
        if action.choices:
            flag += " " + "\\|".join(str(c) for c in action.choices)
        shown = "" if default in (None, argparse.SUPPRESS) or action.nargs == 0 and default is False else f"`{default}`"
        text = (action.help or "").replace("|", "\\|").replace("\n", " ")
        rows.append(f"| {flag} | {shown} | {env} | {text} |")
    return rows


def _commands(parser: argparse.ArgumentParser, prefix: str = "epd"):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                nested = any(isinstance(a, argparse._SubParsersAction) for a in sub._actions)
                if nested:
                    yield from _commands(sub, f"{prefix} {name}")
                else:
                    yield f"{prefix} {name}", helps.get(name) or "", sub


def render() -> str:
    _record_env_defaults()
    from epd.cli import build_parser

    lines = ["# Configuration reference", "",
             "Every `epd` command and its flags, generated from the command-line parsers by",
             "`scripts/gen_config_reference.py` (a test fails when this file is stale). A flag with an",
             "environment variable takes its default from that variable when it is set.", ""]
    for name, summary, sub in _commands(build_parser()):
        lines += [f"## `{name}`", "", summary.strip()[:1].upper() + summary.strip()[1:] + "." if summary else "", "",
                  "| flag | default | environment | what |", "|---|---|---|---|", *_rows(sub), ""]
    return "\n".join(line for i, line in enumerate(lines) if line or lines[i - 1]) + "\n"


def main() -> int:
    text = render()
    if "--check" in sys.argv[1:]:
        if not OUT.is_file() or OUT.read_text() != text:
            print(f"{OUT.relative_to(ROOT)} is stale: run scripts/gen_config_reference.py", file=sys.stderr)
            return 1
        print(f"{OUT.relative_to(ROOT)} is up to date")
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
