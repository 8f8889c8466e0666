"""torch.multiprocessing of the fake torch: the stdlib's (as torch's re-exports it)."""

from multiprocessing import get_context  # noqa: F401
