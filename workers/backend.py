"""What the worker loop hands a backend, and what a backend hands back."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class WorkTensor:
    name: str
    datatype: str
    array: np.ndarray
    in_place: bool = False  # already written into its output buffer


@dataclass
class WorkRequest:
    id: str
    inputs: list[WorkTensor]
    outputs: list[str]  # requested output names; empty means all
    parameters: dict = field(default_factory=dict)
    batch_sizes: list[int] = field(default_factory=list)
    sender: object = None  # decoupled models: send(WorkResponse | None, final: bool)
    # outputs the client wants in its system shared memory: name -> the writable window there, so a
    # backend that can write its output in place saves a copy
    output_buffers: dict = field(default_factory=dict)


@dataclass
class WorkResponse:
    outputs: list[WorkTensor] = field(default_factory=list)
    error: str = ""
    error_status: str = "INTERNAL"


class BackendError(Exception):
    """A failure of a whole batch, reported to every request in it."""
