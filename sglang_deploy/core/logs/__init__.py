"""The log reader: a server log (journal, server.log, an excerpt) read into phases, an
outcome, a cause and its fix. ``parse`` (the verifier's startup tracker) with ``prefix``
(timestamps and rank prefixes), ``markers`` (the phase lines), ``causes`` and ``fixes`` (what
went wrong and what to do), ``excerpt`` (the lines that prove it); ``explain`` on top
(`sglang-deploy explain-log`)."""
