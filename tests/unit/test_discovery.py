"""Worker discovery: DNS names re-resolved with the resolver the router uses (pointed at a loopback DNS
server the test runs), a workers file, and the registry adding and draining what they report."""

from __future__ import annotations

import asyncio
import json

import pytest

from router.discovery import DnsDiscovery, DnsTarget, FileDiscovery
from router.workers import WorkerRegistry, WorkerSpec
from tests.dns_server import LoopbackDns


@pytest.fixture
def dns_server():
    server = LoopbackDns()
    yield server
    server.close()


def _members(registry: WorkerRegistry) -> dict[str, str]:
    return {w.address: w.state for w in registry.workers}


def test_dns_targets_parse():
    parsed = DnsTarget.parse("decode=epd-decode:50051,metrics_port=9100")
    assert parsed == DnsTarget("decode", "epd-decode", 50051, 9100)
    assert DnsTarget.parse("encoder=a.b.svc:1") == DnsTarget("encoder", "a.b.svc", 1)
    for bad in ("decode", "gpu=a:1", "decode=a", "decode=a:x", "decode=a:1,metrics=2"):
        with pytest.raises(ValueError, match="--discover-dns"):
            DnsTarget.parse(bad)


def test_addresses_become_workers_with_their_metrics_urls():
    target = DnsTarget("decode", "n", 50051, 9100)
    assert target.specs(["10.0.0.7", "fd00::1"]) == {
        WorkerSpec("decode", "10.0.0.7:50051", "http://10.0.0.7:9100/metrics"),
        WorkerSpec("decode", "[fd00::1]:50051", "http://[fd00::1]:9100/metrics")}


def test_workers_join_and_drain_as_the_name_changes(dns_server):
    async def scenario():
        registry = WorkerRegistry([])
        target = DnsTarget("decode", "decode.epd.test", 7001)
        discovery = DnsDiscovery(registry, [target], nameserver=dns_server.address)
        dns_server.set("decode.epd.test", ["127.0.0.1"])
        await discovery.refresh()
        assert _members(registry) == {"127.0.0.1:7001": "starting"}
        dns_server.set("decode.epd.test", ["127.0.0.1", "127.0.0.2"])
        await discovery.refresh()
        assert _members(registry) == {"127.0.0.1:7001": "starting", "127.0.0.2:7001": "starting"}
        dns_server.set("decode.epd.test", ["127.0.0.2"])
        await discovery.refresh()
        assert _members(registry)["127.0.0.1:7001"] == "draining"
        await registry.poll_once()  # nothing in flight on it: it leaves
        assert list(_members(registry)) == ["127.0.0.2:7001"]
        dns_server.remove("decode.epd.test")  # NXDOMAIN: the name has no workers any more
        await discovery.refresh()
        assert _members(registry) == {"127.0.0.2:7001": "draining"}
        await registry.close()

    asyncio.run(scenario())


def test_a_failing_resolver_keeps_the_workers(dns_server):
    async def scenario():
        registry = WorkerRegistry([])
        discovery = DnsDiscovery(registry, [DnsTarget("prefill", "p.epd.test", 7002)], nameserver=dns_server.address,
                                 timeout_s=0.5)
        dns_server.set("p.epd.test", ["127.0.0.1"])
        await discovery.refresh()
        dns_server.close()  # nobody answers now: timeouts, not an empty answer
        await discovery.refresh()
        assert _members(registry) == {"127.0.0.1:7002": "starting"}
        await registry.close()

    asyncio.run(scenario())


def test_a_draining_worker_with_requests_in_flight_stays_until_they_finish():
    async def scenario():
        registry = WorkerRegistry([])
        registry.set_members("dns", [WorkerSpec("decode", "127.0.0.1:7003")])
        worker = registry.workers[0]
        worker.outstanding = 1
        registry.set_members("dns", [])
        await registry.poll_once()
        assert registry.workers == [worker] and worker.state == "draining" and not registry.ready("decode")
        registry.mark_failed(worker, "gone")  # a draining worker is not an incident
        assert worker.state == "draining"
        worker.outstanding = 0
        await registry.poll_once()
        assert registry.workers == []
        await registry.close()

    asyncio.run(scenario())


def test_a_worker_reported_by_two_sources_stays_while_one_still_does():
    async def scenario():
        registry = WorkerRegistry([])
        spec = WorkerSpec("encoder", "127.0.0.1:7004")
        registry.set_members("a", [spec])
        registry.set_members("b", [spec])
        registry.set_members("a", [])
        assert _members(registry) == {"127.0.0.1:7004": "starting"}
        await registry.close()

    asyncio.run(scenario())


def test_a_workers_file_is_read_when_it_changes(tmp_path):
    async def scenario():
        path = tmp_path / "workers.json"
        registry = WorkerRegistry([])
        discovery = FileDiscovery(registry, path)
        assert discovery.refresh() is False  # not written yet: nothing
        assert registry.workers == []
        path.write_text(json.dumps({"workers": [{"role": "decode", "address": "127.0.0.1:7005",
                                                 "metrics_url": "http://127.0.0.1:9/metrics"}]}))
        assert discovery.refresh() is True
        assert discovery.refresh() is False  # unchanged: not read again
        assert _members(registry) == {"127.0.0.1:7005": "starting"}
        assert registry.workers[0].spec.metrics_url == "http://127.0.0.1:9/metrics"
        path.write_text("{not json")
        discovery._seen = None
        assert discovery.refresh() is False  # unreadable: kept as it was
        assert _members(registry) == {"127.0.0.1:7005": "starting"}
        path.write_text(json.dumps({"workers": []}))
        discovery._seen = None
        discovery.refresh()
        assert _members(registry) == {"127.0.0.1:7005": "draining"}
        await registry.close()

    asyncio.run(scenario())


def test_workers_from_a_file_are_health_checked_at_once_not_at_the_next_poll(tmp_path):
    """`epd serve` writes the file once its workers are ready and waits for the router's /ready."""
    from grpc import aio
    from grpc_health.v1 import health, health_pb2_grpc

    async def scenario():
        server = aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        registry = WorkerRegistry([], interval_s=3600)  # its own poll would not come in this test's life
        path = tmp_path / "workers.json"
        path.write_text(json.dumps({"workers": [{"role": "prefill", "address": f"127.0.0.1:{port}"}]}))
        poller = asyncio.create_task(FileDiscovery(registry, path, interval_s=3600).run())
        try:
            for _ in range(100):
                if _members(registry) == {f"127.0.0.1:{port}": "ready"}:
                    break
                await asyncio.sleep(0.05)
            assert _members(registry) == {f"127.0.0.1:{port}": "ready"}
        finally:
            poller.cancel()
            await registry.close()
            await server.stop(None)

    asyncio.run(scenario())
