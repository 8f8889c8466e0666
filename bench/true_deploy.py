"""Baseline deploy for bench/: connect and run `true` on each host (the cost of connecting)."""

from pyinfra.operations import server

server.shell(name="true", commands=["true"])
