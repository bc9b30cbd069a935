"""Loaded models shared by their owners, each placed where its config says: in this process, or
on llama.cpp RPC servers through the pool's one worker process (remote.py)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Optional, Sequence

from ..config import ModelConfig
from .binding import Model
from .remote import RemoteModel, Worker


class ModelPool:
    """Loaded models that several owners share, so each file's weights are mapped once.

    ``get`` returns the model of a file placed so (loading it the first time) and counts the
    owner; ``release`` forgets one owner and frees the model with the last.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._models: dict = {}  # (path, n_gpu_layers, rpc, tensor_split) -> [Model, owners]
        self._retired: list = []  # [Model, owners] of models whose RPC servers failed, until let go
        self._worker: Optional[Worker] = None  # decodes the models placed on RPC servers (see remote.py)

    def get(self, path: Path, n_gpu_layers: int = 0, rpc: Sequence[str] = (), tensor_split: Sequence[float] = (),
            timeout: float = ModelConfig.rpc_timeout) -> Model:
        """The model of ``path``: its layers on RPC servers (``rpc``, HOST:PORT each, shared as
        ``tensor_split`` says) when given, else in this process. A model whose servers failed is
        loaded again."""
        with self._lock:
            key = (Path(path).resolve(), n_gpu_layers, tuple(rpc), tuple(tensor_split))
            entry = self._models.get(key)
            if entry is not None and entry[0].broken:
                self._retired.append(self._models.pop(key))
                entry = None
            if entry is None:
                model = (RemoteModel(path, n_gpu_layers, rpc, tensor_split, timeout, self._worker_for_rpc()) if rpc
                         else Model(path, n_gpu_layers, tensor_split=tensor_split))
                entry = self._models[key] = [model, 0]
            entry[1] += 1
            return entry[0]

    def _worker_for_rpc(self) -> Worker:
        """The pool's worker, a new one where it has none, or where it failed or quit."""
        if self._worker is None or self._worker.broken:
            self._worker = Worker()
        return self._worker

    def release(self, model: Model) -> None:
        with self._lock:
            for key, entry in list(self._models.items()):
                if entry[0] is model:
                    entry[1] -= 1
                    if entry[1] == 0:
                        del self._models[key]
                        model.close()
                    return
            for entry in self._retired:
                if entry[0] is model:
                    entry[1] -= 1
                    if entry[1] == 0:
                        self._retired.remove(entry)
                        model.close()
                    return
