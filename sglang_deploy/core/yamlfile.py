"""YAML data files read safely, each value with the line that set it (pure: text in, values out).

``parse(text, name)`` returns ``(value, lines)``: plain Python values (mappings, lists,
scalars: PyYAML's safe types) and ``lines``, the 1-based line of every mapping key by its
path (a tuple of keys from the top). Anything that is not plain data is a ``DataError`` that
names ``FILE:LINE``, what was expected and the fix, before anything connects:

- a syntax error, a tab in the indentation (PyYAML's own message and mark);
- a key given twice in one mapping (PyYAML keeps the last one silently; Ansible warns);
- a tag beyond the safe ones (``!vault``, ``!unsafe``, ``!!python/...``);
- a merge key ``<<`` (Ansible-only YAML 1.1 feature; write the values out);
- an alias that refers to itself (an anchor loop) or aliases that expand past
  ``MAX_NODES`` values (a "billion laughs" bomb);
- a file larger than ``MAX_BYTES`` (checked by the reader before parsing, ``check_size``).
"""

from __future__ import annotations

from typing import Any

import yaml

from sglang_deploy.core.errors import DataError

#: a data file larger than this is refused before it is parsed (a host's data is kilobytes)
MAX_BYTES = 1024 * 1024
#: values (after alias expansion) one file may hold
MAX_NODES = 100_000

Path_ = tuple[Any, ...]  # a key path: ("sglang_flags", "tp-size")


def _error(name: str, line: int | None, what: str, found: str, fix: str) -> DataError:
    err = DataError(what=what, found=found, fix=fix)
    err.where = f"{name}:{line}" if line else name
    return err


def check_size(name: str, size: int) -> None:
    if size > MAX_BYTES:
        raise _error(name, None, f"a YAML data file of at most {MAX_BYTES // 1024} KiB",
                     f"{size} bytes", "split the data or remove what is not data (a host's "
                     "data is a few kilobytes)")


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader; composing only (values are built by ``_Builder``)."""


def _line(node: yaml.Node) -> int:
    line: int = node.start_mark.line + 1
    return line


class _Builder:
    def __init__(self, loader: _Loader, name: str) -> None:
        self.loader, self.name = loader, name
        self.lines: dict[Path_, int] = {}
        self.count = 0
        self.active: set[int] = set()

    def build(self, node: yaml.Node, path: Path_) -> Any:
        self.count += 1
        if self.count > MAX_NODES:
            raise _error(self.name, _line(node), f"at most {MAX_NODES} values in one file",
                         "more (aliases that expand to a huge document: an alias bomb)",
                         "remove the anchors (&name) and aliases (*name); write the values out")
        if id(node) in self.active:
            raise _error(self.name, _line(node), "plain data (no value that contains itself)",
                         "an alias inside its own anchor (an anchor loop)",
                         "remove the alias (*name) that refers to the value around it")
        if isinstance(node, yaml.ScalarNode):
            return self._scalar(node)
        self.active.add(id(node))
        try:
            if isinstance(node, yaml.SequenceNode):
                self._tag(node, "tag:yaml.org,2002:seq")
                return [self.build(item, path + (i,)) for i, item in enumerate(node.value)]
            self._tag(node, "tag:yaml.org,2002:map")
            return self._mapping(node, path)
        finally:
            self.active.discard(id(node))

    def _tag(self, node: yaml.Node, expected: str) -> None:
        if node.tag != expected:
            raise _error(self.name, _line(node), "plain YAML data (no tags)",
                         f"the tag {node.tag}",
                         "remove the tag; secrets are never in data files: name the controller "
                         "environment variable that holds one (`*_env` keys)")

    def _scalar(self, node: yaml.Node) -> Any:
        try:
            return self.loader.construct_object(node, deep=True)
        except yaml.constructor.ConstructorError as exc:
            raise _error(self.name, _line(node), "plain YAML data (strings, numbers, "
                         "true/false, null, lists, mappings)", " ".join(str(exc.problem).split()),
                         "remove the tag (Ansible's !vault and !unsafe are not read: secrets "
                         "are named by `*_env` keys, read from the controller's environment)"
                         ) from None

    def _mapping(self, node: yaml.Node, path: Path_) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            line = _line(key_node)
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise _error(self.name, line, "plain mappings (no merge key `<<`)",
                             "a merge key `<<`", "write the merged values out in this mapping")
            if not isinstance(key_node, yaml.ScalarNode):
                raise _error(self.name, line, "a string, number or true/false as a key",
                             "a list or mapping as a key", "use a plain key")
            key = self._scalar(key_node)
            if key in out:
                first = self.lines.get(path + (key,))
                raise _error(self.name, line, "each key once in a mapping",
                             f"`{key}` again (first at line {first})",
                             "remove one of them (YAML would keep the last silently)")
            self.lines[path + (key,)] = line
            out[key] = self.build(value_node, path + (key,))
        return out


def parse(text: str, name: str) -> tuple[Any, dict[Path_, int]]:
    """TEXT (the file NAME) -> (its value, the line of every mapping key by path). An empty
    file is ``None``. Raises ``DataError`` (with ``where`` = NAME:LINE) for anything but
    plain data."""
    check_size(name, len(text.encode()))
    loader = _Loader(text)
    try:
        try:
            node = loader.get_single_node()
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            problem = " ".join(str(exc.problem or exc).split())
            fix = "fix the YAML syntax there"
            if "\t" in text and "tab" in problem:
                fix = "indent with spaces, never tabs"
            raise _error(name, mark.line + 1 if mark else None, "valid YAML", problem,
                         fix) from None
        except yaml.YAMLError as exc:
            raise _error(name, None, "valid YAML", " ".join(str(exc).split()),
                         "fix the YAML syntax") from None
        if node is None:
            return None, {}
        builder = _Builder(loader, name)
        value = builder.build(node, ())
        return value, builder.lines
    finally:
        loader.dispose()
