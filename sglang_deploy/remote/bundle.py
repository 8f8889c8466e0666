"""Run several shipped stdlib scripts in ONE Python process, each in a forked child (stdlib only).

Fed on stdin by ``facts._sections_command`` with the scripts' sources appended::

    python3 -I -S - DIR <<'EOF'
    <this file>
    run(MARK, DIR, [(INDEX, SECTION, MODULE, ARGV, SOURCE, SHA256), ...], CACHE)
    EOF

Every script is first loaded as a module of this process (its imports are paid once, not
once per script), then each part runs ``MODULE.main(ARGV)`` in a forked child of its own, all
at the same time: a crash, a timer's ``os._exit`` or a hung driver call in one part cannot
take another part's output with it. A lone part runs in this process itself (there is no
other part to protect, and a fork of a loaded interpreter costs about 4 ms of CPU); its
output goes to ``DIR/INDEX.part`` meanwhile, so that a crash of the process still leaves it
for the shell's fallback. A part's stdout and stderr go to one file, ``DIR/INDEX``, written
whole (a temp name, then a rename) in the section format of ``facts._sections_command``::

    MARK SECTION
    <output>
    MARK rc=N      (N: the part's exit status; 128+signal when a signal ended it)

A script that fails to load (a syntax error on an old python, an import missing) gets its
traceback as its output and rc 1; the other parts still run.

CACHE (a folder, or None) keeps each script's compiled code by the SHA256 of its source and
this interpreter's bytecode tag, so that an unchanged script is not compiled on every run. It
is used only when it is a folder of this user that nobody else can write to (the deploy's
``/run/sglang-deploy/pyc``, root's, 0700); an entry that does not load as code is compiled
again and replaced.
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


def _private_folder(path):
    """PATH made if needed (0700); True when it is a folder of this user that no one else can
    write to (else the cache is not used)."""
    import stat

    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError:
        return False
    return (stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()
            and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def compiled(module, source, digest=None, cache=None):
    """The code object of SOURCE (file name ``MODULE.py``): from CACHE when it holds the one
    for this DIGEST (the source's sha256) and this interpreter, else compiled and kept there
    (other entries of MODULE removed). Any cache problem only costs the compile."""
    import marshal

    path = None
    if digest and cache and _private_folder(cache):
        tag = sys.implementation.cache_tag or "python"
        path = os.path.join(cache, f"{module}-{digest}.{tag}")
        try:
            with open(path, "rb") as fh:
                code = marshal.loads(fh.read())
            if isinstance(code, types.CodeType) and code.co_filename == module + ".py":
                return code
        except (OSError, ValueError, EOFError, TypeError):
            pass
    code = compile(source, module + ".py", "exec")
    if path:
        try:
            for name in os.listdir(cache):
                if name.startswith(module + "-") and name != os.path.basename(path):
                    os.unlink(os.path.join(cache, name))
            fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(marshal.dumps(code))
            os.replace(path + ".tmp", path)
        except OSError:
            pass
    return code


def load(module, source, digest=None, cache=None):
    """Execute SOURCE as a fresh module named MODULE (not ``__main__``: its main() does not run)."""
    mod = types.ModuleType(module)
    mod.__file__ = module + ".py"
    sys.modules[module] = mod
    exec(compiled(module, source, digest, cache), mod.__dict__)  # noqa: S102 (our own script)
    return mod


def exit_status(status):
    """Shell-style exit status of a ``waitpid`` status (128+N for a signal)."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    return 1


def _main_status(mod, argv):
    """Run MOD.main(ARGV) (stdout and stderr already where they must go); its exit status as
    a process would have it: SystemExit's code (its text printed, 1), 1 after an exception
    (its traceback printed)."""
    rc = 1
    try:
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
        sys.stdout.flush()
        sys.stderr.flush()
    return 0 if rc is None else rc if isinstance(rc, int) and 0 <= rc < 256 else 1


def _child(mod, argv, fd):
    """In the forked child: run MOD.main(ARGV) with stdout and stderr on FD; never returns."""
    rc = 1
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        rc = _main_status(mod, argv)
    finally:
        os._exit(rc)


def _run_here(mod, argv, path):
    """Run MOD.main(ARGV) in this process with stdout and stderr on the file PATH (left
    behind if the process dies on the way); returns (output, exit status)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = (os.dup(1), os.dup(2))
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        rc = _main_status(mod, argv)
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])
    out = _read_all(fd)
    os.unlink(path)
    return out, rc


def _read_all(fd):
    """The whole content of FD (read from its start), decoded; FD is closed."""
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks).decode("utf-8", "replace")


def section_text(mark, section, out, rc):
    """The text of one section; the rc marker always starts a line of its own."""
    return f"{mark}{section}\n{out}\n{mark}rc={rc}\n"


def _write(folder, index, text):
    path = os.path.join(folder, str(index))
    with open(path + ".tmp", "w", encoding="utf-8", errors="replace") as fh:
        fh.write(text)
    os.replace(path + ".tmp", path)


def run(mark, folder, parts, cache=None):
    """Load every part's module, run the parts at once in forked children (a lone part in
    this process), write each part's section to FOLDER/INDEX. PARTS: ``(index, section,
    module, argv, source, sha256)`` tuples; CACHE: the compiled-code folder (or None)."""
    running = []
    for index, section, module, argv, source, digest in parts:
        try:
            mod = load(module, source, digest, cache)
        except BaseException:  # noqa: BLE001 (a script that fails to load fails alone)
            import traceback  # not up front: it costs more to import than a part's own work

            _write(folder, index, section_text(mark, section, traceback.format_exc(), 1))
            continue
        running.append((index, section, mod, argv))
    if len(running) == 1:
        index, section, mod, argv = running[0]
        out, rc = _run_here(mod, argv, os.path.join(folder, f"{index}.part"))
        _write(folder, index, section_text(mark, section, out, rc))
        return 0
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
        _write(folder, index, section_text(mark, section, _read_all(fd), exit_status(status)))
    return 0
