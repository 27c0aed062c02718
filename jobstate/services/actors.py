"""Who made a change: a user, a worker, the system."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Actor:
    label: str
    user: Any = None

    @classmethod
    def worker(cls, worker_id: str) -> Actor:
        return cls(f"worker:{worker_id}")

    @classmethod
    def system(cls, name: str) -> Actor:
        return cls(f"system:{name}")

    @classmethod
    def api(cls, user: Any) -> Actor:
        return cls("api", user)

    @classmethod
    def admin(cls, user: Any) -> Actor:
        return cls("admin", user)

    @classmethod
    def of(cls, actor: Actor | str | Any | None) -> Actor:
        if actor is None:
            return cls("system")
        if isinstance(actor, Actor):
            return actor
        if isinstance(actor, str):
            return cls(actor)
        return cls(f"user:{actor.get_username()}", actor)

    @property
    def user_id(self) -> Any:
        return getattr(self.user, "pk", None)
