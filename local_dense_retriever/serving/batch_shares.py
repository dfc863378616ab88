"""Which queries make the next batch: fair shares of its queries and tokens over the waiting requests, with long
queries batched apart from questions. A function of what waits, so that the batcher's workers only lock, call it and
run what it chose.
"""

from typing import Protocol

# A query over LONG_QUERY_TOKENS is long (a question takes 6-65). Long queries are batched apart from the others, at
# most 1/LONG_BATCH_SHARE of the token bound a batch, so a question waits for at most a short batch of them.
LONG_QUERY_TOKENS = 128
LONG_BATCH_SHARE = 4


class Waiting(Protocol):
    """A request waiting for its queries to be batched (the batcher's _Pending)."""

    next_query: int  # queries before this one are in a batch already

    @property
    def unbatched(self) -> int: ...

    def cost(self, query: int) -> int: ...


def share_batch(waiting: list[Waiting], room: int, token_room: float, last_long: bool) -> tuple[dict, bool]:
    """The next batch: a fair share of `room` queries and `token_room` tokens over the waiting requests, in rounds:
    each request gets an equal part of what is left of both, capped by what it has, and the parts it leaves go to the
    others in the next round. A request's queries are taken in order; one that has nothing in the batch yet may take
    its next query over its part of the tokens if it fits in what is left (so a request of long queries still gets
    one in), and a batch holds at least one query, even one over token_room.

    A batch holds long queries (LONG_QUERY_TOKENS) or the others, not both: the kind the last batch did not hold
    when both wait, so they take turns; a batch of long ones at most 1/LONG_BATCH_SHARE of token_room. A request
    stops at a query of the other kind.

    Returns how many of its next queries each request gives the batch, and whether they are long ones (the batch
    after it takes the other kind when both wait: `last_long`).
    """
    takes = dict.fromkeys(waiting, 0)
    batched = 0

    def next_cost(item: Waiting) -> int:
        return item.cost(item.next_query + takes[item])

    def take(item: Waiting) -> None:
        nonlocal batched, token_room
        token_room -= next_cost(item)
        takes[item] += 1
        batched += 1

    def same_kind(item: Waiting) -> bool:
        return (next_cost(item) > LONG_QUERY_TOKENS) == long_batch

    kinds = {next_cost(item) > LONG_QUERY_TOKENS for item in waiting}
    long_batch = not last_long if len(kinds) == 2 else kinds == {True}
    if long_batch:
        token_room /= LONG_BATCH_SHARE
    open_ = waiting
    while batched < room and open_:
        share, token_share = max(1, (room - batched) // len(open_)), token_room / len(open_)
        before = batched
        for item in open_:
            most, part = min(share, item.unbatched - takes[item]), 0
            while most and batched < room:
                cost = next_cost(item)
                # the batch's first query always fits; a request's first may go over its part of the tokens
                if (
                    not same_kind(item)
                    or (cost > token_room and batched)
                    or (part + cost > token_share and takes[item])
                ):
                    break
                take(item)
                most, part = most - 1, part + cost
        open_ = [
            item
            for item in open_
            if item.unbatched > takes[item] and next_cost(item) <= token_room and same_kind(item)
        ]
        if batched == before and open_:  # no next query fitted its request's part: the first that fits the rest
            take(open_[0])
    return takes, long_batch
