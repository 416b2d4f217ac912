"""A value computed once per key for the process, in a store of bounded size."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import TypeVar

T = TypeVar("T")


def kept(store: OrderedDict, key: Hashable, compute: Callable[[], T], bound: int) -> T:
    """``store[key]``, or ``compute()`` kept there the first time; past ``bound``
    entries the least recently used is dropped."""
    if key in store:
        store.move_to_end(key)
        return store[key]
    value = store[key] = compute()
    if len(store) > bound:
        store.popitem(last=False)
    return value
