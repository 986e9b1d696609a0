"""filter_batches / TxnTracker (service.fetch.read_committed) on real batches: encoded with
records.build_batch / build_control_batch, decoded with decode_records, as a Fetch response carries them."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from service.fetch.read_committed import READ_COMMITTED, READ_UNCOMMITTED, TxnTracker, filter_batches
from service.protocol import messages as M
from service.protocol.records import (
    ControlType,
    Record,
    RecordBatch,
    build_batch,
    build_control_batch,
    decode_records,
)

Aborted = M.struct("FetchResponse", "AbortedTransaction")
TS = 1_700_000_000_000


class Log:
    """A partition log being written: batches get consecutive offsets; values are ``b"v<offset>"``."""

    def __init__(self, start: int = 0) -> None:
        self.next = start
        self.blob = bytearray()
        self.mark = 0

    def data(self, n: int, pid: int = -1, *, txn: bool = False, epoch: int = 3) -> list[int]:
        offsets = list(range(self.next, self.next + n))
        self.blob += build_batch([(None, b"v%d" % o) for o in offsets], base_offset=self.next, producer_id=pid,
                                 producer_epoch=0 if pid >= 0 else -1, transactional=txn,
                                 partition_leader_epoch=epoch, base_timestamp=TS)
        self.next += n
        return offsets

    def txn(self, pid: int, n: int = 1) -> list[int]:
        return self.data(n, pid, txn=True)

    def marker(self, pid: int, commit: bool) -> int:
        offset = self.next
        self.blob += build_control_batch(ControlType.COMMIT if commit else ControlType.ABORT, base_offset=offset,
                                         producer_id=pid, producer_epoch=0, timestamp=TS)
        self.next += 1
        return offset

    def compacted(self, span: int, keep: Sequence[int] = (), pid: int = -1) -> None:
        """A batch covering ``span`` offsets of which only ``keep`` (deltas) survived compaction."""
        recs = [Record(self.next + d, TS, b"k", b"v%d" % (self.next + d), ()) for d in keep]
        self.blob += build_batch(recs, base_offset=self.next, producer_id=pid, producer_epoch=0 if pid >= 0 else -1,
                                 base_timestamp=TS, last_offset_delta=span - 1)
        self.next += span

    def cut(self) -> list[RecordBatch]:
        """The batches written since the previous cut (one "fetch response")."""
        batches = decode_records(bytes(self.blob[self.mark:])).batches
        self.mark = len(self.blob)
        return batches

    def all(self) -> list[RecordBatch]:
        return decode_records(bytes(self.blob)).batches


def offsets(result: object) -> list[int]:
    return [r.offset for r in result.records]  # type: ignore[attr-defined]


# -- read_committed ----------------------------------------------------------------------------------
def test_two_producers_interleaving_committed_and_aborted_transactions() -> None:
    log = Log()
    a1 = log.txn(1, 2)  # producer 1: aborted
    b1 = log.txn(2, 2)  # producer 2: committed
    a2 = log.txn(1)
    plain = log.data(1)  # not transactional
    b2 = log.txn(2)
    log.marker(1, commit=False)
    log.marker(2, commit=True)
    a3 = log.txn(1, 2)  # producer 1 again: committed this time
    log.marker(1, commit=True)
    res = filter_batches(log.all(), 0, isolation_level=READ_COMMITTED, aborted_transactions=[Aborted(1, a1[0])],
                         last_stable_offset=log.next)
    assert offsets(res) == b1 + plain + b2 + a3
    assert [r.value for r in res.records] == [b"v%d" % o for o in b1 + plain + b2 + a3]
    assert res.aborted_batches == 2 and res.control_batches == 3
    assert res.next_offset == log.next
    assert len(a2) == 1


def test_aborted_list_unsorted_and_several_entries_per_producer() -> None:
    log = Log()
    first = log.txn(5, 2)
    log.marker(5, commit=False)
    kept = log.txn(5, 2)
    log.marker(5, commit=True)
    other = log.txn(6)
    second = log.txn(5, 2)
    log.marker(6, commit=False)
    log.marker(5, commit=False)
    tail = log.data(1)
    aborted = [(5, second[0]), (6, other[0]), (5, first[0])]  # as a broker may list them: any order
    res = filter_batches(log.all(), 0, isolation_level=READ_COMMITTED, aborted_transactions=aborted,
                         last_stable_offset=log.next)
    assert offsets(res) == kept + tail
    assert res.aborted_batches == 3 and res.control_batches == 4 and res.next_offset == log.next


def test_aborted_entry_before_the_fetch_offset_still_applies() -> None:
    # the transaction began below the fetch position: Kafka lists it with its original first offset
    log = Log()
    log.txn(4, 3)
    log.txn(4, 2)
    log.marker(4, commit=False)
    after = log.data(2)
    batches = log.all()[1:]
    res = filter_batches(batches, 3, isolation_level=READ_COMMITTED, aborted_transactions=[(4, 0)],
                         last_stable_offset=log.next)
    assert offsets(res) == after and res.next_offset == log.next


def test_a_transaction_spanning_two_responses() -> None:
    log = Log()
    tracker = TxnTracker()
    ab1 = log.txn(7, 2)
    ok1 = log.txn(8, 2)
    first = log.cut()
    ab2 = log.txn(7, 2)
    ok2 = log.txn(8, 1)
    log.marker(7, commit=False)
    log.marker(8, commit=True)
    second = log.cut()
    # the aborted transaction is listed in both responses (its first offset is below the second fetch)
    r1 = filter_batches(first, 0, isolation_level=READ_COMMITTED, aborted_transactions=[Aborted(7, ab1[0])],
                        last_stable_offset=log.next, tracker=tracker)
    assert offsets(r1) == ok1 and r1.next_offset == 4
    assert tracker.delivered_open == {8: ok1[0]}  # producer 8's transaction is open and partly delivered
    r2 = filter_batches(second, r1.next_offset, isolation_level=READ_COMMITTED,
                        aborted_transactions=[Aborted(7, ab1[0])], last_stable_offset=log.next, tracker=tracker)
    assert offsets(r2) == ok2 and r2.next_offset == log.next
    assert r1.aborted_batches + r2.aborted_batches == 2 and len(ab2) == 2
    assert tracker.delivered_open == {} and tracker.aborted_after_delivery == 0


def test_control_batches_are_never_returned_and_move_the_position() -> None:
    log = Log()
    log.marker(3, commit=True)
    log.marker(4, commit=False)
    for level in (READ_COMMITTED, READ_UNCOMMITTED):
        res = filter_batches(log.all(), 0, isolation_level=level, last_stable_offset=log.next)
        assert res.records == [] and res.control_batches == 2 and res.next_offset == 2


def test_position_moves_past_aborted_batches_at_the_end() -> None:
    log = Log()
    ok = log.data(1)
    log.txn(9, 3)
    log.marker(9, commit=False)
    batches = log.all()
    res = filter_batches(batches[:2], 0, isolation_level=READ_COMMITTED, aborted_transactions=[(9, 1)],
                         last_stable_offset=5)
    assert offsets(res) == ok and res.next_offset == 4 and res.aborted_batches == 1


@pytest.mark.parametrize("level", [READ_COMMITTED, READ_UNCOMMITTED])
def test_position_moves_past_compacted_batches(level: int) -> None:
    log = Log(start=10)
    log.compacted(5)  # 10..14, every record compacted away
    log.compacted(4, keep=[2])  # 15..18, only 17 left
    log.compacted(3)  # 19..21, empty again: the response ends with nothing to deliver
    res = filter_batches(log.all(), 10, isolation_level=level, last_stable_offset=log.next)
    assert offsets(res) == [17] and res.next_offset == 22
    assert res.records[0].value == b"v17"
    only_empty = filter_batches(log.all()[:1], 10, isolation_level=level, last_stable_offset=log.next)
    assert only_empty.records == [] and only_empty.next_offset == 15


def test_records_below_the_fetch_offset_are_skipped() -> None:
    log = Log()
    log.data(3)
    log.data(5)  # 3..7
    batches = log.all()
    res = filter_batches(batches, 5, isolation_level=READ_COMMITTED, last_stable_offset=log.next)
    assert offsets(res) == [5, 6, 7] and res.next_offset == 8
    # a response holding only earlier batches leaves the position where it was
    res = filter_batches(batches[:1], 5, isolation_level=READ_UNCOMMITTED)
    assert res.records == [] and res.next_offset == 5


def test_last_stable_offset_limits_read_committed() -> None:
    log = Log()
    committed = log.data(3)
    log.txn(2, 2)  # open transaction from offset 3: the LSO
    later = log.data(2)
    res = filter_batches(log.all(), 0, isolation_level=READ_COMMITTED, last_stable_offset=3)
    assert offsets(res) == committed and res.next_offset == 3
    # read_uncommitted ignores the LSO
    res = filter_batches(log.all(), 0, isolation_level=READ_UNCOMMITTED, last_stable_offset=3)
    assert offsets(res) == [0, 1, 2, 3, 4, *later] and res.next_offset == log.next


def test_last_stable_offset_inside_a_batch() -> None:
    log = Log()
    log.data(5)
    res = filter_batches(log.all(), 1, isolation_level=READ_COMMITTED, last_stable_offset=3)
    assert offsets(res) == [1, 2] and res.next_offset == 3


def test_read_uncommitted_returns_every_data_record() -> None:
    log = Log()
    a = log.txn(1, 2)
    b = log.data(1)
    c = log.txn(2)
    log.marker(1, commit=False)
    log.marker(2, commit=True)
    res = filter_batches(log.all(), 0, isolation_level=READ_UNCOMMITTED, aborted_transactions=[(1, 0)],
                         last_stable_offset=0)
    assert offsets(res) == a + b + c
    assert res.aborted_batches == 0 and res.control_batches == 2 and res.next_offset == log.next


def test_last_epoch_is_that_of_the_last_delivering_batch() -> None:
    log = Log()
    log.data(1, epoch=4)
    log.data(1, epoch=6)
    log.marker(3, commit=True)
    res = filter_batches(log.all(), 0, isolation_level=READ_COMMITTED, last_stable_offset=log.next)
    assert res.last_epoch == 6
    assert filter_batches(log.all()[2:], 2).last_epoch is None


# -- defence in depth: brokers without an aborted-transaction index -------------------------------------------
def test_abort_after_delivery_counts_once_per_occurrence() -> None:
    log = Log()
    tracker = TxnTracker()
    first = log.txn(11, 2)
    r1 = filter_batches(log.cut(), 0, isolation_level=READ_COMMITTED, tracker=tracker)  # no aborted list, no LSO
    assert offsets(r1) == first and tracker.delivered_open == {11: 0}
    log.marker(11, commit=False)
    r2 = filter_batches(log.cut(), r1.next_offset, isolation_level=READ_COMMITTED, tracker=tracker)
    assert r2.records == [] and r2.new_aborted_after_delivery == 1 and tracker.aborted_after_delivery == 1
    # the same marker seen again (a re-fetch) does not count twice: nothing of that transaction is open
    again = filter_batches(log.all()[1:], r1.next_offset, isolation_level=READ_COMMITTED, tracker=tracker)
    assert again.new_aborted_after_delivery == 0 and tracker.aborted_after_delivery == 1
    # a second aborted transaction is a second occurrence; a committed one is none
    log.txn(11)
    log.txn(12)
    log.marker(11, commit=False)
    log.marker(12, commit=True)
    r3 = filter_batches(log.cut(), r2.next_offset, isolation_level=READ_COMMITTED, tracker=tracker)
    assert r3.new_aborted_after_delivery == 1 and tracker.aborted_after_delivery == 2
    assert tracker.delivered_open == {}
    assert tracker.warned is False  # logging once is the owner's business


def test_abort_after_delivery_is_not_counted_under_read_uncommitted() -> None:
    log = Log()
    tracker = TxnTracker()
    log.txn(11, 2)
    log.marker(11, commit=False)
    res = filter_batches(log.all(), 0, isolation_level=READ_UNCOMMITTED, tracker=tracker)
    assert offsets(res) == [0, 1] and res.new_aborted_after_delivery == 0 and tracker.aborted_after_delivery == 0


def test_no_count_when_the_broker_lists_the_aborted_transaction() -> None:
    log = Log()
    tracker = TxnTracker()
    log.txn(11, 2)
    log.marker(11, commit=False)
    res = filter_batches(log.all(), 0, isolation_level=READ_COMMITTED, aborted_transactions=[(11, 0)],
                         last_stable_offset=log.next, tracker=tracker)
    assert res.records == [] and res.new_aborted_after_delivery == 0 and tracker.aborted_after_delivery == 0


def test_aborted_transactions_accept_response_structs_and_pairs_alike() -> None:
    log = Log()
    log.txn(1)
    log.txn(2)
    log.marker(1, commit=False)
    log.marker(2, commit=False)
    for listed in ([Aborted(1, 0), Aborted(2, 1)], [(2, 1), (1, 0)]):
        res = filter_batches(log.all(), 0, isolation_level=READ_COMMITTED, aborted_transactions=listed,
                             last_stable_offset=log.next)
        assert res.records == [] and res.aborted_batches == 2 and res.next_offset == 4
