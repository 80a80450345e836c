"""epd serve keeps serving when a worker is SIGKILLed: the dead worker is restarted on its address,
returns to ready in the router's /workers (which counts the restart), and takes traffic again."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import httpx
import pytest

from tests.e2e.cluster import cmdline, start_cluster, until
from tests.e2e.conftest import reference

PROMPT = "Say something."


def worker_by_name(cluster, name: str) -> tuple[int, str]:
    """(pid, address) of the launcher's child `name` (e.g. decode-0), from its command line and ready file."""
    for pid in cluster.worker_pids():
        args = cmdline(pid).split()
        if "--ready-file" in args:
            ready = Path(args[args.index("--ready-file") + 1])
            if ready.stem == name and ready.exists():
                return pid, json.loads(ready.read_text())["address"]
    raise AssertionError(f"no child {name} among {[cmdline(p) for p in cluster.worker_pids()]}")


def workers(url: str) -> dict[str, dict]:
    return {w["address"]: w for w in httpx.get(f"{url}/workers", timeout=10).json()["workers"]}


def body(max_tokens: int) -> dict:
    return {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": max_tokens, "temperature": 0,
            "return_token_ids": True}


@pytest.fixture
def two_decodes(e2e_dirs):
    cluster = start_cluster(e2e_dirs["kimi_k25"], "--decodes", "2")
    yield cluster
    cluster.stop()


def test_a_killed_decode_worker_is_restarted_and_the_cluster_keeps_serving(e2e_dirs, two_decodes):
    cluster, url = two_decodes, two_decodes.url
    expected = reference(e2e_dirs["kimi_k25"], (), 8, PROMPT)[0]
    pid, address = worker_by_name(cluster, "decode-0")
    assert workers(url)[address]["restarts"] == 0

    finished = []

    def stream() -> None:  # streams in flight while the worker dies: some may fail (no migration here)
        with httpx.stream("POST", f"{url}/v1/chat/completions", json={**body(64), "stream": True}, timeout=60) as r:
            finished.append(r.status_code)
            for _ in r.iter_lines():
                pass

    threads = [threading.Thread(target=stream) for _ in range(4)]
    for t in threads:
        t.start()
    os.kill(pid, signal.SIGKILL)
    for t in threads:
        t.join(90)
    assert cluster.proc.poll() is None, "".join(cluster.output)  # the launcher did not stop the cluster
    for _ in range(3):  # served by the other decode worker meanwhile
        reply = httpx.post(f"{url}/v1/chat/completions", json=body(8), timeout=60)
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["token_ids"] == expected
    until(lambda: workers(url)[address]["state"] == "ready" and workers(url)[address]["restarts"] == 1, 120,
          f"decode-0 not back to ready with one restart: {workers(url)}")
    new_pid, new_address = worker_by_name(cluster, "decode-0")
    assert new_pid != pid and new_address == address
    assert any("decode-0 exited with code -9; restarting it" in line for line in cluster.output)
    os.kill(worker_by_name(cluster, "decode-1")[0], signal.SIGSTOP)  # only the restarted worker can decode now
    try:
        until(lambda: workers(url)[worker_by_name(cluster, "decode-1")[1]]["state"] != "ready", 20,
              "stopped decode-1 still routed")
        reply = httpx.post(f"{url}/v1/chat/completions", json=body(8), timeout=60)
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["token_ids"] == expected
    finally:
        os.kill(worker_by_name(cluster, "decode-1")[0], signal.SIGCONT)


def stream_text(url: str, max_tokens: int, progress: list[int], index: int) -> str:
    """One greedy stream of `max_tokens` (ignore_eos) as text; `progress[index]` counts its content
    chunks as they arrive."""
    text = []
    request = {**body(max_tokens), "stream": True, "return_token_ids": False, "ignore_eos": True}
    with httpx.stream("POST", f"{url}/v1/chat/completions", timeout=120, json=request) as reply:
        assert reply.status_code == 200, reply.read()
        for line in reply.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk  # a migration the client can see is a failed one
            for choice in chunk["choices"]:
                text.append(choice["delta"].get("content") or "")
                progress[index] += 1
    return "".join(text)


def test_streams_survive_their_decode_worker_dying(e2e_dirs, two_decodes):
    """8 greedy streams; one decode worker SIGKILLed mid-stream: every stream still equals the same
    request's answer undisturbed, which up to the end token is transformers'."""
    from concurrent.futures import ThreadPoolExecutor

    # 600 tokens past any end token: the tiny model ends this answer at about 140, and with the native
    # kernels a decode worker generated that many so fast that one worker's streams had all ended
    # before the other's began (a kill when every stream has shown 3 found nothing left to migrate).
    cluster, url, max_tokens = two_decodes, two_decodes.url, 600
    expected = stream_text(url, max_tokens, [0], 0)
    # ... and up to its end token it is transformers' answer, as this test asserted before.
    assert expected.startswith(reference(e2e_dirs["kimi_k25"], (), 160, PROMPT)[1])
    pid, _ = worker_by_name(cluster, "decode-0")
    progress = [0] * 8
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(stream_text, url, max_tokens, progress, i) for i in range(8)]
        until(lambda: min(progress) >= 3 or any(f.done() for f in futures), 60, "streams never started")
        os.kill(pid, signal.SIGKILL)
        running_at_kill = sum(not f.done() for f in futures)
        texts = [f.result(180) for f in futures]
    migrated = [line for line in cluster.output if "migrating request" in line]
    # On a busy machine one stream can finish before every other has begun; most must still be mid-way.
    assert running_at_kill >= 4 and migrated, f"{running_at_kill} streams running at the kill, none migrated"
    assert texts == [expected] * 8
    # The launcher reports the death when it next polls its children, which may be after the
    # migrated streams have finished.
    until(lambda: any("decode-0 exited with code -9" in line for line in cluster.output), 10,
          "the launcher never reported decode-0's death")
    print(f"{len(migrated)} streams migrated")


def stream_chat(url: str, messages: list[dict], max_tokens: int, progress: list[int], index: int) -> str:
    text = []
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{url}/v1/chat/completions", timeout=180, json=body) as reply:
        assert reply.status_code == 200, reply.read()
        for line in reply.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                assert "error" not in chunk, chunk
                for choice in chunk["choices"]:
                    text.append(choice["delta"].get("content") or "")
                    progress[index] += 1
    return "".join(text)


def test_kill_an_encoder_a_prefill_and_a_decode_worker_under_eight_streams(e2e_dirs):
    """Two workers of each kind; one of each SIGKILLed while 8 streams (half with images) run: every
    stream equals transformers' greedy output, and the three are restarted and ready again."""
    from concurrent.futures import ThreadPoolExecutor

    from tests.e2e.conftest import QUESTION, data_url, openai_messages, pattern_image

    # 80 tokens: this tiny model's answer about image 0 emits the image token itself at position 86, and a
    # stream cannot be migrated past a generated image token (its prompt could not be re-expanded).
    model, max_tokens = e2e_dirs["kimi_k25"], 80
    cluster = start_cluster(model, "--encoders", "2", "--prefills", "2", "--decodes", "2")
    try:
        url = cluster.url
        cases = [((i % 2,), openai_messages([data_url(pattern_image(i % 2))])) if i % 2 == 0 else
                 ((), openai_messages([])) for i in range(8)]
        references = [reference(model, images, max_tokens, QUESTION) for images, _ in cases]
        image_token = json.loads((Path(model) / "config.json").read_text())["image_token_id"]
        assert not any(image_token in ids for ids, _ in references), "a stream could not migrate past its image token"
        expected = [text for _, text in references]
        victims = {name: worker_by_name(cluster, name) for name in ("encoder-0", "prefill-0", "decode-0")}
        progress = [0] * 8
        with ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(stream_chat, url, messages, max_tokens, progress, i)
                       for i, (_, messages) in enumerate(cases)]
            until(lambda: min(progress) >= 3 or any(f.done() for f in futures), 60, "streams never started")
            for pid, _ in victims.values():
                os.kill(pid, signal.SIGKILL)
            texts = [f.result(240) for f in futures]
        assert texts == expected
        for name, (_, address) in victims.items():
            until(lambda a=address: workers(url)[a]["state"] == "ready" and workers(url)[a]["restarts"] == 1, 120,
                  f"{name} not restarted and ready: {workers(url)}")
        again = stream_chat(url, cases[0][1], 16, [0], 0)  # the cluster serves image requests after it all
        assert again == reference(model, cases[0][0], 16, QUESTION)[1]
    finally:
        cluster.stop()


def test_with_no_decode_worker_left_a_stream_ends_with_an_error_chunk_not_a_hang(e2e_dirs):
    cluster = start_cluster(e2e_dirs["kimi_k25"])
    try:
        url, progress, lines = cluster.url, [0], []
        pid, _ = worker_by_name(cluster, "decode-0")

        def read() -> None:
            with httpx.stream("POST", f"{url}/v1/chat/completions", timeout=60,
                              json={**body(400), "stream": True, "ignore_eos": True}) as reply:
                for line in reply.iter_lines():
                    lines.append(line)
                    progress[0] += 1

        reader = threading.Thread(target=read)
        reader.start()
        until(lambda: progress[0] >= 5, 60, "stream never started")
        os.kill(pid, signal.SIGKILL)
        reader.join(30)
        assert not reader.is_alive(), "the stream hung after its only decode worker died"
        errors = [json.loads(line[6:])["error"] for line in lines if line.startswith('data: {"error"')]
        data = [line for line in lines if line]
        assert len(errors) == 1 and data[-1] == "data: [DONE]", data[-3:]
        assert errors[0]["type"] == "service_unavailable", errors
    finally:
        cluster.stop()


def test_gives_up_on_a_worker_that_cannot_start_again_and_says_why(e2e_dirs, tmp_path):
    """The checkpoint disappears under a running cluster: the killed decode worker fails at every
    restart, and after repeated failures the launcher stops, naming the worker and the failures."""
    import shutil

    model = tmp_path / "model"
    shutil.copytree(e2e_dirs["kimi_k25"], model)
    cluster = start_cluster(str(model))
    try:
        shutil.rmtree(model)
        os.kill(worker_by_name(cluster, "decode-0")[0], signal.SIGKILL)
        assert cluster.proc.wait(180) == 1
        output = "".join(cluster.output)
        assert "no decode worker left: gave up on decode-0: it failed 5 times in a row before becoming ready" \
               in output, output[-3000:]
    finally:
        cluster.stop()
