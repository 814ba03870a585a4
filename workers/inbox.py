"""The worker's one reader of its socket, in a thread of its own.

Batches and STOP go to the main loop; the answers to a model's own requests (BLS, model control) go
to the thread that waits for them, however many wait at once; a client's cancellation reaches the
request it names while the model is still executing it.
"""

from __future__ import annotations

import itertools
import queue
import socket
import threading

from tritonmp.ipc import transport


class Inbox:
    def __init__(self, sock: socket.socket):
        self.reader = transport.MessageReader(sock)
        self.main: queue.SimpleQueue = queue.SimpleQueue()  # (kind, header, frames), None when the frontend has gone
        self.lock = threading.Lock()
        self.calls: dict[int, queue.SimpleQueue] = {}  # call number -> its answers (BlsResult, frames)
        self.cancel_flags: dict[tuple[int, int], threading.Event] = {}  # (batch id, index) -> set on CANCEL
        self.closed = False
        self._numbers = itertools.count(1)
        threading.Thread(target=self._run, name="worker-inbox", daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                message = self.reader.read()
            except OSError:  # the socket was closed under us: the worker is exiting
                message = None
            if message is None:
                break
            kind, header, frames = transport.unpack(message)
            if kind == transport.BLS_RESULT:
                result = transport.decode(transport.BlsResult, header)
                with self.lock:
                    answers = self.calls.get(result.call)
                if answers is not None:
                    answers.put((result, frames))
            elif kind == transport.CANCEL:
                cancel = transport.decode(transport.Cancel, header)
                with self.lock:
                    flag = self.cancel_flags.get((cancel.batch_id, cancel.index))
                if flag is not None:
                    flag.set()
            else:
                self.main.put((kind, header, frames))
        with self.lock:
            self.closed = True
            for answers in self.calls.values():
                answers.put(None)
        self.main.put(None)

    # -- the main loop ---------------------------------------------------------------------
    def next(self):
        """The next batch or STOP, as (kind, header, frames); None when the frontend has gone."""
        return self.main.get()

    # -- a model's own requests ------------------------------------------------------------
    def open_call(self) -> tuple[int, queue.SimpleQueue]:
        """A number for a new call and the queue its answers arrive on (None there: the frontend has
        gone)."""
        answers: queue.SimpleQueue = queue.SimpleQueue()
        with self.lock:
            if self.closed:
                answers.put(None)
            number = next(self._numbers)
            self.calls[number] = answers
        return number, answers

    def close_call(self, number: int) -> None:
        with self.lock:
            self.calls.pop(number, None)

    # -- cancellation ----------------------------------------------------------------------
    def cancel_flag(self, batch_id: int, index: int) -> threading.Event:
        flag = threading.Event()
        with self.lock:
            self.cancel_flags[(batch_id, index)] = flag
        return flag

    def forget(self, batch_id: int, index: int) -> None:
        """The request has ended: a late cancellation has nothing to reach."""
        with self.lock:
            self.cancel_flags.pop((batch_id, index), None)
