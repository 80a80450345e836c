"""Soak `epd serve`: many mixed requests at a fixed concurrency; print the failures and how much
each process's resident memory grew between the first and the last stretch of requests.

    python scripts/soak.py --model DIR [--requests 1000] [--concurrency 32] [--window 200]

Mixed: text and image prompts (a few images repeat, so caches hit and evict), streamed and not,
some streams abandoned after their first chunk. RSS is read from /proc/PID/status (VmRSS) of the
launcher's children once the first `window` requests are done and again after the last `window`;
the launcher's own process is not a server and is left out.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

READY = re.compile(r"EPD cluster ready: (http://\S+)/v1")


def children_of(pid: int) -> dict[int, str]:
    """pid -> name (the role-index of its ready file, else its command) of `pid`'s direct children."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid:
            words = [a.decode() for a in args if a]
            ready = words[words.index("--ready-file") + 1] if "--ready-file" in words else ""
            found[int(entry.name)] = Path(ready).stem or " ".join(words[1:3])
    return found


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def image_url(index: int) -> str:
    from PIL import Image

    image = Image.new("RGB", (48 + 16 * (index % 4), 40 + 8 * (index % 3)), ((53 * index) % 256, 120, 30))
    for x in range(0, image.width, 5 + index % 4):
        image.paste((250, (31 * index) % 256, 90), (x, 0, x + 2, image.height))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def request_body(index: int, rng: random.Random, images: list[str]) -> tuple[dict, str]:
    """(body, kind): what request `index` sends and how the client treats it."""
    content: list[dict] = [{"type": "text", "text": f"Describe item {index} in a few words."}]
    if rng.random() < 0.4:
        content = [{"type": "image_url", "image_url": {"url": rng.choice(images)}}] * rng.randint(1, 2) + content
    kind = rng.choice(["stream", "stream", "plain", "abandon"])
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": rng.randint(4, 48),
            "temperature": rng.choice([0.0, 0.7]), "stream": kind != "plain"}
    return body, kind


async def one(client, url: str, body: dict, kind: str) -> str | None:
    """None on success, else what went wrong."""
    try:
        if kind == "plain":
            reply = await client.post(f"{url}/v1/chat/completions", json=body)
            if reply.status_code != 200:
                return f"HTTP {reply.status_code}: {reply.text[:200]}"
            return None if reply.json()["choices"][0]["finish_reason"] in ("stop", "length") else reply.text[:200]
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as reply:
            if reply.status_code != 200:
                return f"HTTP {reply.status_code}: {(await reply.aread())[:200]!r}"
            async for line in reply.aiter_lines():
                if line.startswith("data: {") and '"error"' in line:
                    return f"error chunk: {line[:200]}"
                if kind == "abandon" and line.startswith("data: "):
                    return None  # leaves after the first chunk
            return None
    except Exception as exc:  # a failure to report, whatever it is
        return f"{type(exc).__name__}: {exc}"


async def soak(url: str, launcher_pid: int, requests: int, concurrency: int, window: int, seed: int) -> int:
    import httpx

    rng, images = random.Random(seed), [image_url(i) for i in range(12)]
    bodies = [request_body(i, rng, images) for i in range(requests)]
    failures: list[tuple[int, str]] = []
    done, started_at, rss = 0, time.monotonic(), {}
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(requests):
        queue.put_nowait(i)

    async with httpx.AsyncClient(timeout=300) as client:
        async def worker() -> None:
            nonlocal done
            while not queue.empty():
                i = queue.get_nowait()
                error = await one(client, url, *bodies[i])
                if error:
                    failures.append((i, error))
                done += 1
                if done == window:
                    rss["first"] = {pid: (name, rss_kib(pid)) for pid, name in children_of(launcher_pid).items()}
                if done % 100 == 0:
                    print(f"{done}/{requests} done, {len(failures)} failures, "
                          f"{done / (time.monotonic() - started_at):.1f} req/s", flush=True)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    await asyncio.sleep(1.0)  # let cancellations settle before the last reading
    rss["last"] = {pid: (name, rss_kib(pid)) for pid, name in children_of(launcher_pid).items()}
    return report(failures, rss, requests, window, time.monotonic() - started_at)


def report(failures: list[tuple[int, str]], rss: dict, requests: int, window: int, seconds: float) -> int:
    print(f"\n{requests} requests in {seconds:.0f} s; {len(failures)} failures")
    for i, error in failures[:20]:
        print(f"  request {i}: {error}")
    print(f"RSS (VmRSS) after the first {window} requests and after the last {window}:")
    worst = 0.0
    for pid, (name, first) in sorted(rss.get("first", {}).items(), key=lambda kv: kv[1][0]):
        last = rss["last"].get(pid, (name, 0))[1]
        growth = 100.0 * (last - first) / first if first else 0.0
        worst = max(worst, growth)
        gone = "" if pid in rss["last"] else " (exited)"
        print(f"  {name:<12} pid {pid:<7} {first / 1024:8.1f} MiB -> {last / 1024:8.1f} MiB  {growth:+6.1f}%{gone}")
    print(f"largest growth {worst:+.1f}% (goal: < 15%)")
    return 1 if failures else 0


def start_serve(args) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "epd", "serve", "--port", "0", "--encoders", str(args.encoders),
           "--prefills", str(args.prefills), "--decodes", str(args.decodes)]
    if args.model:
        cmd += ["--model", args.model]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []

    def pump() -> None:
        for line in proc.stdout:
            lines.append(line)
            if args.verbose:
                sys.stderr.write(line)

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + args.start_timeout_s
    while time.monotonic() < deadline:
        for line in list(lines):
            if match := READY.search(line):
                return proc, match.group(1)
        if proc.poll() is not None:
            raise SystemExit(f"epd serve exited with {proc.returncode}:\n{''.join(lines)}")
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    raise SystemExit(f"epd serve not ready in {args.start_timeout_s} s:\n{''.join(lines)}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="checkpoint directory (default: the demo checkpoint)")
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--window", type=int, default=200, help="requests at the start and the end whose RSS is compared")
    p.add_argument("--encoders", type=int, default=1)
    p.add_argument("--prefills", type=int, default=1)
    p.add_argument("--decodes", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--start-timeout-s", type=float, default=300.0)
    p.add_argument("--verbose", action="store_true", help="echo epd serve's output")
    args = p.parse_args()
    window = min(args.window, max(args.requests // 5, 1))
    proc, url = start_serve(args)
    try:
        return asyncio.run(soak(url, proc.pid, args.requests, args.concurrency, window, args.seed))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main())
