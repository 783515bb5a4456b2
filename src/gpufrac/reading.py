"""Reading the files a person hands gpufrac (manifests, kubeconfigs, scenarios, traces) within bounds.

Every file is read with a bounded read, never by trusting its size: `/dev/zero` and a pipe report size 0
and never end. YAML is read by a loader that bounds what a small text can make a large one: nesting depth
(the composer recurses), what aliases expand to (a "billion laughs" is a few hundred bytes), aliases inside
their own anchor (a structure that contains itself), and the digits of an integer (Python refuses to
convert more than 4,300, and nothing gpufrac reads needs more than a few dozen). Everything that goes wrong
is a `UserError` naming the file and the fix.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from gpufrac.errors import UserError

MIB = 1024 * 1024
MAX_DEPTH = 100  # Kubernetes objects nest about 20 deep; a CRD's schema perhaps 60
MAX_ALIAS_VALUES = 100_000  # what all aliases of one document may add, counted in values
MAX_NUMBER_CHARACTERS = 100  # an int64 has 19 digits; a quantity a few more


class _PurePythonParser(yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser, yaml.composer.Composer):
    def __init__(self, stream: str) -> None:
        yaml.reader.Reader.__init__(self, stream)
        yaml.scanner.Scanner.__init__(self)
        yaml.parser.Parser.__init__(self)
        yaml.composer.Composer.__init__(self)


_Parser: Any
try:  # libyaml's parser where PyYAML was built with it (the wheels are): about eight times faster
    from yaml._yaml import CParser as _Parser
except ImportError:  # pragma: no cover - a PyYAML built without libyaml
    _Parser = _PurePythonParser


def read_text(path: Path, *, limit: int, what: str = "") -> str:
    """The UTF-8 text of `path`, refused when it holds more than `limit` bytes. `what` names the flag or the
    role of the file in messages (`--kubeconfig`)."""
    label = f"{what} {path}".strip()
    try:
        # Opening a pipe waits for a writer, and may wait for ever; opened without waiting, it is refused for
        # what the open file is, not for what the path was a moment before (a file someone swaps for a pipe).
        handle = os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb")
        with handle:
            if stat.S_ISFIFO(os.fstat(handle.fileno()).st_mode):
                raise _not_a_file(label)
            data = handle.read(limit + 1)
    except FileNotFoundError:
        raise UserError(f"{label}: no such file; check the path") from None
    except IsADirectoryError:
        raise UserError(f"{label}: is a folder; pass a file") from None
    except OSError as error:
        if error.errno == errno.ENXIO:  # what opening a socket answers
            raise _not_a_file(label) from None
        raise UserError(f"{label}: cannot read it ({error.strerror}); check its permissions") from None
    if len(data) > limit:
        raise UserError(f"{label}: more than {_size(limit)}; pass a smaller file (or split it)")
    try:
        return data.decode("utf-8-sig")  # a byte-order mark, as spreadsheets save CSV, is not text
    except UnicodeDecodeError:
        raise UserError(f"{label}: not a UTF-8 text file") from None


def yaml_documents(text: str, *, name: str) -> Iterator[tuple[yaml.Node, object]]:
    """Each YAML document in `text` as its node tree (for line numbers) and its plain data."""
    _check_shape(text, name=name)
    loader = None
    try:
        loader = _BoundedLoader(text)
        while loader.check_node():
            node = loader.get_node()
            if node is not None:
                yield node, loader.construct_document(node)
    except yaml.YAMLError as error:
        raise _invalid(error, name) from None
    except (ValueError, TypeError, OverflowError) as error:  # a tagged value PyYAML cannot build
        raise UserError(f"{name}: not valid YAML: {error}; fix the value") from None
    finally:
        if loader is not None:
            loader.dispose()


def load_yaml(text: str, *, name: str) -> object:
    """The data of a single-document YAML text (None when it is empty)."""
    documents = [data for _, data in yaml_documents(text, name=name)]
    if len(documents) > 1:
        raise UserError(f"{name}: holds {len(documents)} YAML documents; expected one")
    return documents[0] if documents else None


def _check_shape(text: str, *, name: str) -> None:
    """Refuse, before anything is built, a text nested too deep or whose aliases expand too far.

    One pass over the parser's events: each alias adds the number of values under its anchor, counted when
    the anchor closed; an alias to an anchor still open is a structure that contains itself.
    """
    depth = 0
    counted = added = 0  # values so far in this document; values aliases added to it
    open_anchors: list[tuple[str | None, int]] = []
    sizes: dict[str, int] = {}
    try:
        for event in yaml.parse(text, Loader=_Loader):
            if isinstance(event, yaml.DocumentStartEvent):
                counted = added = 0
                sizes.clear()
            elif isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    raise _refused(event, name, f"nested more than {MAX_DEPTH} deep; flatten it")
                open_anchors.append((event.anchor, counted))
                counted += 1
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
                anchor, start = open_anchors.pop()
                if anchor is not None:
                    sizes[anchor] = counted - start
            elif isinstance(event, yaml.ScalarEvent):
                counted += 1
                if event.anchor is not None:
                    sizes[event.anchor] = 1
            elif isinstance(event, yaml.AliasEvent):
                if event.anchor not in sizes and any(a == event.anchor for a, _ in open_anchors):
                    raise _refused(event, name, f"the alias *{event.anchor} is inside its own anchor")
                size = sizes.get(event.anchor or "", 1)
                counted += size
                added += size
                if added > MAX_ALIAS_VALUES:
                    rule = f"aliases expand to more than {MAX_ALIAS_VALUES} values; write the values out"
                    raise _refused(event, name, rule)
    except yaml.YAMLError as error:
        raise _invalid(error, name) from None


class _BoundedConstructor(yaml.constructor.SafeConstructor):
    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        text = str(node.value)
        if len(text) > MAX_NUMBER_CHARACTERS:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"a number of {len(text)} characters; write at most {MAX_NUMBER_CHARACTERS}, "
                "or quote it to make it a string",
                node.start_mark,
            )
        return int(super().construct_yaml_int(node))

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[object, object]:
        """A key twice in one mapping is refused, as kubectl refuses it: PyYAML would keep the last, while
        the lines reported point at the first (a List's second `items:` even broke `validate`)."""
        seen: set[str] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                if key_node.value in seen:
                    raise yaml.constructor.ConstructorError(
                        None,
                        None,
                        f"the key {key_node.value!r} is there twice; keep one",
                        key_node.start_mark,
                    )
                seen.add(key_node.value)
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_timestamp(self, node: yaml.ScalarNode) -> str:  # type: ignore[override]
        """A date stays the text it is, as Kubernetes reads YAML (through JSON, which has no dates); PyYAML's
        own reading raises on impossible ones (2001-13-45)."""
        return str(node.value)


_BoundedConstructor.add_constructor(  # type: ignore[type-var]
    "tag:yaml.org,2002:int", _BoundedConstructor.construct_yaml_int
)
_BoundedConstructor.add_constructor(  # type: ignore[type-var]
    "tag:yaml.org,2002:timestamp", _BoundedConstructor.construct_yaml_timestamp
)


class _Loader(_Parser, yaml.resolver.Resolver):
    """Events only, for `_check_shape`."""

    def __init__(self, stream: str) -> None:
        _Parser.__init__(self, stream)
        yaml.resolver.Resolver.__init__(self)


class _BoundedLoader(_Parser, _BoundedConstructor, yaml.resolver.Resolver):
    def __init__(self, stream: str) -> None:
        _Parser.__init__(self, stream)
        _BoundedConstructor.__init__(self)
        yaml.resolver.Resolver.__init__(self)


def _refused(event: yaml.Event, name: str, rule: str) -> UserError:
    line = event.start_mark.line + 1 if event.start_mark else 1
    return UserError(f"{name}:{line}: {rule}")


def _invalid(error: yaml.YAMLError, name: str) -> UserError:
    if isinstance(error, yaml.MarkedYAMLError):
        line = error.problem_mark.line + 1 if error.problem_mark else 1
        return UserError(f"{name}:{line}: not valid YAML: {error.problem}")
    return UserError(f"{name}: not valid YAML: {str(error).splitlines()[0]}")


def _not_a_file(label: str) -> UserError:
    return UserError(f"{label}: is a pipe or socket, not a file; pass a file")


def _size(limit: int) -> str:
    return f"{limit // MIB} MiB" if limit >= MIB else f"{limit} bytes"
