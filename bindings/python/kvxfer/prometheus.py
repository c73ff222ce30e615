"""kvxfer's metrics for prometheus_client (an optional dependency: only this
module imports it; Debian: python3-prometheus-client).

    from prometheus_client import REGISTRY
    from kvxfer.prometheus import Collector

    c = Collector(t, {"transport": "prefill0"})   # t: a kvxfer.Transport
    c.add(t2, {"transport": "decode0"})           # more transports: one collector
    REGISTRY.register(c)                           # then start_http_server(...) etc.

Each scrape calls Transport.metrics_text() (kvx_metrics_text(3), families
listed in docs/metrics.md), parses it with prometheus_client's parser and
yields its families, with const_labels added to every sample. Without a web
framework or prometheus_client, serve t.metrics_text() as it is (content type
"text/plain; version=0.0.4").
"""

import re
from typing import Any, Dict, Iterable, List, Optional, Tuple

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from ._errors import ClosedError

__all__ = ["Collector", "LIBRARY_LABELS"]

_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")

#: The label names the library's families use: const_labels may not take them.
LIBRARY_LABELS = frozenset({"peer", "outcome", "cause", "state", "backend", "path", "le", "quantile"})

Source = Any  # a Transport (anything with metrics_text()), or a callable


def _text_of(source) -> Optional[str]:
    """The metrics text of a source, None when there is none (a callable
    returning None, a closed transport)."""
    obj = source
    if not hasattr(obj, "metrics_text"):
        obj = source()  # a callable: the text, a transport, or None
        if obj is None or isinstance(obj, str):
            return obj
    try:
        return obj.metrics_text()
    except ClosedError:  # its series end with it
        return None


def _check_labels(const_labels) -> Dict[str, str]:
    labels = dict(const_labels or {})
    for k, v in labels.items():
        if not isinstance(k, str) or not _LABEL_NAME.match(k) or k.startswith("__"):
            raise ValueError("const label name %r is not a Prometheus label name" % (k,))
        if k in LIBRARY_LABELS:
            raise ValueError("const label name %r is one of the library's labels (%s)"
                             % (k, ", ".join(sorted(LIBRARY_LABELS))))
        if not isinstance(v, str):
            raise TypeError("const label %r: value must be a str, not %s" % (k, type(v).__name__))
    return labels


class Collector:
    """A prometheus_client collector of one or more kvxfer transports.

    Collector(source, const_labels=None)

    source: a kvxfer.Transport (anything with metrics_text()), or a
        callable returning one, the text itself, or None (nothing to
        report, e.g. before the transport exists).
    const_labels: labels added to every sample, e.g. {"transport":
        "prefill0"}; needed to tell several transports of one process apart.
        Not one of LIBRARY_LABELS.

    add(source, const_labels) adds another transport to the same collector
    (their families are merged: one HELP/TYPE block per family, as the
    exposition format wants; separate collectors of the same families would
    repeat the blocks); remove(source) takes it out. A closed transport
    yields nothing. describe() returns nothing, so that registries do not
    refuse several collectors for clashing names.
    """

    def __init__(self, source: Source, const_labels: Optional[Dict[str, str]] = None):
        self._sources: List[Tuple[Source, Dict[str, str]]] = []
        self.add(source, const_labels)

    def add(self, source: Source, const_labels: Optional[Dict[str, str]] = None) -> "Collector":
        """Collect source too, its samples labelled const_labels (which must
        differ from every other source's). Returns self."""
        if source is None:
            raise TypeError("source must be a kvxfer.Transport or a callable, not None")
        if not (hasattr(source, "metrics_text") or callable(source)):
            raise TypeError("source must be a kvxfer.Transport or a callable, not %s" % type(source).__name__)
        labels = _check_labels(const_labels)
        for _, other in self._sources:
            if other == labels:
                raise ValueError("two sources with the same const_labels %r would give the same series" % (labels,))
        self._sources = self._sources + [(source, labels)]  # a new list: collect() may be iterating
        return self

    def remove(self, source: Source) -> None:
        """Stop collecting source (ValueError when it is not collected)."""
        kept = [(s, l) for s, l in self._sources if s is not source]
        if len(kept) == len(self._sources):
            raise ValueError("%r is not a source of this collector" % (source,))
        self._sources = kept

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        families: Dict[str, Metric] = {}
        for source, labels in self._sources:
            text = _text_of(source)
            if not text:
                continue
            for fam in text_string_to_metric_families(text):
                out = families.get(fam.name)
                if out is None:
                    out = families[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
                if labels:
                    out.samples.extend(s._replace(labels={**labels, **s.labels}) for s in fam.samples)
                else:
                    out.samples.extend(fam.samples)
        return list(families.values())
