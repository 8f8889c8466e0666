"""Testbed-only import stand-in for torchvision (see ../_testbed_standin.py)."""
from _testbed_standin import install

install(globals())
