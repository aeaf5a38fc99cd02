"""The user's files: one mapping from JSON or YAML (``yaml.safe_load``'s loader only), and the files
`plan --emit` and `tune` write into ``--out`` (never over a user's file without ``--force``, never through a link); one-line errors.

Whatever the file is (missing, a folder, unreadable, binary, not UTF-8, too large, nested too deeply,
not a mapping) the answer is one :class:`InputError` line naming the file and the fix.
"""

from __future__ import annotations

import contextlib
import functools
import json
import marshal
import os
import re
import stat
import sys
from pathlib import Path
from typing import Iterable

from planner.errors import InputError


class DuplicateKey(ValueError):
    """A mapping gives one key twice (YAML and JSON readers would silently keep the last)."""


@functools.cache
def yaml_loaders() -> tuple[type, type]:
    """(the loader of a user's file, of a file plantune ships), yaml imported when a YAML file is first read (a plan
    from a preset reads none: the catalog comes from `read_packaged`'s cache).

    A user's file: `UniqueKeyLoader`, the pure-Python SafeLoader, whose RecursionError on absurd nesting is answered
    in one line. A shipped file: yaml.safe_load's constructor on libyaml's parser, ~7x faster (4 ms instead of 30)."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        """yaml.SafeLoader (same constructors, nothing more) that refuses a mapping giving one key twice: in
        ``layers: 4 ... layers: 40`` the reader would keep the last and plan a model its author never meant.
        Merge keys (``<<: *base``) still override as YAML defines them; only keys written twice are refused."""

        def construct_mapping(self, node, deep=False):
            if isinstance(node, yaml.MappingNode):
                seen: dict = {}
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        continue
                    key = self.construct_object(key_node, deep=True)
                    try:
                        if key in seen:
                            raise DuplicateKey(f"key {key!r} is given twice (lines {seen[key] + 1} and "
                                               f"{key_node.start_mark.line + 1})")
                        seen[key] = key_node.start_mark.line
                    except TypeError:       # an unhashable key: SafeLoader's own error follows
                        break
            return super().construct_mapping(node, deep=deep)
    return UniqueKeyLoader, getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _unique_pairs(pairs: list) -> dict:
    """json.loads' object_pairs_hook: a dict, refusing a key given twice."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKey(f"key {key!r} is given twice")
        out[key] = value
    return out


MAX_FILE_BYTES = 16 * 2**20
"""a model, cluster, calibration or plan file is a few kB; 16 MiB is far beyond any (calibrations ~50 kB)"""


def read_text(path: str | Path, what: str, *, missing_hint: str = "") -> str:
    """The UTF-8 text of a small regular file; InputError naming ``what`` for anything else."""
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise InputError(f"{what} {path} does not exist{missing_hint}") from None
    except OSError as err:
        raise InputError(f"{what} {path} cannot be read ({err.strerror or err}); check the path") from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError(f"{what} {path} is a folder; give the file inside it")
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{what} {path} is not a regular file; give a YAML or JSON file")
    if st.st_size > MAX_FILE_BYTES:
        raise InputError(f"{what} {path} is {st.st_size:,} bytes, over the {MAX_FILE_BYTES:,} a config file can be; "
                         "give the right file")
    try:
        raw = p.read_bytes()
    except OSError as err:
        raise InputError(f"{what} {path} cannot be read ({err.strerror or err}); check its permissions") from None
    if b"\x00" in raw:
        raise InputError(f"{what} {path} is binary (NUL bytes), not YAML or JSON text; give the right file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputError(f"{what} {path} is not UTF-8 text (byte 0x{raw[err.start]:02x} at offset {err.start}); "
                         "save it as UTF-8") from None
    return text.removeprefix("\ufeff")


def read_mapping(path: str | Path, what: str, *, missing_hint: str = "", packaged: bool = False) -> dict:
    """The mapping in ``path`` (JSON when it ends in .json, else YAML); InputError naming ``what`` otherwise.
    ``packaged``: a file plantune ships, parsed by libyaml (`yaml_loaders`) once and then read from
    `read_packaged`'s cache."""
    p = Path(path)
    if packaged:
        return read_packaged(p, what)
    return _parse_mapping(p, read_text(p, what, missing_hint=missing_hint), what, packaged=False)


MAX_FLOW_NESTING = 100
"""brackets ([ or {) open at once beyond which a file is refused before parsing: PyYAML's scanner slows with the
depth (its possible-simple-key checks walk every open level: 5,000 levels take 1.7 s to reach the RecursionError
answered below); a config file here is a mapping a few levels deep"""


def _too_deep(text: str) -> bool:
    """More than `MAX_FLOW_NESTING` brackets open at once (counted in quoted strings too: a value would need over a
    hundred unclosed brackets of its own to be refused by that)."""
    depth = 0
    for ch in re.sub(r"[^\[\]{}]+", "", text):
        depth += 1 if ch in "[{" else -1
        if depth > MAX_FLOW_NESTING:
            return True
    return False


def _parse_mapping(path: Path, text: str, what: str, *, packaged: bool) -> dict:
    """`read_mapping`'s parse of ``text``, the contents of ``path``."""
    import yaml   # here: a plan from a preset parses no file (`read_packaged`)

    if _too_deep(text):
        raise InputError(f"malformed {what} {path}: nested too deeply; a config file is a flat mapping")
    try:
        loader = yaml_loaders()[1 if packaged else 0]
        data = (json.loads(text, object_pairs_hook=_unique_pairs) if path.suffix.lower() == ".json"
                else yaml.load(text, Loader=loader))  # noqa: S506 - a SafeLoader subclass (safe constructors only)
    except DuplicateKey as err:
        raise InputError(f"malformed {what} {path}: {err}; keep one") from None
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise InputError(f"malformed {what} {path}: {first}; fix the syntax") from None
    except RecursionError:
        raise InputError(f"malformed {what} {path}: nested too deeply; a config file is a flat mapping") from None
    except (ValueError, OverflowError) as err:  # e.g. a YAML timestamp out of range, a huge JSON integer
        detail = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise InputError(f"malformed {what} {path}: {detail}; fix the value") from None
    if not isinstance(data, dict):
        raise InputError(f"malformed {what} {path}: expected a mapping of keys")
    return data


def read_packaged(path: Path, what: str) -> dict:
    """A YAML file plantune ships (the accelerator catalog, which every `plan` reads), parsed once and kept, as
    marshal data, beside the bytecode caches of its folder (``__pycache__/NAME.TAG.marshal``), stamped with the
    file's size and modification time as a .pyc is with its source's: a later process reads it back without
    importing yaml. Written as Python writes its bytecode (not under PYTHONDONTWRITEBYTECODE; a folder it may not
    write is left alone); a stale, foreign or broken cache is parsed again."""
    cache = path.parent / "__pycache__" / f"{path.name}.{sys.implementation.cache_tag}.marshal"
    try:
        st = path.stat()
    except OSError:   # read_text words it
        stamp = None
    else:
        stamp = (st.st_size, st.st_mtime_ns)
        try:
            with open(cache, "rb") as f:
                cached = marshal.loads(f.read())   # one read: marshal.load reads a file object item by item
            if type(cached) is tuple and len(cached) == 2 and cached[0] == stamp and type(cached[1]) is dict:
                return cached[1]
        except (OSError, EOFError, ValueError, TypeError):
            pass
    data = _parse_mapping(path, read_text(path, what), what, packaged=True)
    if stamp is not None:
        _write_marshal(cache, (stamp, data))
    return data


def _write_marshal(path: Path, value: object) -> None:
    """``value`` as marshal data at ``path``, beside the bytecode caches and as Python writes them: not under
    PYTHONDONTWRITEBYTECODE, whole or not at all (a temporary file renamed), silently not where it cannot."""
    if sys.dont_write_bytecode:
        return
    try:
        blob = marshal.dumps(value)
        path.parent.mkdir(exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(blob)
        os.replace(tmp, path)
    except (OSError, ValueError):
        pass


@contextlib.contextmanager
def dataclass_code_cache(path: Path | None = None):
    """While the package's modules are imported (planner/__init__.py): the functions `dataclasses` writes for each
    class (``__init__``, ``__repr__``, ``__eq__``, ``__hash__``, the frozen ``__setattr__``/``__delattr__``: source
    text it hands to ``exec``) compiled once and kept, as marshal data, beside the bytecode caches
    (``__pycache__/dataclasses.TAG.marshal``, stamped with the interpreter's bytecode magic number), as Python keeps
    a module's bytecode: compiling them was ~60% of `import planner.cli` (~40 frozen classes; the classes and their
    methods are the same, only their compilation is skipped). Keyed by the whole source text, so a changed class
    compiles anew; written as `read_packaged` writes (not under PYTHONDONTWRITEBYTECODE), holding only the texts
    this import used. ``dataclasses``' module-level name ``exec`` is set for the duration only (restored after).
    ``path``: the cache file (tests)."""
    import dataclasses
    from importlib.util import MAGIC_NUMBER

    if path is None:
        path = Path(__file__).resolve().parent / "__pycache__" / f"dataclasses.{sys.implementation.cache_tag}.marshal"
    codes: dict = {}
    try:
        with open(path, "rb") as f:
            cached = marshal.loads(f.read())   # one read: marshal.load reads a file object item by item
        if type(cached) is tuple and len(cached) == 2 and cached[0] == MAGIC_NUMBER and type(cached[1]) is dict:
            codes = cached[1]
    except (OSError, EOFError, ValueError, TypeError):
        pass
    used: dict = {}
    missed = False

    def cached_exec(source, globals=None, locals=None, /):
        nonlocal missed
        if type(source) is not str:
            return exec(source, globals, locals)
        code = codes.get(source)
        if code is None:   # as exec compiles a string: "<string>", no future flags of this module
            code, missed = compile(source, "<string>", "exec", dont_inherit=True), True
        used[source] = code
        return exec(code, globals, locals)

    namespace = vars(dataclasses)
    before = namespace.get("exec", cached_exec)
    namespace["exec"] = cached_exec
    try:
        yield
    finally:
        if before is cached_exec:
            del namespace["exec"]
        else:
            namespace["exec"] = before
    if missed:
        _write_marshal(path, (MAGIC_NUMBER, used))


def check_out(out: Path, names: Iterable[str] | None = None, *, force: bool) -> None:
    """Refuse what --out could not take safely, before any work: a link, a file; without ``force``, a folder that
    holds any of ``names`` (the files about to be written), or any file at all when ``names`` is None."""
    out = Path(out)
    if out.is_symlink():
        raise InputError(f"--out {out} is a symbolic link; give the real folder (plantune never writes through a link)")
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out} is a file, not a folder; give a folder")
    if force or not out.is_dir():
        return
    if names is None:
        if any(out.iterdir()):
            raise InputError(f"--out {out} is not empty; give a new folder, or add --force to replace the files "
                             "written there")
        return
    there = [n for n in names if (out / n).exists() or (out / n).is_symlink()]
    if there:
        raise InputError(f"--out {out} already holds {', '.join(there)}; give a new folder, or add --force to "
                         "replace them (edits made there would be lost)")


def write_files(out: Path, files: dict[str, str], *, force: bool) -> list[Path]:
    """Write ``files`` (name -> text) into ``out`` without following links: each is written beside its target and
    renamed over it (a link in its place is replaced, not followed); an existing file is replaced only with
    ``force``; launchers (``*.sbatch``, ``*.sh`` but the sourced ``*_args.sh``) are executable."""
    import tempfile   # here: only --emit writes files

    out = Path(out)
    check_out(out, files, force=force)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in files.items():
        target = out / name
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=out)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        launcher = name.endswith(".sbatch") or (name.endswith(".sh") and not name.endswith("_args.sh"))
        os.chmod(tmp, 0o755 if launcher else 0o644)
        os.replace(tmp, target)
        paths.append(target)
    return paths
