"""Name -> class tables for the pieces users extend (decoding policies and caches, training
objectives): a new piece is one class with a `name` plus one `register` call."""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Generic, TypeVar

from jaxdllm.errors import ConfigError
from jaxdllm.validation import check_fields

T = TypeVar("T")


class Registry(dict, Generic[T]):
    """A dict from `cls.name` to `cls`. `what` names the setting in errors (e.g. "policy")."""

    def __init__(self, what: str):
        super().__init__()
        self.what = what

    def register(self, cls: type[T]) -> type[T]:
        """Add `cls` under `cls.name`; returns `cls` (usable as a decorator)."""
        if not getattr(cls, "name", ""):
            raise ConfigError(f"{cls.__name__} needs a class attribute `name`")
        self[cls.name] = cls
        return cls

    def lookup(self, name: str) -> type[T]:
        """The class registered as `name`; an unknown name is a `ConfigError` listing the known ones."""
        if name not in self:
            raise ConfigError(f"{self.what} must be one of {tuple(self)}, got {name!r}")
        return self[name]


class Settings:
    """Mixin for the frozen dataclasses whose fields are user settings (policies, caches,
    objectives). Their types are checked at construction; subclasses with their own
    `__post_init__` call `super().__post_init__()` first. `role` names the kind in errors."""

    role: ClassVar[str] = "setting"

    def __post_init__(self):
        check_fields(self, self.where())

    @classmethod
    def where(cls) -> str:
        """The prefix naming this piece in error messages."""
        return f"{cls.role} {getattr(cls, 'name', '')!r}: "

    @classmethod
    def settings(cls) -> tuple[str, ...]:
        """The names of this class's settings (its dataclass fields)."""
        return tuple(f.name for f in dataclasses.fields(cls))
