"""Tokens (``service.auth`` over ``service.storage.tokens``) on SQLite and PostgreSQL: created
hashed, found by the secret, bound to one runner name, counted, listed without hashes,
revoked."""

from __future__ import annotations

import functools

import pytest
from queue_store import QueueStore

from service.auth import (
    Principal,
    Role,
    bind_runner,
    count_tokens,
    create_token,
    list_tokens,
    lookup_principal,
    lookup_token,
    revoke_token,
)
from service.core.errors import Forbidden


def test_tokens_on_either_backend(queue_store: QueueStore) -> None:
    db = queue_store.open()
    admin = db.write(functools.partial(create_token, role=Role.ADMIN))
    first = db.write(functools.partial(create_token, role=Role.RUNNER, name="a"))
    second = db.write(functools.partial(create_token, role=Role.RUNNER, name="b"))
    assert db.write(lambda c: lookup_token(c, admin)) is Role.ADMIN
    assert db.write(lambda c: lookup_token(c, "cpt_unknown")) is None
    one = db.write(lambda c: lookup_principal(c, first))
    two = db.write(lambda c: lookup_principal(c, second))
    assert isinstance(one, Principal) and one.role is Role.RUNNER and one.runner is None
    assert isinstance(two, Principal)
    db.write(lambda c: bind_runner(c, one, "gpu-1"))
    bound = db.write(lambda c: lookup_principal(c, first))
    assert bound is not None and bound.runner == "gpu-1"
    with pytest.raises(Forbidden, match="belongs to another token"):
        db.write(lambda c: bind_runner(c, two, "gpu-1"))
    assert db.write(lambda c: count_tokens(c)) == 3
    assert db.write(lambda c: count_tokens(c, Role.RUNNER)) == 2
    listed = db.write(list_tokens)
    assert [t["name"] for t in listed] == ["admin", "a", "b"]
    assert all("token_hash" not in t for t in listed)
    assert db.write(lambda c: revoke_token(c, one.token_id))
    assert not db.write(lambda c: revoke_token(c, one.token_id))
    assert db.write(lambda c: lookup_token(c, first)) is None
