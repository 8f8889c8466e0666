"""remote/bundle.py through facts._sections_command: several scripts in one Python process,
each part in a forked child of its own, run for real with sh and this machine's python."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from sglang_deploy.shell.facts import Script, _parse_sections, _sections_command


def _script(tmp_path, name: str, body: str) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


def _run(sections: dict, python: str = sys.executable, cache: str | None = None) -> dict:
    cmd = _sections_command(sections, python=python, code_cache=cache)
    out = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=120,
                         check=False).stdout
    return _parse_sections(out.splitlines())


LOADS = """
    import os, sys
    with open(os.environ.get("BUNDLE_TEST_LOG", "/dev/null"), "a") as fh:
        fh.write(__name__ + " loaded in " + str(os.getpid()) + "\\n")
"""


def test_each_part_gets_its_own_section_and_exit_status(tmp_path, monkeypatch):
    log = tmp_path / "loads.log"
    monkeypatch.setenv("BUNDLE_TEST_LOG", str(log))
    ok = _script(tmp_path, "ok", LOADS + """
    def main(argv):
        print("args", argv)
        print("to stderr", file=sys.stderr)
        return 0
    """)
    fails = _script(tmp_path, "fails", LOADS + """
    def main(argv):
        print("partial")
        raise ValueError("boom")
    """)
    exits = _script(tmp_path, "exits", """
    import sys
    def main(argv):
        sys.exit("bad usage")
    """)
    code = _script(tmp_path, "code", """
    import os
    def main(argv):
        print("before", flush=True)
        os._exit(7)
    """)
    crash = _script(tmp_path, "crash", """
    import os, signal
    def main(argv):
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    big = _script(tmp_path, "big", """
    def main(argv):
        print("y" * 300000)  # more than a pipe holds
    """)
    secs = _run({"a": Script(ok, ("--x", "1 2")), "shell": "echo from shell",
                 "b": Script(fails), "c": Script(exits), "d": Script(code),
                 "e": Script(crash), "f": Script(big)})
    assert list(secs) == ["a", "shell", "b", "c", "d", "e", "f"]
    assert secs["a"]["rc"] == 0  # stdout is block-buffered, stderr not: as with `2>&1` in sh
    assert sorted(secs["a"]["out"].splitlines()) == ["args ['--x', '1 2']", "to stderr"]
    assert secs["shell"] == {"out": "from shell\n", "rc": 0}
    assert secs["b"]["rc"] == 1
    assert secs["b"]["out"].startswith("partial\nTraceback")
    assert "ValueError: boom" in secs["b"]["out"]
    assert secs["c"] == {"out": "bad usage\n", "rc": 1}
    assert secs["d"] == {"out": "before\n", "rc": 7}
    assert secs["e"] == {"out": "", "rc": 128 + 9}
    assert secs["f"] == {"out": "y" * 300000 + "\n", "rc": 0}
    # each script was loaded once, in the one parent process (the parts run in its children)
    loads = log.read_text().splitlines()
    assert sorted(line.split()[0] for line in loads) == ["fails", "ok"]
    assert len({line.split()[-1] for line in loads}) == 1


def test_a_script_that_does_not_load_fails_alone(tmp_path):
    broken = _script(tmp_path, "broken", "def main(argv:\n")
    ok = _script(tmp_path, "fine", "def main(argv):\n    print('fine')\n")
    secs = _run({"x": Script(broken), "y": Script(ok)})
    assert secs["x"]["rc"] == 1 and "SyntaxError" in secs["x"]["out"]
    assert secs["y"] == {"out": "fine\n", "rc": 0}


def test_the_parts_run_at_the_same_time(tmp_path):
    """Each part waits for the other's flag file: run one after the other, the first would
    give up at its deadline and fail."""
    body = """
    import os, time
    def main(argv):
        mine, theirs = argv
        open(mine, "w").close()
        deadline = time.monotonic() + 60
        while not os.path.exists(theirs):
            if time.monotonic() > deadline:
                print("the other part never ran alongside")
                return 1
            time.sleep(0.01)
        print("met")
        return 0
    """
    a, b = str(tmp_path / "a.flag"), str(tmp_path / "b.flag")
    secs = _run({"one": Script(_script(tmp_path, "one", body), (a, b)),
                 "two": Script(_script(tmp_path, "two", body), (b, a))})
    assert secs == {"one": {"out": "met\n", "rc": 0}, "two": {"out": "met\n", "rc": 0}}


def test_without_the_python_the_script_sections_say_why(tmp_path):
    ok = _script(tmp_path, "fine", "def main(argv):\n    print('fine')\n")
    secs = _run({"x": Script(ok), "shell": "echo still here"},
                python=str(tmp_path / "no-such-python3"))
    assert secs["x"]["rc"] == 127
    assert "no-such-python3" in secs["x"]["out"]
    assert secs["shell"] == {"out": "still here\n", "rc": 0}


def test_a_python_that_writes_no_section_gives_its_own_output_and_status(tmp_path):
    fake = tmp_path / "python3"
    fake.write_text("#!/bin/sh\ncat >/dev/null\necho 'this python is broken' >&2\nexit 5\n")
    fake.chmod(0o755)
    ok = _script(tmp_path, "fine", "def main(argv):\n    print('fine')\n")
    secs = _run({"x": Script(ok), "y": Script(ok), "shell": "echo still here"}, python=str(fake))
    assert secs["x"] == secs["y"] == {"out": "this python is broken\n", "rc": 5}
    assert secs["shell"] == {"out": "still here\n", "rc": 0}


# ------------------------------------------------------------------ a lone part, in-process
PID_PART = LOADS + """
    def main(argv):
        print("main in", os.getpid())
        return 0
"""


def test_a_lone_part_runs_in_the_bundle_process_itself(tmp_path, monkeypatch):
    log = tmp_path / "loads.log"
    monkeypatch.setenv("BUNDLE_TEST_LOG", str(log))
    lone = _script(tmp_path, "lone", PID_PART)
    secs = _run({"p": Script(lone), "shell": "echo from shell"})
    assert secs["shell"] == {"out": "from shell\n", "rc": 0} and secs["p"]["rc"] == 0
    loaded_in = log.read_text().split()[-1]
    assert secs["p"]["out"] == f"main in {loaded_in}\n"  # no fork: main ran where it loaded
    # two parts: each main in a child of its own
    log.write_text("")
    other = _script(tmp_path, "other", PID_PART)
    secs = _run({"p": Script(lone), "q": Script(other)})
    parent = {line.split()[-1] for line in log.read_text().splitlines()}
    pids = {secs[k]["out"].split()[-1] for k in ("p", "q")}
    assert len(parent) == 1 and len(pids) == 2 and not pids & parent


LONE_OUTCOMES = {
    # body of main: the section it must give, as a forked part gives it
    'print("args", argv, flush=True)\nprint("to stderr", file=sys.stderr)\nreturn 3':
        {"out": "args ['--x', '1 2']\nto stderr\n", "rc": 3},
    'print("partial")\nraise ValueError("boom")': ("partial\nTraceback", 1),
    'sys.exit("bad usage")': {"out": "bad usage\n", "rc": 1},
    'print("before", flush=True)\nos._exit(7)': {"out": "before\n", "rc": 7},
    'os.kill(os.getpid(), signal.SIGKILL)': {"out": "", "rc": 128 + 9},
    'print("y" * 300000)': {"out": "y" * 300000 + "\n", "rc": 0},
}


def test_a_lone_part_ends_as_a_forked_part_would(tmp_path):
    """Exit codes, an exception, SystemExit with text, os._exit (the process ends before it
    writes the section: the shell's fallback gives what the part printed), a signal, and
    more output than a pipe holds."""
    for i, (body, want) in enumerate(LONE_OUTCOMES.items()):
        main = "\n    ".join(["def main(argv):", *body.splitlines()])
        script = _script(tmp_path, f"lone{i}", f"import os, signal, sys\n{main}\n")
        got = _run({"p": Script(script, ("--x", "1 2"))})["p"]
        if isinstance(want, tuple):
            assert got["out"].startswith(want[0]) and got["rc"] == want[1], (body, got)
            assert "ValueError: boom" in got["out"]
        else:
            assert got == want, (body, got)
        assert not list(tmp_path.glob("*.part"))


# ------------------------------------------------------------------ the compiled-code cache
def _digest(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()


def test_compiled_code_is_kept_by_source_digest_and_used(tmp_path):
    import marshal
    from pathlib import Path

    cache = tmp_path / "pyc"
    source = "def main(argv):\n    print('from source')\n"
    script = _script(tmp_path, "cached", source)
    assert _run({"p": Script(script)}, cache=str(cache))["p"] == {"out": "from source\n", "rc": 0}
    tag = sys.implementation.cache_tag
    entry = cache / f"cached-{_digest(source)}.{tag}"
    assert [e.name for e in cache.iterdir()] == [entry.name]
    assert cache.stat().st_mode & 0o777 == 0o700 and entry.stat().st_mode & 0o777 == 0o600
    # the entry is what runs: other code under the same digest
    entry.write_bytes(marshal.dumps(compile("def main(argv):\n    print('from cache')\n",
                                            "cached.py", "exec")))
    assert _run({"p": Script(script)}, cache=str(cache))["p"]["out"] == "from cache\n"
    # a damaged entry is compiled again and replaced
    entry.write_bytes(b"not marshal data")
    assert _run({"p": Script(script)}, cache=str(cache))["p"]["out"] == "from source\n"
    assert marshal.loads(entry.read_bytes()).co_filename == "cached.py"
    # a changed script gets an entry of its own, and the old one goes
    Path(script).write_text("def main(argv):\n    print('v2')\n")
    assert _run({"p": Script(script)}, cache=str(cache))["p"]["out"] == "v2\n"
    assert [e.name for e in cache.iterdir()] == [
        f"cached-{_digest(Path(script).read_text())}.{tag}"]


def test_a_cache_folder_others_can_write_to_is_not_used(tmp_path):
    cache = tmp_path / "pyc"
    cache.mkdir()
    cache.chmod(0o777)
    script = _script(tmp_path, "shared", "def main(argv):\n    print('ok')\n")
    assert _run({"p": Script(script)}, cache=str(cache))["p"] == {"out": "ok\n", "rc": 0}
    assert list(cache.iterdir()) == []
    assert _run({"p": Script(script)}, cache=None)["p"] == {"out": "ok\n", "rc": 0}
