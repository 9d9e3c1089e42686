"""The gateway's Prometheus metrics as a test reads them: scraped samples and their differences."""

import requests
from prometheus_client.parser import text_string_to_metric_families

from .servers import Server

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(server: Server) -> Samples:
    response = requests.get(server.url + "/metrics", timeout=10)
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def histogram_delta(before: Samples, after: Samples, name: str) -> list[tuple[float, float]]:
    """The observations of histogram ``name`` between two scrapes, as ``(upper bound, how many at most it)``."""
    bounds = {labels[0][1] for sample, labels in after if sample == f"{name}_bucket"}  # le="0.1", le="+Inf"
    counts = [(float(le), delta(before, after, f"{name}_bucket", le=le)) for le in bounds]
    return sorted(counts)
