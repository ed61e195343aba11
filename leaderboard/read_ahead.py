"""An iterator run in a thread of its own, a few items ahead of its consumer.

numpy, Arrow compute, DuckDB and the Parquet writer release the GIL in their kernels, so a
producer stage in its own thread overlaps the consumer's work on both cores: the batch's
sort and ranking run while the writer compresses the previous rows (jobs.rank_stream), and
the generator's stages chain as generate | validate | land (app.season). One implementation,
so both stop and hand errors over alike.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["ReadAhead", "read_ahead"]

_T = TypeVar("_T")
_DONE = object()


@dataclass(frozen=True)
class ReadAhead(Generic[_T]):
    """The items, read ahead; `stop` ends the producer (at its next item) and waits for it.
    Idempotent, and called by the items' own end (exhausted, closed or failed)."""

    items: Generator[_T, None, None]
    stop: Callable[[], None]


def read_ahead(items: Iterable[_T], *, name: str, depth: int) -> ReadAhead[_T]:
    """`items` produced by a thread named `name`, at most `depth` ahead of the consumer,
    started at the first item asked for. Order and content are unchanged; an error in the
    producer (any BaseException) is raised to the consumer after the items before it. A
    consumer that stops early calls `stop`, so the producer does not go on running its
    source: dropping the items stops it too, but only once they are garbage collected, and an
    exception's traceback keeps them alive. The producer closes its source (when it has a
    `close`) whatever ends it."""
    handoff: queue.Queue[object] = queue.Queue(depth)
    stopping = threading.Event()

    def offer(item: object) -> bool:
        while not stopping.is_set():
            try:
                handoff.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not offer(item):
                    return
            offer(_DONE)
        except BaseException as error:  # handed to the consumer, raised there
            offer(error)
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    worker = threading.Thread(target=produce, name=name, daemon=True)

    def stop() -> None:
        stopping.set()
        if worker.is_alive():
            worker.join()

    def consume() -> Generator[_T, None, None]:
        worker.start()
        try:
            while (item := handoff.get()) is not _DONE:
                if isinstance(item, BaseException):
                    raise item
                yield item  # type: ignore[misc]
        finally:
            stop()

    return ReadAhead(consume(), stop)
