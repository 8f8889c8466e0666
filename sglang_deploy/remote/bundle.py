"""Run several shipped stdlib scripts in ONE Python process, each in a forked child (stdlib only).

Fed on stdin by ``facts._sections_command`` with the scripts' sources appended::

    python3 -I -S - DIR <<'EOF'
    <this file>
    run(MARK, DIR, [(INDEX, SECTION, MODULE, ARGV, SOURCE), ...])
    EOF

Every script is first loaded as a module of this process (its imports are paid once, not
once per script), then each part runs ``MODULE.main(ARGV)`` in a forked child of its own, all
at the same time: a crash, a timer's ``os._exit`` or a hung driver call in one part cannot
take another part's output with it. A part's stdout and stderr go to one file, ``DIR/INDEX``,
written whole (a temp name, then a rename) in the section format of
``facts._sections_command``::

    MARK SECTION
    <output>
    MARK rc=N      (N: the part's exit status; 128+signal when a signal ended it)

A script that fails to load (a syntax error on an old python, an import missing) gets its
traceback as its output and rc 1; the other parts still run.
"""

import os
import sys
import types


def _capture_file():
    """An anonymous file for a child's output (memfd on Linux, a deleted temp file elsewhere)."""
    if hasattr(os, "memfd_create"):
        return os.memfd_create("sglang-deploy-part")
    import tempfile

    return os.dup(tempfile.TemporaryFile().fileno())


def load(module, source):
    """Execute SOURCE as a fresh module named MODULE (not ``__main__``: its main() does not run)."""
    mod = types.ModuleType(module)
    mod.__file__ = module + ".py"
    sys.modules[module] = mod
    exec(compile(source, module + ".py", "exec"), mod.__dict__)  # noqa: S102 (our own script)
    return mod


def exit_status(status):
    """Shell-style exit status of a ``waitpid`` status (128+N for a signal)."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    return 1


def _child(mod, argv, fd):
    """In the forked child: run MOD.main(ARGV) with stdout and stderr on FD; never returns."""
    rc = 1
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        sys.argv = [mod.__file__] + list(argv)
        rc = mod.main(list(argv))
    except SystemExit as exc:
        rc = exc.code
        if rc is not None and not isinstance(rc, int):
            sys.stdout.flush()
            sys.stderr.write(f"{rc}\n")
            rc = 1
    except BaseException:  # noqa: BLE001 (the part's own bug: its traceback is its output)
        import traceback

        sys.stdout.flush()  # what it printed, then how it ended
        traceback.print_exc()
        rc = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(0 if rc is None else rc if isinstance(rc, int) and 0 <= rc < 256 else 1)


def section_text(mark, section, out, rc):
    """The text of one section; the rc marker always starts a line of its own."""
    return f"{mark}{section}\n{out}\n{mark}rc={rc}\n"


def _write(folder, index, text):
    path = os.path.join(folder, str(index))
    with open(path + ".tmp", "w", encoding="utf-8", errors="replace") as fh:
        fh.write(text)
    os.replace(path + ".tmp", path)


def run(mark, folder, parts):
    """Load every part's module, run the parts at once in forked children, write each part's
    section to FOLDER/INDEX. PARTS: ``(index, section, module, argv, source)`` tuples."""
    running = []
    for index, section, module, argv, source in parts:
        try:
            mod = load(module, source)
        except BaseException:  # noqa: BLE001 (a script that fails to load fails alone)
            import traceback  # not up front: it costs more to import than a part's own work

            _write(folder, index, section_text(mark, section, traceback.format_exc(), 1))
            continue
        running.append((index, section, mod, argv))
    children = []
    for index, section, mod, argv in running:
        fd = _capture_file()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(mod, argv, fd)
        children.append((index, section, pid, fd))
    for index, section, pid, fd in children:
        _, status = os.waitpid(pid, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
        os.close(fd)
        out = b"".join(chunks).decode("utf-8", "replace")
        _write(folder, index, section_text(mark, section, out, exit_status(status)))
    return 0
