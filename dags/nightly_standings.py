"""
### Nightly standings

Every night, for the day that just ended (the run's data interval, `as_of` = its start date):
wait until the landing zone of that day is closed, recompute the authoritative standings
(`jobs.batch.run_batch`, DuckDB or Spark), check the written version on its own, publish it
(one atomic rename of `manifests/current.json`), move the speed layer onto it, compact the
day's small landing files, apply retention, and refresh the analysts' warehouse.

Every task is keyed by the interval and safe to rerun: rerunning a night, or backfilling a
week (catchup runs the nights in order, one at a time), publishes the same standings as the
nights run in order. Tasks pass dates, version ids and small reports, never data.

Settings are the CLI's (`LEADERBOARD_DATA`, `LEADERBOARD_CONFIG`, `REDIS_URL`, ...), read
in the worker's environment, overlaid by the optional JSON Variable `leaderboard_settings`
(`{"LEADERBOARD_DATA": "/srv/lake"}`), overridden by the run's params. A Spark run takes its
master from the connection named by `spark_conn_id` when it exists.
"""

from __future__ import annotations

import logging
import os
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import CronDataIntervalTimetable, Param, PokeReturnValue, dag, task

log = logging.getLogger(__name__)

#: The first night the schedule knows (catchup backfills from here); env so a deployment
#: can move it without editing the file. Parsing reads no file, database or network.
START = datetime.fromisoformat(os.environ.get("LEADERBOARD_DAG_START", "2026-12-01")).replace(
    tzinfo=UTC)
#: Drill: a fault checkpoint of the batch (`leaderboard.faults`, e.g. `batch.checks`) at
#: which the recompute task fails on its first try (proves a failed night leaves the old
#: version live and the retry publishes).
FAIL_FIRST_TRY_AT = "LEADERBOARD_FAIL_FIRST_TRY_AT"


def _settings(params: dict[str, Any]) -> Any:
    """The CLI's settings: environment, then the `leaderboard_settings` Variable, then params."""
    from airflow.sdk import Variable

    from leaderboard.settings import Settings

    env = dict(os.environ)
    overlay = Variable.get("leaderboard_settings", default=None, deserialize_json=True)
    if isinstance(overlay, dict):
        env.update({str(k): str(v) for k, v in overlay.items() if v is not None})
    from leaderboard.binding import bind_registry

    settings = Settings.from_env(env, data_dir=params.get("data_dir"),
                                 config=params.get("config"))
    bind_registry(settings.lake_dir, settings.registry)  # refuses another registry's data dir
    return settings


def spark_master(host: str | None, port: int | None) -> str | None:
    """A Spark master URL from a connection's host and port (`spark://h:7077`, `yarn`,
    `k8s://https://...`, `local[4]`); None without a host."""
    if not host:
        return None
    if "://" not in host and not host.startswith(("local", "yarn")):
        host = f"spark://{host}"
    return f"{host}:{port}" if port and not host.startswith(("local", "yarn")) else host


def _spark_master_from(conn_id: str) -> str | None:
    from airflow.sdk import Connection
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        conn = Connection.get(conn_id)
    except AirflowNotFoundException:
        return None
    return spark_master(conn.host, conn.port)


def _speed_layer(settings: Any) -> Any:
    """The speed layer, or None when none is deployed (no REDIS_URL and no local server
    recorded under the data dir). A configured Redis that does not answer raises: retry."""
    if settings.redis_url is None and not (settings.data_dir / "redis" / "server.json").exists():
        return None
    from leaderboard.speed_keys import connect
    from speed_layer.service import SpeedLayer

    return SpeedLayer(connect(settings), settings.registry, settings.lake_dir)


@dag(
    dag_id="nightly_standings",
    description="Recompute, check and publish the standings of the day that ended; rebase "
                "the speed layer; compact, retain, refresh the warehouse.",
    schedule=CronDataIntervalTimetable("0 0 * * *", timezone="UTC"),
    start_date=START,
    catchup=True,
    max_active_runs=1,  # a night builds on the previous one: never two at once
    dagrun_timeout=timedelta(hours=12),
    default_args={
        "owner": "leaderboard",
        "retries": 2,
        "retry_delay": timedelta(minutes=5),
        "retry_exponential_backoff": 2.0,
        "max_retry_delay": timedelta(hours=1),
    },
    params={
        "engine": Param("duckdb", enum=["duckdb", "spark"], description="batch engine"),
        "full": Param(False, type="boolean", description="recompute everything"),
        "data_dir": Param(None, type=["null", "string"],
                          description="data dir (default: LEADERBOARD_DATA, else ./data)"),
        "config": Param(None, type=["null", "string"],
                        description="board registry (default: LEADERBOARD_CONFIG, else shipped)"),
        "settle_minutes": Param(15, type="integer", minimum=0,
                                description="wait this long past the interval's end"),
        "compact": Param(True, type="boolean", description="compact the day's small files"),
        "retention": Param(True, type="boolean",
                           description="delete raw events past the registry's retention_days"),
        "spark_conn_id": Param("spark_default", type="string",
                               description="connection holding the Spark master, if any"),
    },
    tags=["leaderboard", "batch", "lambda"],
    doc_md=__doc__,
)
def nightly_standings() -> None:
    @task.sensor(mode="reschedule", poke_interval=300, timeout=6 * 3600)
    def wait_for_landing() -> PokeReturnValue:
        """#### Wait for landing
        The day's partition is closed when the interval's end plus `settle_minutes` has
        passed on the clock (`LEADERBOARD_NOW` in tests) and no landing writer holds an
        in-progress temp file (`.part-<writer>-<seq>.parquet.<hex>.tmp`) in it; a temp file
        untouched for an hour is a crashed writer's and does not count. Returns as_of.
        """
        from airflow.sdk import get_current_context

        from leaderboard.lake import open_landing_writes

        context = get_current_context()
        params = context["params"]
        settings = _settings(params)
        start, end = context["data_interval_start"], context["data_interval_end"]
        if start is None or end is None:
            raise ValueError("this run has no data interval; trigger nightly_standings with a "
                             "logical date (airflow dags trigger -l DATE, or dags test DATE)")
        as_of = start.date()
        settle = timedelta(minutes=int(params["settle_minutes"]))
        now = settings.now()
        if now < end + settle:
            log.info("landing for %s closes at %s; it is %s", as_of, end + settle, now)
            return PokeReturnValue(is_done=False)
        partition = settings.lake_dir / "events" / f"ingest_date={as_of.isoformat()}"
        writing = open_landing_writes(partition)
        if writing:
            log.info("a writer is still landing into %s: %s", partition, writing[0].name)
            return PokeReturnValue(is_done=False)
        return PokeReturnValue(is_done=True, xcom_value=as_of.isoformat())

    @task
    def recompute(as_of: str) -> dict[str, Any]:
        """#### Recompute
        `jobs.batch.run_batch` writes and seals the version of `as_of` without publishing
        it (incremental from the previous version, or full). `engine=spark` runs through the
        same entry point, on the master from the `spark_conn_id` connection when present.
        """
        from contextlib import nullcontext
        from datetime import date

        from airflow.sdk import get_current_context

        from jobs.batch import run_batch
        from jobs.retention import deleted_through
        from leaderboard import faults

        context = get_current_context()
        params = context["params"]
        settings = _settings(params)
        day = date.fromisoformat(as_of)
        gone = deleted_through(settings.lake_dir)
        if gone is not None and day <= gone:
            raise ValueError(f"raw events through {gone} were deleted by retention: the night "
                             f"of {day} cannot be recomputed (its standings stay in the history)")
        engine = params["engine"]
        # The worker's SPARK_MASTER wins; else the connection's master, handed to the engine
        # as a parameter (the process environment is left alone).
        master = os.environ.get("SPARK_MASTER") or None
        if engine == "spark" and master is None:
            master = _spark_master_from(params["spark_conn_id"])
            if master:
                log.info("Spark master %s from connection %s", master, params["spark_conn_id"])
        drill = os.environ.get(FAIL_FIRST_TRY_AT) if context["ti"].try_number == 1 else None
        with faults.injected(drill, faults.fail) if drill else nullcontext():
            result = run_batch(settings, day, engine=engine, full=bool(params["full"]),
                               step=lambda message: log.info("%s", message), publish=False,
                               spark_master=master if engine == "spark" else None,
                               now=settings.now())
        return {"version": result.manifest.version, "as_of": as_of, "mode": result.mode,
                "engine": result.manifest.engine, "new_events": result.events,
                "spark_master": master if engine == "spark" else None}

    @task
    def validate(batch: dict[str, Any]) -> str:
        """#### Validate
        Re-reads the written version (`jobs.release.validate_version`): every file present,
        the run's standings ordered, ranked and totalled as indexed, events adding up. A
        version that fails is set aside (`<version>.json.rejected`) so nothing builds on it.
        """
        from datetime import date

        from airflow.sdk import get_current_context

        from jobs.publish import PublishError
        from jobs.release import set_aside, validate_version

        settings = _settings(get_current_context()["params"])
        version = batch["version"]
        try:
            checked = validate_version(settings.lake_dir, version, registry=settings.registry,
                                       as_of=date.fromisoformat(batch["as_of"]))
        except PublishError:
            log.error("version %s failed its checks; setting it aside", version)
            set_aside(settings.lake_dir, version)
            raise
        log.info("checked %s", checked)
        return str(version)

    @task
    def publish(version: str) -> str:
        """#### Publish
        Swaps `manifests/current.json` to the version (atomic), unless the live version is
        of a later night (a rerun of an older night never moves the live pointer back).
        Returns the live version.
        """
        from airflow.sdk import get_current_context

        from jobs.release import publish_version

        settings = _settings(get_current_context()["params"])
        published, live = publish_version(settings.lake_dir, version)
        if not published:
            log.info("kept the later live version %s; %s stays in the history", live.version,
                     version)
        return str(live.version)

    @task
    def rebase_speed(live: str) -> str | None:
        """#### Rebase the speed layer
        Builds the speed state of the live version beside the old one, flips the speed
        layer's pointer and expires the old state (`SpeedLayer.rebase`).
        """
        from airflow.sdk import get_current_context

        from leaderboard.manifest import read_version

        settings = _settings(get_current_context()["params"])
        speed = _speed_layer(settings)
        if speed is None:
            log.info("no speed layer deployed (no REDIS_URL, no local server): nothing to rebase")
            return None
        try:
            rebased = speed.rebase(read_version(settings.lake_dir, live))
        finally:
            speed.client.close()
        return str(rebased.version)

    @task
    def compact(as_of: str, _speed_version: str | None) -> dict[str, Any]:
        """#### Compact
        Rewrites the day's small landing files as one file with the same rows
        (`jobs.compact`), only once the live speed version's watermark is past the day (else
        it would fold the new file again) and only files the live version absorbed; folds
        the profile log's files into one (every write kept: `leaderboard.profiles`).
        """
        from datetime import date

        from airflow.sdk import get_current_context

        from jobs.compact import compact_partition, live_speed_watermark
        from leaderboard.profiles import compact_log

        params = get_current_context()["params"]
        if not params["compact"]:
            return {"skipped": "compact=false"}
        settings = _settings(params)
        report = compact_partition(settings.lake_dir, date.fromisoformat(as_of),
                                   speed=live_speed_watermark(settings), say=log.info)
        return {**report.as_dict(), "profile_files_compacted": compact_log(settings.lake_dir)}

    @task
    def apply_retention(as_of: str, _compacted: dict[str, Any]) -> dict[str, Any]:
        """#### Retention
        Sweeps the files of batch runs that died or failed without a manifest, found by
        the lock files they left (`jobs.sweep.sweep_dead_runs`), and deletes raw event
        partitions older than the registry's `retention_days` before
        as_of that the live version absorbed and no layer still reads (`jobs.retention`),
        and expires the speed state of versions other than the live one.
        """
        from datetime import date

        from airflow.sdk import get_current_context

        from jobs.compact import live_speed_watermark
        from jobs.retention import apply_retention as retain
        from jobs.retention import speed_version_tags
        from leaderboard.speed_keys import version_tag

        params = get_current_context()["params"]
        if not params["retention"]:
            return {"skipped": "retention=false"}
        settings = _settings(params)
        report = retain(settings.lake_dir, date.fromisoformat(as_of),
                        settings.registry.retention_days,
                        speed=live_speed_watermark(settings), registry=settings.registry,
                        say=log.info).as_dict()
        from jobs.sweep import sweep_dead_runs

        # Files of batch runs that ended without a manifest (a failed try of this night,
        # say), found by the lock files they left: a cost set by those runs, not the history.
        report["swept"] = sweep_dead_runs(settings.lake_dir).as_dict()
        speed = _speed_layer(settings)
        if speed is not None:
            try:
                live = version_tag(speed.current().version)
                stale = sorted(speed_version_tags(speed.client) - {live})
                for tag in stale:
                    speed.expire_version(tag)
                report["speed_versions_expired"] = stale
            finally:
                speed.client.close()
        return report

    @task
    def refresh_warehouse(_retained: dict[str, Any]) -> str:
        """#### Warehouse
        Rebuilds `warehouse.duckdb` beside the old one and swaps it in; last, so its
        `events` view lists the files compaction and retention left.
        """
        from airflow.sdk import get_current_context

        from jobs.warehouse import refresh_warehouse as refresh

        settings = _settings(get_current_context()["params"])
        return str(refresh(settings.data_dir, settings.registry))

    # Each call takes the upstream task's XComArg where the function names the value it
    # resolves to at run time; Airflow's typing cannot say so, hence the ignores.
    as_of = wait_for_landing()
    live = publish(validate(recompute(as_of)))  # type: ignore[arg-type]
    speed = rebase_speed(live)  # type: ignore[arg-type]
    compacted = compact(as_of, speed)  # type: ignore[arg-type]
    refresh_warehouse(apply_retention(as_of, compacted))  # type: ignore[arg-type]


nightly_standings()
