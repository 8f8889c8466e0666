"""Testbed-only import stand-in for torch (see ../_testbed_standin.py)."""
from _testbed_standin import install

install(globals())
