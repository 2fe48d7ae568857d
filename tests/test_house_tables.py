"""One table per named kind: nmt-score's metrics are one registry of small classes (nmtkit/score/metrics.py), the
server's routes one table from which both Starlette's routes and the OpenAPI paths are made
(nmtkit/serve/openapi.py): a metric or an endpoint added there is everywhere it must be."""

from __future__ import annotations

from nmtkit.score import metrics
from nmtkit.serve.config import ServeConfig
from nmtkit.serve.openapi import ENDPOINTS, schema


def test_the_servers_routes_and_its_schemas_paths_are_one_table():
    from starlette.routing import Route

    from nmtkit.serve.app import make_app

    app = make_app(ServeConfig(["m.pt"]), load=lambda: None, on_failure=lambda e: None)
    while not hasattr(app, "routes"):  # (inside its middleware: the log, the guard)
        app = app.app
    routes = {(r.path, m.lower()) for r in app.routes if isinstance(r, Route) for m in r.methods if m != "HEAD"}
    documented = {(path, method) for path, ops in schema(ServeConfig(["m.pt"]))["paths"].items() for method in ops}
    assert routes == documented == {(e.path, e.method) for e in ENDPOINTS}
    assert ("/openapi.json", "get") in documented  # (the hand-kept list had left the schema's own path out)


class _WordCount(metrics.Metric):
    """A metric written outside the library: the hypothesis' words over the reference's, in percent."""

    name, description, axis_label = "words", "words written per reference word", "words (%)"

    @classmethod
    def build(cls, references, target_lang):
        class Lengths:
            def _extract_corpus_statistics(self, lines, _):
                return [[len(h.split()), len(r.split())] for h, r in zip(lines, references)]

            def _compute_score_from_stats(self, stats):
                return type("Score", (), {"score": 100.0 * stats[0] / max(stats[1], 1)})()

        return metrics.SentenceMetric(cls.name, Lengths(), "words|v1")


def test_a_metric_is_one_class_in_the_registry(monkeypatch):
    refs = ["le chat est sur le tapis .", "il pleut ."]
    monkeypatch.setitem(metrics.REGISTRY, _WordCount.name, _WordCount)
    made = metrics.make_metrics(refs, "fr", ["BLEU", "words"])
    stats = made["words"].stats(["le chat est .", "il pleut beaucoup ."])
    assert made["words"].score(stats) == 100.0 * (4 + 4) / (7 + 3)
    assert abs(made["BLEU"].score(made["BLEU"].stats(refs)) - 100.0) < 1e-9
    assert [m.name for m in metrics.REGISTRY.values()][:4] == list(metrics.METRICS)
    assert all(m.description and m.axis_label for m in metrics.REGISTRY.values())
