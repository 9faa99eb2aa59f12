"""Devices: validation of a node's device and moving messages between devices.

Only the CPU and CUDA devices are supported (see docs/threads.md). Nothing here
touches CUDA unless a CUDA device is actually named, so importing the package
never initialises CUDA.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["validate_device", "to_device"]


def validate_device(device: Any, *, owner: str = "node") -> torch.device:
    """Turn a node's ``device`` argument into a fixed ``torch.device``.

    Args:
        device (str | torch.device): ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or a
            ``torch.device`` of those types.
        owner (str): what the device is for, used in error messages.

    Returns:
        torch.device: ``cpu`` (without index) or ``cuda:N`` with an explicit
        index. ``"cuda"`` without an index is fixed to the host's current CUDA
        device at this moment, so a later ``torch.cuda.set_device`` does not
        move the node.

    Raises:
        TypeError: ``device`` is neither a string nor a ``torch.device``.
        ValueError: the string is not a device, the device type is neither CPU
            nor CUDA (``"mps"``, ``"meta"``, ...), CUDA is not available, or the
            CUDA index is out of range.
    """
    if not isinstance(device, (str, torch.device)):
        raise TypeError(
            f"{owner}: device must be a str or torch.device, got {type(device).__name__}"
        )
    try:
        dev = torch.device(device)
    except RuntimeError as exc:
        raise ValueError(f"{owner}: {device!r} is not a device: {exc}") from None
    if dev.type == "cpu":
        return torch.device("cpu")
    if dev.type != "cuda":
        raise ValueError(
            f"{owner}: device {str(dev)!r} is not supported; use 'cpu' or a CUDA device"
        )
    if not torch.cuda.is_available():
        raise ValueError(f"{owner}: device {str(dev)!r} asked for, but CUDA is not available")
    index = torch.cuda.current_device() if dev.index is None else dev.index
    count = torch.cuda.device_count()
    if not 0 <= index < count:
        raise ValueError(
            f"{owner}: device {str(dev)!r} does not exist; this host has {count} CUDA device(s)"
        )
    return torch.device("cuda", index)


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Return ``tensor`` on ``device``, copying only when it is elsewhere.

    The CUDA stream routing (which stream copies, which event readers wait on)
    belongs to the CUDA work; on the CPU this is a plain ``Tensor.to``.

    Args:
        tensor (torch.Tensor): a message's tensor, any shape.
        device (torch.device): the reader's device.

    Returns:
        torch.Tensor: ``tensor`` itself when it already lies on ``device``.
    """
    if tensor.device == device:
        return tensor
    return tensor.to(device)
