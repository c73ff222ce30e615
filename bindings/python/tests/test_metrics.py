"""Transport.metrics_text() (kvx_metrics_text) and kvxfer.prometheus.Collector:
the text parses with prometheus_client's parser, its counters match
stats(), the collector works in a registry with const labels, and
docs/metrics.md's "Families" table lists exactly the families of the text."""
import os
import re

import pytest

import kvxfer

from conftest import HERE, Pair, wait_for

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from kvxfer.prometheus import Collector  # noqa: E402

DOC = os.path.join(HERE, "..", "..", "..", "docs", "metrics.md")
N = 5  # transfers
BLOCKS = 3  # blocks per transfer


@pytest.fixture(scope="module")
def moved():
    """A pair after N done transfers of BLOCKS blocks to its peer "dst"."""
    p = Pair(nb=16, bl=4096)
    ids = [p.src.write_blocks("dst", list(range(BLOCKS)), list(range(i, i + BLOCKS))) for i in range(N)]
    assert None not in ids, p.src.last_error
    seen, _ = wait_for(p.src, ids)
    assert set(seen.values()) == {"done"}
    yield p
    p.close()


def families(text):
    """{name: family}; the samples of a family the text has twice (the
    output of two collectors in one registry) are merged."""
    fams = {}
    for f in text_string_to_metric_families(text):
        if f.name in fams:
            fams[f.name].samples.extend(f.samples)
        else:
            fams[f.name] = f
    return fams


def value(fams, family, sample=None, **labels):
    f = fams[family]
    got = [s.value for s in f.samples if s.name == (sample or family) and all(s.labels.get(k) == v
                                                                            for k, v in labels.items())]
    assert len(got) == 1, (family, sample, labels, f.samples)
    return got[0]


def test_metrics_text_parses_and_matches_stats(moved):
    text = moved.src.metrics_text()
    assert isinstance(text, str) and text.endswith("\n") and "\0" not in text
    fams = families(text)
    st = moved.src.stats()
    assert st["transfers_done"] == N and st["bytes_done"] == N * BLOCKS * 4096
    # the parser names a counter family without _total, its samples with it
    assert fams["kvxfer_transfers"].type == "counter"
    assert value(fams, "kvxfer_transfers", "kvxfer_transfers_total", outcome="done") == st["transfers_done"]
    assert value(fams, "kvxfer_transfers", "kvxfer_transfers_total", outcome="failed") == st["transfers_failed"]
    assert value(fams, "kvxfer_transfer_bytes", "kvxfer_transfer_bytes_total", outcome="done") == st["bytes_done"]
    assert value(fams, "kvxfer_transfers_in_flight") == st["transfers_inflight"] == 0
    assert value(fams, "kvxfer_connects", "kvxfer_connects_total") == st["connects"] == 1
    assert value(fams, "kvxfer_peers", state="up") == 1
    lat = fams["kvxfer_transfer_latency_seconds"]
    assert lat.type == "histogram"
    assert value(fams, "kvxfer_transfer_latency_seconds", "kvxfer_transfer_latency_seconds_count") == N
    assert value(fams, "kvxfer_transfer_latency_seconds", "kvxfer_transfer_latency_seconds_sum") == \
        pytest.approx(st["latency_ns_sum"] / 1e9)
    assert value(fams, "kvxfer_transfer_latency_seconds", "kvxfer_transfer_latency_seconds_bucket", le="+Inf") == N
    assert 0 < st["latency_ns_sum"] <= N * st["latency_ns_max"]
    # per peer
    ps = moved.src.stats("dst")
    assert value(fams, "kvxfer_peer_transfers", "kvxfer_peer_transfers_total", peer="dst",
                 outcome="done") == ps["transfers_done"] == N
    assert value(fams, "kvxfer_peer_info", peer="dst", backend="tcp", path="") == 1
    assert value(fams, "kvxfer_peer_state", peer="dst", state="up") == 1
    assert value(fams, "kvxfer_peer_state", peer="dst", state="broken") == 0
    last = value(fams, "kvxfer_peer_last_progress_timestamp_seconds", peer="dst")
    assert last == pytest.approx(moved.src.peer_state("dst").last_progress_ns / 1e9, abs=1e-3) and last > 0
    # the target: no peers, nothing sent
    fams = families(moved.dst.metrics_text())
    assert value(fams, "kvxfer_transfers", "kvxfer_transfers_total", outcome="done") == 0
    assert not any(n.startswith("kvxfer_peer_") for n in fams)


def test_collector_in_a_registry_with_const_labels(moved):
    reg = prometheus_client.CollectorRegistry(auto_describe=True)
    c = Collector(moved.src, {"transport": "prefill0"})
    reg.register(c)
    reg.register(Collector(lambda: moved.dst, {"transport": "decode0", "zone": "a"}))  # no name clash
    out = prometheus_client.generate_latest(reg).decode()
    fams = families(out)
    assert value(fams, "kvxfer_transfers", "kvxfer_transfers_total", transport="prefill0", outcome="done") == N
    assert value(fams, "kvxfer_transfers", "kvxfer_transfers_total", transport="decode0", zone="a",
                 outcome="done") == 0
    assert value(fams, "kvxfer_peer_info", transport="prefill0", peer="dst") == 1
    for f in fams.values():
        for s in f.samples:
            assert s.labels.get("transport") in ("prefill0", "decode0"), s
    assert reg.get_sample_value("kvxfer_transfers_total", {"transport": "prefill0", "outcome": "done"}) == N


def test_one_collector_of_several_transports_merges_families(moved):
    c = Collector(moved.src, {"transport": "src"}).add(moved.dst, {"transport": "dst"})
    reg = prometheus_client.CollectorRegistry()
    reg.register(c)
    out = prometheus_client.generate_latest(reg).decode()
    assert out.count("# TYPE kvxfer_transfers_total counter") == 1
    assert reg.get_sample_value("kvxfer_transfers_total", {"transport": "dst", "outcome": "done"}) == 0
    assert reg.get_sample_value("kvxfer_transfers_total", {"transport": "src", "outcome": "done"}) == N
    with pytest.raises(ValueError):
        c.add(moved.dst, {"transport": "dst"})  # the same series twice
    with pytest.raises(ValueError):
        Collector(moved.src, {"peer": "x"})  # a label of the library's
    with pytest.raises(ValueError):
        Collector(moved.src, {"bad-name": "x"})
    with pytest.raises(TypeError):
        Collector(moved.src, {"transport": 1})
    c.remove(moved.dst)
    assert reg.get_sample_value("kvxfer_transfers_total", {"transport": "dst", "outcome": "done"}) is None


def test_collector_of_nothing_or_a_closed_transport():
    assert Collector(lambda: None).collect() == []
    p = Pair(nb=2, bl=256)
    c = Collector(p.src)
    assert any(m.name == "kvxfer_transfers" for m in c.collect())
    p.close()
    with pytest.raises(kvxfer.ClosedError):
        p.src.metrics_text()
    assert c.collect() == []
    assert Collector(lambda: "# TYPE x gauge\nx 1\n").collect()[0].samples[0].value == 1


def doc_families():
    """The first column of docs/metrics.md's table under "## Families"."""
    with open(DOC) as f:
        doc = f.read()
    section = doc.split("\n## Families\n", 1)[1].split("\n## ", 1)[0]
    names = re.findall(r"^\|\s*`([a-z_:][a-z0-9_:]*)`\s*\|", section, re.M)
    assert names, "no table rows in docs/metrics.md's Families section"
    assert len(names) == len(set(names))
    return names


def test_docs_list_exactly_the_families_of_the_text(moved):
    """docs/metrics.md names each family as its samples do (counters with
    _total); the parser strips _total from a counter family's name."""
    fams = families(moved.src.metrics_text())  # a transport with a peer: every family
    in_text = {f.name + "_total" if f.type == "counter" else f.name for f in fams.values()}
    documented = doc_families()
    assert set(documented) == in_text, ("documented, not in the text: %s; in the text, not documented: %s"
                                        % (sorted(set(documented) - in_text), sorted(in_text - set(documented))))
    types = {(f.name + "_total" if f.type == "counter" else f.name): f.type for f in fams.values()}
    with open(DOC) as f:
        for line in f:
            m = re.match(r"^\|\s*`([a-z_:][a-z0-9_:]*)`\s*\|\s*(\w+)\s*\|", line)
            if m and m.group(1) in types:
                assert types[m.group(1)] == m.group(2), line
