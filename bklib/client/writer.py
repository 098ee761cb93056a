"""Writing ledgers: the writer's metadata transforms, and :class:`LedgerWriter`.

The adds themselves (pipelining, in-order acks, ensemble changes) are
:mod:`bklib.client.add_pipeline`'s. Here:

* :func:`ensemble_change_transform` -- the CAS transform of a writer's ensemble change
  (``LedgerHandle.ensembleChangeLoop``, docs/safety-rules.md rule 9): refused with
  LedgerClosedError / LedgerFencedError once the stored metadata is CLOSED / IN_RECOVERY; a
  no-op when the failed bookies are no longer in the last ensemble; otherwise the failed
  indices are replaced and the new ensemble starts at LAC + 1 (replacing the last segment when
  it already starts there).
* :func:`writer_close_transform` -- the CAS transform of a writer's close
  (``LedgerHandle.doAsyncCloseInternal``, docs/safety-rules.md rule 8): CLOSED at (LAC,
  length); an existing CLOSED with the same values is success, different values are a
  MetadataVersionError. IN_RECOVERY is overridden on purpose: the writer knows what it wrote.
* :class:`LedgerWriter` -- create a ledger, ``add``/``add_async``, ``close``, ``abort``, on an
  :class:`~bklib.client.add_pipeline.AddPipeline` whose ensemble changes go to ZooKeeper.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Iterable, Mapping, Sequence

from bklib.client.add_pipeline import AddPipeline, per_entry_error
from bklib.client.placement import PlacementPolicy
from bklib.client.reader import ClientContext
from bklib.digest import digest_manager, master_key
from bklib.errors import (
    BKError,
    ClientClosedError,
    IncorrectParameterError,
    LedgerClosedError,
    LedgerExistsError,
    LedgerFencedError,
    MetadataVersionError,
    NotEnoughBookiesError,
    UnexpectedConditionError,
)
from bklib.meta.model import DigestType, LedgerMetadata, LedgerState, Segment
from bklib.meta.store import Versioned
from bklib.quorum import check_quorum

log = logging.getLogger(__name__)

__all__ = ["LedgerWriter", "ensemble_change_transform", "writer_close_transform"]

# ---- pure: metadata transforms ------------------------------------------------------------------


def ensemble_change_transform(
    md: LedgerMetadata,
    lac: int,
    failed: Mapping[int, str],
    candidates: Sequence[str],
    placement: PlacementPolicy,
    avoid: Iterable[str] = (),
) -> LedgerMetadata | None:
    """The writer's ensemble-change CAS transform, applied to the freshest stored metadata.

    Raises LedgerClosedError (CLOSED) or LedgerFencedError (IN_RECOVERY: a recoverer froze the
    last ensemble). Returns None when none of ``failed`` (index -> bookie) is still at its index
    in the last ensemble (someone already replaced them: adopt the stored value). Otherwise
    replaces them (``avoid``: other bookies that failed earlier, skipped while possible) and
    puts the new ensemble at ``lac + 1``: a new segment, or the last segment replaced in place
    when it already starts there. Raises NotEnoughBookiesError when no index can be replaced.
    """
    if md.state == LedgerState.CLOSED:
        raise LedgerClosedError(
            f"ledger closed at {md.last_entry_id} meanwhile; ensemble change refused",
            ledger_id=md.ledger_id,
        )
    if md.state == LedgerState.IN_RECOVERY:
        raise LedgerFencedError(
            "ledger is in recovery; ensemble change refused", ledger_id=md.ledger_id
        )
    last = md.last_segment
    still = {i: b for i, b in failed.items() if last.ensemble[i] == b}
    if not still:
        return None
    key = lac + 1
    if last.first_entry_id > key:
        raise UnexpectedConditionError(
            f"last segment starts at {last.first_entry_id}, after the new segment key {key}",
            ledger_id=md.ledger_id,
        )
    try:
        new_ens, _ = placement.replace_bookies(candidates, last.ensemble, still, exclude=avoid)
    except NotEnoughBookiesError:
        # Bookies that failed before may be healthy again; better than giving up.
        new_ens, _ = placement.replace_bookies(candidates, last.ensemble, still)
    return md.with_new_segment(key, new_ens)


def writer_close_transform(
    md: LedgerMetadata, last_entry_id: int, length: int
) -> LedgerMetadata | None:
    """The writer's close CAS transform: CLOSED at (``last_entry_id``, ``length``).

    Already CLOSED with the same values -> None (success, no write); with other values ->
    MetadataVersionError (someone recovered the ledger while our adds were outstanding).
    OPEN and IN_RECOVERY are both closed: the writer's LAC covers every entry it acknowledged.
    """
    if md.state == LedgerState.CLOSED:
        if (md.last_entry_id, md.length) == (last_entry_id, length):
            return None
        raise MetadataVersionError(
            f"ledger already closed at entry {md.last_entry_id} (length {md.length}); "
            f"this writer's LAC is {last_entry_id} (length {length})",
            ledger_id=md.ledger_id,
        )
    return md.closed(last_entry_id, length)


# ---- the writer ---------------------------------------------------------------------------------


class LedgerWriter:
    """The single writer of a ledger it created.

    ``await add(payload)`` returns the entry id once the entry and all lower ones reached AQ;
    ``add_async`` returns that future at once so adds can be pipelined. ``close()`` records
    lastEntryId = LAC in the metadata. After an unrecoverable error (fenced, closed, no bookies
    left) pending adds fail and the ledger is closed at the LAC -- unless the metadata the
    writer last saw is IN_RECOVERY, in which case only the adds fail and the recoverer closes.
    """

    def __init__(
        self, ctx: ClientContext, versioned: Versioned[LedgerMetadata], password: bytes
    ) -> None:
        md = versioned.value
        assert md.digest_type is not None
        self.ctx = ctx
        self._versioned = versioned
        self.digest = digest_manager(md.ledger_id, md.digest_type, password)
        self.master_key = master_key(password)
        self._length = 0
        self._closed = False
        self._refused: BKError | None = None
        self._close_task: asyncio.Future[LedgerMetadata] | None = None
        self.pipeline = AddPipeline(
            ctx,
            md.ledger_id,
            md.ensemble_size,
            md.write_quorum,
            md.ack_quorum,
            md.last_segment.ensemble,
            self.master_key,
            change_ensemble=self._change_ensemble,
            on_unrecoverable=self._on_unrecoverable,
            name="writer",
        )

    # ---- creation ---------------------------------------------------------------------------

    @classmethod
    async def create(
        cls,
        ctx: ClientContext,
        *,
        ensemble_size: int = 3,
        write_quorum: int = 2,
        ack_quorum: int = 2,
        digest_type: DigestType = DigestType.CRC32C,
        password: bytes = b"",
        custom_metadata: Mapping[str, bytes] | None = None,
        ledger_id: int | None = None,
    ) -> LedgerWriter:
        """Create a ledger (v3 metadata, ZooKeeper ``create``) on ``ensemble_size`` writable
        bookies and return its writer. The id comes from the shared id generator unless
        given; a generated id that already exists is retried with a new one."""
        check_quorum(ensemble_size, write_quorum, ack_quorum)
        if digest_type is None:
            raise IncorrectParameterError("a digest type is required")
        candidates = await ctx.writable_bookies()
        ensemble = ctx.placement.new_ensemble(candidates, ensemble_size)
        for attempt in range(10):
            lid = (
                ledger_id if ledger_id is not None else await ctx.meta(ctx.store.generate_ledger_id)
            )
            md = LedgerMetadata(
                ledger_id=lid,
                ensemble_size=ensemble_size,
                write_quorum=write_quorum,
                ack_quorum=ack_quorum,
                segments=(Segment(0, ensemble),),
                state=LedgerState.OPEN,
                digest_type=DigestType(digest_type),
                password=bytes(password),
                ctime=int(time.time() * 1000),
                store_ctime=True,
                custom_metadata=dict(custom_metadata or {}),
                ctoken=random.getrandbits(63) or 1,
                format_version=3,
            ).validate()
            try:
                versioned = await ctx.meta(ctx.store.create_ledger, md)
            except LedgerExistsError:
                if ledger_id is not None or attempt == 9:
                    raise
                log.warning("ledger %d exists already; generating another id", lid)
                continue
            log.debug(
                "ledger %d created: E=%d WQ=%d AQ=%d %s ensemble %s",
                lid,
                ensemble_size,
                write_quorum,
                ack_quorum,
                DigestType(digest_type).name,
                list(ensemble),
            )
            return cls(ctx, versioned, bytes(password))
        raise AssertionError("unreachable")

    # ---- state ------------------------------------------------------------------------------

    @property
    def ledger_id(self) -> int:
        return self._versioned.value.ledger_id

    @property
    def metadata(self) -> LedgerMetadata:
        """The metadata this writer last wrote or read."""
        return self._versioned.value

    @property
    def lac(self) -> int:
        """Last add confirmed: the highest entry delivered to the application."""
        return self.pipeline.lac

    @property
    def length(self) -> int:
        """Ledger length up to and including the LAC entry."""
        return self.pipeline.lac_length

    @property
    def last_add_pushed(self) -> int:
        return self.pipeline.queue.last_pushed

    @property
    def ensemble(self) -> tuple[str, ...]:
        """The current (last) ensemble."""
        return self.pipeline.ensemble

    @property
    def closed(self) -> bool:
        return self._closed

    def pending_entries(self) -> list[tuple[int, tuple[int, ...], bool]]:
        """(entry id, acked ensemble indices, reached AQ) of every pending add."""
        return self.pipeline.queue.snapshot()

    # ---- adds -------------------------------------------------------------------------------

    def add_async(self, payload: bytes) -> asyncio.Future[int]:
        """Start adding ``payload``; the future gives its entry id once acknowledged.

        Raises LedgerClosedError once the writer is closed, and the fencing error once adds
        were refused because the ledger is being recovered.
        """
        if self._closed or self.metadata.is_closed:
            raise LedgerClosedError("ledger is closed", ledger_id=self.ledger_id)
        if self._refused is not None:
            raise per_entry_error(self._refused, self.ledger_id, self.last_add_pushed + 1)
        entry_id = self.last_add_pushed + 1
        self._length += len(payload)
        # The LAC at send time is piggybacked: recovery starts from the highest one it finds.
        body = self.digest.package_entry(entry_id, self.lac, self._length, payload)
        return self.pipeline.submit(entry_id, body, self._length)

    async def add(self, payload: bytes) -> int:
        """Add ``payload`` and wait for it to be acknowledged; returns its entry id."""
        return await self.add_async(payload)

    # ---- ensemble change --------------------------------------------------------------------

    async def _change_ensemble(self, failed: dict[int, str]) -> tuple[str, ...]:
        ctx = self.ctx
        candidates = await ctx.writable_bookies()
        lac = self.lac  # stable: nothing is delivered while the change is pending
        avoid = set(self.pipeline.failed_bookies)

        def transform(md: LedgerMetadata) -> LedgerMetadata | None:
            return ensemble_change_transform(md, lac, failed, candidates, ctx.placement, avoid)

        try:
            versioned = await ctx.meta(
                ctx.store.update_ledger, self.ledger_id, transform, current=self._versioned
            )
        except (LedgerClosedError, LedgerFencedError):
            # Adopt what the store says: IN_RECOVERY makes us leave the close to the recoverer.
            with contextlib.suppress(BKError):
                self._versioned = await ctx.read_metadata(self.ledger_id)
            raise
        self._versioned = versioned
        md = versioned.value
        log.debug(
            "ledger %d: writer ensemble change committed at LAC %d: segments %s",
            self.ledger_id,
            lac,
            [(s.first_entry_id, list(s.ensemble)) for s in md.segments],
        )
        return md.last_segment.ensemble

    def _on_unrecoverable(self, exc: BKError) -> None:
        state = self.metadata.state
        if self._closed:
            self.pipeline.fail_all(exc)
        elif state == LedgerState.IN_RECOVERY:
            # A recoverer owns the ledger now: fail what is pending, refuse new adds, and do not
            # close -- the recoverer will (our own close() would still be honoured).
            log.warning(
                "ledger %d: writer got %s while the ledger is IN_RECOVERY; failing adds only",
                self.ledger_id,
                type(exc).__name__,
            )
            self._refused = exc
            self.pipeline.stop()
            self.pipeline.fail_all(exc)
        else:
            log.warning(
                "ledger %d: writer got unrecoverable %s; closing at LAC %d",
                self.ledger_id,
                type(exc).__name__,
                self.lac,
            )
            task = self._start_close(exc)
            task.add_done_callback(_log_close_outcome)

    # ---- close ------------------------------------------------------------------------------

    def _start_close(self, fail_with: BKError) -> asyncio.Future[LedgerMetadata]:
        if self._close_task is None:
            self._closed = True
            # Nothing pending can be delivered any more: abandon outstanding writes and any
            # ensemble change (a CAS already in flight may still land; ours then re-reads).
            self.pipeline.stop()
            self.pipeline.fail_all(fail_with)
            self._close_task = asyncio.ensure_future(self._close_metadata(self.lac, self.length))
        return self._close_task

    async def _close_metadata(self, last_entry_id: int, length: int) -> LedgerMetadata:
        ctx = self.ctx

        def transform(md: LedgerMetadata) -> LedgerMetadata | None:
            return writer_close_transform(md, last_entry_id, length)

        try:
            versioned = await ctx.meta(
                ctx.store.update_ledger, self.ledger_id, transform, current=self._versioned
            )
        except MetadataVersionError:
            with contextlib.suppress(BKError):
                self._versioned = await ctx.read_metadata(self.ledger_id)
            log.warning(
                "ledger %d: writer close at %d conflicts with stored %s",
                self.ledger_id,
                last_entry_id,
                self.metadata.state.name,
            )
            raise
        finally:
            await self.pipeline.wait_stopped()
        self._versioned = versioned
        log.debug(
            "ledger %d: writer closed it at entry %d, length %d",
            self.ledger_id,
            versioned.value.last_entry_id,
            versioned.value.length,
        )
        return versioned.value

    async def close(self) -> LedgerMetadata:
        """Close the ledger at the LAC (adds still pending fail with LedgerClosedError).

        Returns the closed metadata. Idempotent. Raises MetadataVersionError when someone else
        closed the ledger at a different (lastEntryId, length); the handle is closed anyway.
        """
        task = self._start_close(
            LedgerClosedError("ledger closed with the add outstanding", ledger_id=self.ledger_id)
        )
        return await asyncio.shield(task)

    async def abort(self) -> None:
        """Stop without touching the metadata, as if the writer process died: outstanding
        writes are abandoned and pending adds fail with ClientClosedError."""
        self._closed = True
        self.pipeline.stop()
        self.pipeline.fail_all(
            ClientClosedError("writer aborted with the add outstanding", ledger_id=self.ledger_id)
        )
        await self.pipeline.wait_stopped()


def _log_close_outcome(task: asyncio.Future[LedgerMetadata]) -> None:
    # A background close after an unrecoverable error has nobody awaiting it: log the outcome
    # (and mark the exception retrieved).
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        log.warning("background close after unrecoverable add error failed: %s", exc)
