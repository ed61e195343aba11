"""The OpenAPI document is the contract: Schemathesis drives every operation from it against
the real app (a published lake, a real Redis), with the server and admin keys, and runs all
of its checks on each answer: no server error, every status and content type documented,
every body matching its schema, valid data accepted, invalid data refused.

Every phase runs: examples, coverage, fuzzing, and the stateful phase, which follows the
document's links (app.http.contract.LINKS: ban then unban, submit a score then read the
player, ...). Every answer is counted: no 5xx but a documented 503.

Fuzzed examples per operation: SCHEMATHESIS_EXAMPLES (default 100); stateful scenarios:
SCHEMATHESIS_STATEFUL_EXAMPLES (default 50); the erasure runs on its own app and lake,
SCHEMATHESIS_ERASE_EXAMPLES (default 10)."""

from __future__ import annotations

import os
from collections import Counter
from datetime import UTC, date, datetime
from types import SimpleNamespace

import pytest
import redis
import schemathesis
from lakes import land, random_stream
from schemathesis import engine
from schemathesis.config import SchemathesisConfig
from schemathesis.engine import Status, events

from app.http import ApiKeys, HttpConfig, create_app
from jobs.batch import run_batch
from leaderboard.erasure import ErasureLedger
from leaderboard.settings import Settings
from speed_layer.service import SpeedLayer

pytestmark = [pytest.mark.redis, pytest.mark.slow]

NOW = "2026-12-01T18:00:00Z"
SERVER_KEY = "contract-server-key-0123456789"
ADMIN_KEY = "contract-admin-key-0123456789"
EXAMPLES = int(os.environ.get("SCHEMATHESIS_EXAMPLES", "100"))
#: Scenarios of the stateful phase (each a chain of linked requests).
STATEFUL_EXAMPLES = int(os.environ.get("SCHEMATHESIS_STATEFUL_EXAMPLES", "50"))
#: ... of the erasure, each a rewrite of the lake: SCHEMATHESIS_ERASE_EXAMPLES (default 10).
ERASE_EXAMPLES = int(os.environ.get("SCHEMATHESIS_ERASE_EXAMPLES", "10"))
#: Schemathesis's default answers to valid data (2xx, 3xx, 401, 403, 404, 409, 429, 5xx).
_ACCEPTED = ["2xx", "3xx", "401", "403", "404", "409", "429", "5xx"]
#: ... and to invalid data.
_REFUSED = ["400", "401", "403", "404", "405", "406", "409", "415", "422", "428", "429", "5xx"]


def _published_app(data, redis_url: str, db: int, **stream):
    """The app on a published lake (batch as of 2026-11-30) with live events folded, on
    Redis database `db` (flushed first)."""
    settings = Settings.from_env({"LEADERBOARD_DATA": str(data), "LEADERBOARD_NOW": NOW})
    events = random_stream(5, start=datetime(2026, 11, 27, tzinfo=UTC), days=5,
                           late_share=0.0, **stream)
    land(settings.lake_dir, settings.registry, events)
    run_batch(settings, date(2026, 11, 30))
    client = redis.Redis.from_url(redis_url, protocol=2, db=db)
    client.flushdb()
    SpeedLayer(client, settings.registry, settings.lake_dir).rebuild(settings.now())
    keys = ApiKeys.parse({"servers": {"contract-1": SERVER_KEY}, "admin_key": ADMIN_KEY})
    app = create_app(settings, HttpConfig(keys=keys), client=client)
    return SimpleNamespace(app=app, settings=settings, client=client,
                           players=sorted({e["player_id"] for e in events}))


def _close(world) -> None:
    world.app.state.service.close()  # what the lifespan does; no request cycle runs it here
    world.client.flushdb()
    world.client.close()


@pytest.fixture(scope="module")
def contract_app(tmp_path_factory, redis_server):
    """The app every operation but the erasure runs against."""
    world = _published_app(tmp_path_factory.mktemp("contract") / "data", redis_server.url, 0,
                           matches=40, players=20)
    yield world
    _close(world)


@pytest.fixture
def erasure_app(tmp_path, redis_server):
    """The erasure's own app: its own data dir and Redis database, a small lake (each erasure
    rewrites it), so erasing players harms no other operation's run."""
    world = _published_app(tmp_path / "data", redis_server.url, 1, matches=8, players=6)
    yield world
    _close(world)


class _Run:
    """What one Schemathesis run did: failed checks (with their reproduction), cases and
    seconds per operation, requests per phase, and every 5xx answer."""

    def __init__(self) -> None:
        self.failed: list[str] = []
        self.cases: Counter[str] = Counter()
        self.spent: Counter[str] = Counter()
        self.requests: Counter[str] = Counter()
        self.server_errors: list[str] = []
        self.seconds = 0.0

    def read(self, stream, documented_503: set[str]) -> None:
        for event in stream:
            if isinstance(event, events.ScenarioFinished | events.FuzzScenarioFinished):
                self._scenario(event, documented_503)
            elif isinstance(event, events.NonFatalError | events.FatalError):
                self.failed.append(f"error: {event!r}")
            elif isinstance(event, events.EngineFinished):
                self.seconds = event.running_time

    def _scenario(self, event, documented_503: set[str]) -> None:
        recorder = event.recorder
        self.cases[recorder.label] += len(recorder.cases)
        self.spent[recorder.label] += event.elapsed_time
        phase = getattr(event, "phase", None)
        phase = "fuzzing" if phase is None else str(getattr(phase, "value", phase))
        for case_id, interaction in recorder.interactions.items():
            self.requests[phase] += 1
            status = interaction.response.status_code if interaction.response else None
            if status is None or status < 500:
                continue
            label = recorder.cases[case_id].value.operation.label
            if status == 503 and label in documented_503:
                continue
            self.server_errors.append(f"{phase}: {label}: {status} "
                                      f"{interaction.request.uri}")
        for checks in recorder.checks.values():
            for check in checks:
                if check.status == Status.FAILURE and check.failure_info is not None:
                    info = check.failure_info
                    self.failed.append(f"{recorder.label}: {check.name}: "
                                       f"{info.failure.title}\n{info.failure.message}\n"
                                       f"{info.code_sample}")


#: Run on its own app (test_erasure_keeps_the_contract): an erasure rewrites the lake,
#: re-publishes the live version and rebases the speed layer, and erases players the other
#: operations read.
ERASE = "DELETE /v1/admin/players/{player_id}"
#: The keys a real client sends, by the document's security schemes; `ignored_auth` then
#: checks each route refuses a request without them or with a wrong one.
_AUTH = {"openapi": {"serverKey": {"api_key": SERVER_KEY},
                     "serverBearer": {"bearer": SERVER_KEY},
                     "adminKey": {"api_key": ADMIN_KEY},
                     "adminBearer": {"bearer": ADMIN_KEY}}}


def _run(app, operations: list[dict], examples: int, *, only: str | None = None,
         stateful: int = 0) -> Counter[str]:
    """Schemathesis's every check (`--checks all`) in every phase: examples, coverage
    (boundary and invalid values of each parameter), fuzzing (`examples` cases each),
    positive and negative data, and, `stateful` > 0, that many scenarios of the stateful
    phase along the document's links; with the credentials a real client sends (the
    server's key and the admin key); `only`: that one operation ("METHOD /path"). Asserts
    no check failed and no answer was a 5xx but a documented 503; returns the cases run per
    operation."""
    config = SchemathesisConfig.from_dict({
        "checks": {"enabled": True},
        "generation": {"max-examples": examples, "mode": "all"},
        "phases": {"stateful": {"enabled": stateful > 0,
                                "generation": {"max-examples": max(stateful, 1)}}},
        "seed": 1,
        "auth": _AUTH,
        "operations": operations,
    })
    schema = schemathesis.openapi.from_asgi("/openapi.json", app, config=config)
    if only is not None:
        method, path = only.split(" ", 1)
        schema = schema.include(method=method, path=path)
    documented_503 = {f"{method.upper()} {path}"
                      for path, ops in app.openapi()["paths"].items()
                      for method, op in ops.items() if "503" in op["responses"]}
    run = _Run()
    run.read(engine.from_schema(schema).execute(), documented_503)
    phases = ", ".join(f"{phase} {count}" for phase, count in sorted(run.requests.items()))
    print(f"schemathesis: {sum(run.requests.values())} requests ({phases}), "
          f"{len(run.server_errors)} 5xx other than a documented 503, "
          f"{sum(run.cases.values())} cases, in {run.seconds:.0f} s")
    for operation in sorted(run.cases, key=lambda op: -run.spent[op]):
        print(f"  {operation}: {run.cases[operation]} cases, {run.spent[operation]:.1f} s")
    assert not run.server_errors, "\n".join(run.server_errors[:30])
    assert not run.failed, f"{len(run.failed)} failed checks:\n\n" + "\n\n".join(
        run.failed[:30])
    if stateful:
        assert run.requests["stateful"] > 0, run.requests
    return run.cases


def _operations(app) -> dict[str, bool]:
    """Every operation of the document -> whether it takes inputs."""
    spec = app.openapi()
    return {f"{method.upper()} {path}": bool(op.get("parameters") or op.get("requestBody"))
            for path, ops in spec["paths"].items() for method, op in ops.items()}


def test_every_operation_keeps_the_contract(contract_app):
    """Every operation but the erasure (its own run, below), EXAMPLES fuzzed cases each."""
    cases = _run(contract_app.app, [
        # Rules no schema can state, so schema-valid data may still be refused: an event
        # time is judged against the server's clock and the windows' grace (a batch of
        # only such rows is 422 all_rows_rejected, with per-row reasons); a cursor is
        # valid only if this API returned it (400); `from` after `to` (422).
        # More events than maxItems is refused as too large (413).
        {"include-path": "/v1/events",
         "checks": {"positive_data_acceptance": {"expected-statuses": [*_ACCEPTED, 422]},
                    "negative_data_rejection": {"expected-statuses": [*_REFUSED, 413]}}},
        # A score's field depends on its board's aggregation (`delta` to a min board is
        # 422 score_expected), and its event time is judged as an event's.
        {"include-path": "/v1/boards/{board}/scores",
         "checks": {"positive_data_acceptance": {"expected-statuses": [*_ACCEPTED, 422]}}},
        {"include-path": "/v1/boards/{board}/top",
         "checks": {"positive_data_acceptance": {"expected-statuses": [*_ACCEPTED, 400]}}},
        {"include-path": "/v1/boards/{board}/players/{player_id}/history",
         "checks": {"positive_data_acceptance": {"expected-statuses": [*_ACCEPTED, 422]}}},
        # A display name is printable after NFC normalisation and an avatar URL has a
        # host: rules no JSON schema pattern states (422 with the field's error code).
        {"include-path": "/v1/players/{player_id}/profile", "include-method": "PUT",
         "checks": {"positive_data_acceptance": {"expected-statuses": [*_ACCEPTED, 422]}}},
        {"include-path": "/v1/admin/players/{player_id}", "include-method": "DELETE",
         "enabled": False},
    ], EXAMPLES, stateful=STATEFUL_EXAMPLES)
    operations = _operations(contract_app.app)
    assert set(cases) - {"Stateful tests"} == set(operations) - {ERASE}
    # An operation without inputs has only a handful of distinct requests to make.
    assert all(cases[op] >= EXAMPLES for op, has_inputs in operations.items()
               if has_inputs and op in cases)


def test_erasure_keeps_the_contract(erasure_app):
    """The erasure, every check, on its own small lake and Redis database (ERASE_EXAMPLES
    fuzzed cases: each valid id is a real erasure, a rewrite of the lake), then proof that
    the run erased for real: the lake's players, erased by the fuzzer's ids or the
    explicit ones below, are gone and refused."""
    cases = _run(erasure_app.app, [], ERASE_EXAMPLES, only=ERASE)
    assert set(cases) == {ERASE}
    assert ERASE in _operations(erasure_app.app)
    assert cases[ERASE] >= ERASE_EXAMPLES
    # Random ids rarely name a player of the lake: erase each of them too, every check on
    # each answer (the whole path ran: the lake rewritten, the version re-published).
    schema = schemathesis.openapi.from_asgi(
        "/openapi.json", erasure_app.app,
        config=SchemathesisConfig.from_dict({"checks": {"enabled": True}, "auth": _AUTH}))
    method, path = ERASE.split(" ", 1)
    for player in erasure_app.players[:2]:
        case = schema[path][method].Case(path_parameters={"player_id": player},
                                         headers={"X-Admin-Key": ADMIN_KEY})
        answer = case.call_and_validate()
        assert answer.json()["lake"]["rows"] > 0, answer.json()
    ledger = ErasureLedger.load(erasure_app.settings.lake_dir)
    assert all(ledger.erased(p) for p in erasure_app.players[:2])
