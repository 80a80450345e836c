"""`epd bench` flags parse, and building them imports nothing heavy (every worker parses through epd.cli)."""

import subprocess
import sys

from epd import cli


def test_importing_the_bench_flags_loads_no_heavy_module():
    code = ("import sys, epd.cli; heavy = ('httpx', 'PIL', 'torch', 'transformers', 'matplotlib'); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & set(heavy)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_bad_values_exit_2_with_a_message(capsys):
    assert cli.main(["bench", "run", "--url", "http://127.0.0.1:9", "--requests", "0", "--quiet"]) == 2
    assert "--requests must be >= 1" in capsys.readouterr().err
    assert cli.main(["bench", "compare", "--model", "/m", "--workload", "text", "--skip", "vllm"]) == 2
    assert "--skip: unknown vllm" in capsys.readouterr().err
    assert cli.main(["bench", "run", "--url", "http://127.0.0.1:9", "--slo", "speed=1"]) == 2


def test_ceiling_refuses_an_empty_run(capsys):
    assert cli.main(["bench", "ceiling", "--model", "/m", "--output-len", "0"]) == 2
    assert "--requests and --output-len must be >= 1" in capsys.readouterr().err
