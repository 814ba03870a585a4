"""The error of a model's configuration: one thing wrong with it, and where. Its own module, so that
the modules that check a part of a configuration (model I/O, warmup) and the one that reads it
(config) all import it without importing each other."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ConfigProblem(Exception):
    """One thing wrong with a model's configuration."""

    path: str
    field: str
    message: str

    def __str__(self) -> str:
        where = f"{self.path}: {self.field}: " if self.field else f"{self.path}: "
        return where + self.message
