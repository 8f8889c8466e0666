"""torch.multiprocessing of the testbed's all-reduce stand-in: the stdlib's, as torch's
re-exports it."""

from multiprocessing import get_context  # noqa: F401
