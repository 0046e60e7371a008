"""torch.distributed.checkpoint (the sharded format's ``trainer_dcp/``) read without running code from it.

DCP unpickles its index (``.metadata``) with plain ``pickle.load`` and the non-tensor entries of a state
(optimizer hyper-parameters) with ``torch.load(weights_only=False)``, so a crafted file would run code on
load. :class:`SafeDcpReader` reads the index with an unpickler that allows only DCP's record types
(docs.python.org/3/library/pickle.html, "Restricting Globals"); the planners read the entries with
``weights_only=True``. Imported only where a sharded checkpoint is read (importing DCP takes ~1 s).
"""

from __future__ import annotations

import contextlib
import io
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from digenrl.trainer.checkpoint_files import CheckpointError

#: The globals a DCP ``.metadata`` pickle refers to (torch.distributed.checkpoint.metadata's dataclasses and
#: enums, DCP's storage index, a path, a size, a layout, dtypes): constructors of plain records.
_DCP_METADATA_GLOBALS = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata",
        "MetadataIndex",
        "StorageMeta",
        "BytesStorageMetadata",
        "TensorStorageMetadata",
        "ChunkStorageMetadata",
        "TensorProperties",
        "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"},
    "collections": {"OrderedDict"},
}


class _Refused(pickle.UnpicklingError):
    """A global outside :data:`_DCP_METADATA_GLOBALS` (the message is its name)."""


class _DcpMetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        dtype = getattr(torch, name, None) if module == "torch" else None
        if name in _DCP_METADATA_GLOBALS.get(module, ()) or isinstance(dtype, torch.dtype):
            return super().find_class(module, name)
        raise _Refused(f"{module}.{name}")


def read_dcp_metadata(directory: Path) -> Metadata:
    """The ``.metadata`` of a DCP checkpoint directory, unpickled with only DCP's record types allowed."""
    path = directory / ".metadata"
    if not path.is_file():
        raise CheckpointError(f"{path} is missing (the index of the sharded trainer state)")
    try:
        with path.open("rb") as stream:
            metadata = _DcpMetadataUnpickler(stream).load()
    except _Refused as exc:
        raise CheckpointError(
            f"{path} refers to {exc}, which a DCP index never holds; it was altered or comes from elsewhere, "
            "and loading it could run code: refused"
        ) from None
    except (
        pickle.UnpicklingError,
        EOFError,
        AttributeError,
        TypeError,
        ValueError,
        IndexError,
        KeyError,
    ) as exc:
        raise CheckpointError(f"{path} cannot be read, it is damaged ({type(exc).__name__}: {exc})") from None
    if not isinstance(metadata, Metadata):
        raise CheckpointError(f"{path} holds a {type(metadata).__name__}, not a DCP index; it is damaged")
    return metadata


class SafeDcpReader(FileSystemReader):
    """DCP's file reader with :func:`read_dcp_metadata` instead of ``pickle.load`` for the index, which it
    also reads at once (a refusal comes as itself, not inside DCP's gathered errors)."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(path)
        read_dcp_metadata(Path(path))

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        metadata = read_dcp_metadata(Path(self.path))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id  # as FileSystemReader.read_metadata does
        return metadata


class _WeightsOnlyBytes:
    """DCP's planners unpickle the non-tensor entries (optimizer hyper-parameters, saved with torch.save)
    with ``weights_only=False``; this reads them with :func:`torch.load` ``weights_only=True``."""

    flatten_state_dict: bool
    original_state_dict: dict[str, Any]
    mappings: dict[str, Any]
    state_dict: dict[str, Any]

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        from torch.distributed.checkpoint._traverse import set_element

        fqn = read_item.dest_index.fqn
        try:
            obj = torch.load(value, weights_only=True)
        except pickle.UnpicklingError:
            raise CheckpointError(
                f"the sharded trainer state's entry {fqn!r} holds objects other than tensors and plain data; "
                "it was altered or comes from elsewhere, and loading it could run code: refused"
            ) from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], obj)
        else:
            self.state_dict[fqn] = obj


class SafeDcpPlanner(_WeightsOnlyBytes, DefaultLoadPlanner):
    """DCP's default load planner (fills a template in place) with weights-only non-tensor entries."""


class SafeDcpWholePlanner(_WeightsOnlyBytes, _EmptyStateDictLoadPlanner):
    """DCP's planner that rebuilds the whole state from the index (as ``dcp_to_torch_save``), weights-only."""


@contextlib.contextmanager
def own_errors() -> Iterator[None]:
    """DCP gathers every rank's failure into one CheckpointException; a CheckpointError among them (which
    names the file) is raised as itself."""
    try:
        yield
    except CheckpointException as exc:
        for error, _ in exc.failures.values():
            if isinstance(error, CheckpointError):
                raise error from None
        raise
