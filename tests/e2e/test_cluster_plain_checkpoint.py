"""`epd serve` on a Qwen3-VL-MoE checkpoint written by plain transformers code (not make-tiny-model)."""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import openai
import pytest

from tests.e2e.cluster import alive, cmdline, start_cluster
from tests.e2e.conftest import data_url, openai_messages, pattern_image, reference
from tests.plain_checkpoint import write_plain_qwen_checkpoint


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    model_dir = write_plain_qwen_checkpoint(tmp_path_factory.mktemp("plain") / "plain_qwen")
    cluster = start_cluster(model_dir)
    yield model_dir, openai.OpenAI(base_url=cluster.base_url, api_key="unused", max_retries=0, timeout=120), cluster
    if cluster.proc.poll() is None:
        assert cluster.stop() == 0


@pytest.mark.parametrize("stream", [False, True])
def test_plain_checkpoint_cluster_equals_transformers(plain, stream):
    model_dir, client, _ = plain
    expected_ids, expected_text = reference(model_dir, (5, 6), 24)
    assert len(set(expected_ids)) >= 6
    reply = client.chat.completions.create(
        model="plain_qwen", messages=openai_messages([data_url(pattern_image(5)), data_url(pattern_image(6))]),
        max_tokens=24, temperature=0, stream=stream, extra_body={"return_token_ids": True})
    if stream:
        chunks = [c for chunk in reply for c in chunk.choices]
        ids = [t for c in chunks for t in (c.model_extra or {}).get("token_ids") or []]
        text = "".join(c.delta.content or "" for c in chunks)
    else:
        ids, text = reply.choices[0].model_extra["token_ids"], reply.choices[0].message.content
    assert ids == expected_ids
    assert text == expected_text


def test_a_killed_launcher_takes_its_workers_with_it(plain):
    """SIGKILL gives `epd serve` no chance to clean up; PR_SET_PDEATHSIG still stops every child."""
    _, _, cluster = plain
    children = cluster.worker_pids()
    assert len(children) == 4
    # The launcher's folder of ready files, which its SIGKILL leaves behind: removed here, not by it.
    run_dir = Path(_ready_file(cmdline(children[0]))).parent
    assert run_dir.name.startswith("epd-serve-")
    os.kill(cluster.proc.pid, signal.SIGKILL)
    cluster.proc.wait(10)
    deadline = time.monotonic() + 15
    while any(alive(p) for p in children):
        assert time.monotonic() < deadline, [cmdline(p) for p in children if alive(p)]
        time.sleep(0.1)
    shutil.rmtree(run_dir)


def _ready_file(command_line: str) -> str:
    words = command_line.split()
    return words[words.index("--ready-file") + 1]
