"""The helper catalog: data saying which ranges, Python frames and kernels belong to which helper.

Why data and not code: every Transformer Engine release renames or moves a CP helper, and users
profile their own wrappers. Adding a TOML entry (``--catalog extra.toml`` or the
``CPTRACE_CATALOG`` environment variable, paths separated by ``os.pathsep``) must be enough.

Matching is done once per *distinct name* (a symbol id), never per event, so patterns can be
expressive (globs, or regular expressions with a ``re:`` prefix) without costing throughput.
Order matters: the first helper whose pattern matches a name wins. Entries of extra catalogs come
before the built-in ones, and an extra entry with a built-in entry's name replaces it.
"""

from __future__ import annotations

import fnmatch
import os
import re
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache, lru_cache
from importlib import resources
from pathlib import Path
from re import _parser as _sre  # type: ignore[attr-defined]
from typing import Any, Protocol

from analyzers.report import Category

BUILTIN_CATALOG = "te_cp.toml"
ENV_VAR = "CPTRACE_CATALOG"

_HELPER_KEYS = {
    "name",
    "category",
    "description",
    "te_versions",
    "finding",
    "ranges",
    "python",
    "kernels",
    "within",
    "fallback",
    "block_from",
    "block_to",
}
_PATTERN_KEYS = ("ranges", "python", "kernels", "within", "te_versions", "block_from", "block_to")


class CatalogError(ValueError):
    """A catalog file is unreadable or an entry does not match the schema."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Helper:
    """One catalogued helper and the patterns that identify it."""

    name: str
    category: Category
    description: str = ""
    te_versions: tuple[str, ...] = ()
    """TE minor versions the entry applies to (documentation; matching does not depend on it)."""
    finding: str | None = None
    """Rule id of the finding this helper feeds, if any."""
    ranges: tuple[str, ...] = ()
    python: tuple[str, ...] = ()
    kernels: tuple[str, ...] = ()
    within: tuple[str, ...] = ()
    """Container helper names the kernel patterns are restricted to (empty: anywhere)."""
    fallback: bool = False
    """A container: claims an activity only when nothing more specific does."""
    block_from: tuple[str, ...] = ()
    block_to: tuple[str, ...] = ()
    """Kernel patterns opening and closing a *block*: on one launching thread inside one
    ``within`` container range, every launch from a ``block_from`` kernel through the next
    ``block_to`` kernel that only the container claimed belongs to this helper too. Why: a
    helper without a frame of its own in the trace (TE 2.20's zero-fill without Python frames)
    launches generic kernels (copy, index, add) that no kernel pattern may claim alone."""
    source: str = BUILTIN_CATALOG


class _Pattern(Protocol):
    """What matching needs of a compiled pattern: ``match(name)`` is truthy on a match."""

    def match(self, name: str) -> object: ...


@dataclass(frozen=True, slots=True)
class _StarGlob:
    """A glob whose only wildcard is ``*`` (every built-in pattern), matched with string
    methods: the same answers as ``fnmatch.translate``'s regex, without compiling one (about
    200 regex compilations were most of the catalog's load time, paid by every ``analyze``).

    ``parts`` is the pattern split at ``*``: the name must start with the first part, end with
    the last, and hold the middle ones in order in between (leftmost occurrence of each is
    enough: any later choice leaves less room for the rest).
    """

    parts: tuple[str, ...]

    def match(self, name: str) -> bool:
        parts = self.parts
        if len(parts) == 1:
            return name == parts[0]
        head, tail = parts[0], parts[-1]
        limit = len(name) - len(tail)
        if limit < len(head) or not name.startswith(head) or not name.endswith(tail):
            return False
        at = len(head)
        for part in parts[1:-1]:
            if part:
                found = name.find(part, at, limit)
                if found < 0:
                    return False
                at = found + len(part)
        return True


@dataclass(frozen=True, slots=True)
class _Matcher:
    """Compiled patterns of one kind (ranges, python or kernels) over all helpers."""

    regexes: tuple[tuple[int, _Pattern], ...]

    def first(self, name: str) -> int:
        for helper_index, regex in self.regexes:
            if regex.match(name):
                return helper_index
        return -1


_Factor = tuple[str, bool]
"""A literal a name must hold: (text, case-insensitive; then the text is lower-case ASCII)."""


def _weight(factors: frozenset[_Factor]) -> int:
    return min(len(text) for text, _ in factors)


def _needed(items: Any, icase: bool) -> frozenset[_Factor] | None:
    """Literals one of which every match of the parsed regex ``items`` holds (None: none known).

    Only what is certain counts: literal runs, groups, alternations whose every branch has
    one, repeats of at least one; anything else (classes, assertions, back-references) ends a
    run and adds nothing. Case-insensitive literals are kept only when ASCII.
    """
    best: frozenset[_Factor] | None = None
    run: list[str] = []

    def take(candidate: frozenset[_Factor] | None) -> None:
        nonlocal best
        if candidate and (best is None or _weight(candidate) > _weight(best)):
            best = candidate

    def end_run() -> None:
        if run:
            take(frozenset({("".join(run), icase)}))
            run.clear()

    for op, av in items:
        if op is _sre.LITERAL and (not icase or av < 128):
            run.append(chr(av).lower() if icase else chr(av))
            continue
        end_run()
        if op is _sre.SUBPATTERN:
            _, add, remove, inner = av
            inner_icase = (icase or bool(add & re.IGNORECASE)) and not remove & re.IGNORECASE
            take(_needed(inner, inner_icase))
        elif op is _sre.BRANCH:
            branches = [_needed(branch, icase) for branch in av[1]]
            if all(branches):
                take(frozenset().union(*(b for b in branches if b)))
        elif op in (_sre.MAX_REPEAT, _sre.MIN_REPEAT, _sre.POSSESSIVE_REPEAT) and av[0] >= 1:
            take(_needed(av[2], icase))
    end_run()
    return best


@lru_cache(maxsize=4)
def _lower(name: str) -> str:
    """``name.lower()``, kept for the few names being matched (each against every pattern)."""
    return name.lower()


@dataclass(frozen=True, slots=True)
class _Regex:
    """A compiled regex and literals one of which any match needs (``_needed``): on an ASCII
    name holding none of them the regex is not run, so a long name that no pattern can match
    costs a few substring searches per pattern instead of a regex attempt at every position.
    ``anywhere``: searched (``re:`` patterns), else matched from the start (globs)."""

    regex: re.Pattern[str]
    needed: tuple[_Factor, ...]
    anywhere: bool

    def match(self, name: str) -> bool:
        if (
            self.needed
            and name.isascii()
            and not any(t in (_lower(name) if i else name) for t, i in self.needed)
        ):
            return False
        found = self.regex.search(name) if self.anywhere else self.regex.match(name)
        return found is not None


def _regex(source: str, *, anywhere: bool, flags: int = 0) -> _Regex:
    parsed = _sre.parse(source, flags)
    icase = bool(parsed.state.flags & re.IGNORECASE)
    needed = _needed(parsed, icase) or frozenset()
    return _Regex(re.compile(source, flags), tuple(sorted(needed)), anywhere)


def _compile(pattern: str) -> _Pattern:
    """Compile a glob (whole-name match) or a ``re:`` regex (searched anywhere) for ``.match``.

    ``re:`` patterns are searched as written (``re.search``), not matched behind a ``.*?``
    prefix. Globs with ``?`` or ``[...]`` become regexes (``fnmatch.translate``); ``*``-only
    globs are matched without one (``_StarGlob``, same answers).
    """
    if pattern.startswith("re:"):
        return _regex(pattern[3:], anywhere=True, flags=re.DOTALL)
    if "?" in pattern or "[" in pattern:
        return _regex(fnmatch.translate(pattern), anywhere=False)
    return _StarGlob(tuple(pattern.split("*")))


def _matcher(helpers: Sequence[Helper], kind: str, *, unrestricted: bool = False) -> _Matcher:
    regexes = [
        (index, _compile(pattern))
        for index, helper in enumerate(helpers)
        if not (unrestricted and helper.within)
        for pattern in getattr(helper, kind)
    ]
    return _Matcher(tuple(regexes))


@dataclass(frozen=True, slots=True)
class Catalog:
    """An ordered list of helpers plus the host-synchronisation patterns."""

    name: str
    version: str
    helpers: tuple[Helper, ...]
    host_sync_apis: tuple[str, ...] = ()
    host_sync_ops: tuple[str, ...] = ()
    host_sync_memcpy: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    fp8_alignment_default: int = 8
    """Token multiple FP8 GEMMs need on a TE version the catalog does not list."""
    fp8_alignment: tuple[tuple[str, int], ...] = ()
    """(TE version prefix, e.g. ``"2.20"``, token multiple its FP8 GEMMs need)."""
    _ranges: _Matcher = field(init=False, repr=False, compare=False)
    _python: _Matcher = field(init=False, repr=False, compare=False)
    _kernels: _Matcher = field(init=False, repr=False, compare=False)
    _kernels_anywhere: _Matcher = field(init=False, repr=False, compare=False)
    _sync: dict[str, tuple[_Pattern, ...]] = field(init=False, repr=False, compare=False)
    _blocks: dict[int, tuple[tuple[_Pattern, ...], tuple[_Pattern, ...]]] = field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "_ranges", _matcher(self.helpers, "ranges"))
        object.__setattr__(self, "_python", _matcher(self.helpers, "python"))
        object.__setattr__(self, "_kernels", _matcher(self.helpers, "kernels"))
        anywhere = _matcher(self.helpers, "kernels", unrestricted=True)
        object.__setattr__(self, "_kernels_anywhere", anywhere)
        sync = {
            "apis": tuple(_compile(p) for p in self.host_sync_apis),
            "ops": tuple(_compile(p) for p in self.host_sync_ops),
            "memcpy": tuple(_compile(p) for p in self.host_sync_memcpy),
        }
        object.__setattr__(self, "_sync", sync)
        blocks = {
            i: (tuple(map(_compile, h.block_from)), tuple(map(_compile, h.block_to)))
            for i, h in enumerate(self.helpers)
            if h.block_from
        }
        object.__setattr__(self, "_blocks", blocks)

    def index(self, name: str) -> int:
        """Index of the helper called ``name``; -1 when the catalog has none."""
        for i, helper in enumerate(self.helpers):
            if helper.name == name:
                return i
        return -1

    def match_range(self, name: str) -> tuple[int, bool]:
        """Helper index claiming an annotation ``name`` (-1: none) and whether a Python pattern
        matched it (else a range pattern did). Range patterns are tried first."""
        found = self._ranges.first(name)
        if found >= 0:
            return found, False
        found = self._python.first(name)
        return found, found >= 0

    def match_kernel(self, name: str) -> int:
        """Helper index whose kernel patterns match a GPU activity ``name``; -1 when none."""
        return self._kernels.first(name)

    def match_kernel_anywhere(self, name: str) -> int:
        """Like ``match_kernel`` among helpers without ``within``: the claim for a kernel
        launched outside the containers a restricted helper needs (-1 when none)."""
        return self._kernels_anywhere.first(name)

    def block_helpers(self) -> list[int]:
        """Indexes of the helpers that claim blocks (``block_from`` / ``block_to``)."""
        return sorted(self._blocks)

    def block_edge(self, helper_index: int, name: str) -> tuple[bool, bool]:
        """Whether a kernel ``name`` opens and whether it closes a block of that helper."""
        opening, closing = self._blocks[helper_index]
        return any(p.match(name) for p in opening), any(p.match(name) for p in closing)

    def fp8_multiple(self, te_version: str | None) -> int | None:
        """Token multiple TE ``te_version``'s FP8 GEMMs need (None: version unknown).

        The longest listed prefix that matches at a version-part boundary wins (``"2.20"``
        matches ``2.20.2``, not ``2.200``).
        """
        if not te_version:
            return None
        found = [
            (len(prefix), multiple)
            for prefix, multiple in self.fp8_alignment
            if te_version == prefix or te_version.startswith(prefix + ".")
        ]
        return max(found)[1] if found else self.fp8_alignment_default

    def fp8_strictest(self) -> int:
        """The largest multiple any listed TE version needs: a pad safe on all of them."""
        return max([self.fp8_alignment_default, *(m for _, m in self.fp8_alignment)])

    def is_sync(self, kind: str, name: str) -> bool:
        """Whether ``name`` is a host-synchronising API ('apis'), op ('ops') or copy ('memcpy')."""
        return any(regex.match(name) for regex in self._sync[kind])


def _tuple_of_str(entry: dict[str, object], key: str, where: str) -> tuple[str, ...]:
    value = entry.get(key, [])
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CatalogError(f"{where}: field {key!r} must be a list of strings")
    for pattern in value:
        if pattern.startswith("re:"):
            try:
                re.compile(pattern[3:])
            except re.error as exc:
                raise CatalogError(f"{where}: field {key!r}: bad regex {pattern!r}: {exc}") from exc
    return tuple(value)


def _parse_helper(entry: object, where: str, source: str) -> Helper:
    if not isinstance(entry, dict):
        raise CatalogError(f"{where}: each [[helper]] must be a table")
    unknown = set(entry) - _HELPER_KEYS
    if unknown:
        raise CatalogError(
            f"{where}: unknown field(s) {sorted(unknown)}; allowed {sorted(_HELPER_KEYS)}"
        )
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise CatalogError(f"{where}: field 'name' must be a non-empty string")
    where = f"{where} ({name})"
    try:
        category = Category(entry.get("category", "other"))
    except ValueError as exc:
        allowed = ", ".join(c.value for c in Category)
        raise CatalogError(f"{where}: field 'category' must be one of: {allowed}") from exc
    patterns = {key: _tuple_of_str(entry, key, where) for key in _PATTERN_KEYS}
    if not (patterns["ranges"] or patterns["python"] or patterns["kernels"]):
        raise CatalogError(f"{where}: needs at least one of 'ranges', 'python', 'kernels'")
    finding = entry.get("finding")
    if finding is not None and not isinstance(finding, str):
        raise CatalogError(f"{where}: field 'finding' must be a string")
    fallback = entry.get("fallback", False)
    if not isinstance(fallback, bool):
        raise CatalogError(f"{where}: field 'fallback' must be true or false")
    if bool(patterns["block_from"]) != bool(patterns["block_to"]):
        raise CatalogError(f"{where}: 'block_from' and 'block_to' go together")
    if patterns["block_from"] and not patterns["within"]:
        raise CatalogError(f"{where}: a block ('block_from') needs 'within' (its container)")
    return Helper(
        name=name,
        category=category,
        description=str(entry.get("description", "")),
        finding=finding,
        fallback=fallback,
        source=source,
        **patterns,
    )


def parse_catalog(raw: dict[str, object], *, source: str) -> Catalog:
    """Validate one decoded catalog document."""
    meta = raw.get("catalog", {})
    if not isinstance(meta, dict):
        raise CatalogError(f"{source}: [catalog] must be a table")
    entries = raw.get("helper", [])
    if not isinstance(entries, list):
        raise CatalogError(f"{source}: 'helper' must be an array of tables ([[helper]])")
    helpers = tuple(
        _parse_helper(entry, f"{source}: helper #{i + 1}", source)
        for i, entry in enumerate(entries)
    )
    sync = raw.get("host_sync", {})
    if not isinstance(sync, dict):
        raise CatalogError(f"{source}: [host_sync] must be a table")
    default, versions = _fp8_alignment(raw.get("fp8_alignment", {}), source)
    return Catalog(
        name=str(meta.get("name", Path(source).stem)),
        version=str(meta.get("version", "0")),
        helpers=helpers,
        host_sync_apis=_tuple_of_str(sync, "apis", f"{source}: [host_sync]"),
        host_sync_ops=_tuple_of_str(sync, "ops", f"{source}: [host_sync]"),
        host_sync_memcpy=_tuple_of_str(sync, "memcpy", f"{source}: [host_sync]"),
        sources=(source,),
        fp8_alignment_default=default,
        fp8_alignment=versions,
    )


def _fp8_alignment(table: object, source: str) -> tuple[int, tuple[tuple[str, int], ...]]:
    """``[fp8_alignment]``: ``default = N`` and ``versions = {"2.20" = 16, ...}``."""
    where = f"{source}: [fp8_alignment]"
    if not isinstance(table, dict):
        raise CatalogError(f"{where} must be a table")
    unknown = set(table) - {"default", "versions"}
    if unknown:
        raise CatalogError(
            f"{where}: unknown field(s) {sorted(unknown)}; allowed default, versions"
        )
    default = table.get("default", 8)
    versions = table.get("versions", {})
    if not isinstance(default, int) or isinstance(default, bool) or default < 1:
        raise CatalogError(f"{where}: 'default' must be a positive integer")
    if not isinstance(versions, dict) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in versions.values()
    ):
        raise CatalogError(f"{where}: 'versions' must map TE versions to positive integers")
    return default, tuple((str(k), int(v)) for k, v in versions.items())


def _read(path: Path) -> Catalog:
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise CatalogError(f"{path}: cannot read catalog: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise CatalogError(f"{path}: not valid TOML: {exc}") from exc
    return parse_catalog(raw, source=str(path))


@cache
def builtin_catalog() -> Catalog:
    """The catalog shipped in the package, parsed once per process: a ``Catalog`` is immutable
    (frozen, its matchers tuples), so every analysis shares one instead of paying the TOML parse
    and the pattern compilation each time."""
    text = resources.files(__package__).joinpath(BUILTIN_CATALOG).read_text(encoding="utf-8")
    return parse_catalog(tomllib.loads(text), source=BUILTIN_CATALOG)


def combine(base: Catalog, extras: Iterable[Catalog]) -> Catalog:
    """Put extra entries first (they win ties) and let them replace built-ins by name."""
    extras = list(extras)
    if not extras:
        return base
    added = [h for extra in extras for h in extra.helpers]
    names = {h.name for h in added}
    helpers = (*added, *(h for h in base.helpers if h.name not in names))
    return Catalog(
        name=base.name,
        version="+".join([base.version, *(f"{e.name}-{e.version}" for e in extras)]),
        helpers=helpers,
        host_sync_apis=base.host_sync_apis + tuple(a for e in extras for a in e.host_sync_apis),
        host_sync_ops=base.host_sync_ops + tuple(a for e in extras for a in e.host_sync_ops),
        host_sync_memcpy=base.host_sync_memcpy
        + tuple(a for e in extras for a in e.host_sync_memcpy),
        sources=base.sources + tuple(s for e in extras for s in e.sources),
        fp8_alignment_default=base.fp8_alignment_default,
        fp8_alignment=tuple(a for e in extras for a in e.fp8_alignment) + base.fp8_alignment,
    )


def load_catalog(extra_paths: Sequence[str | Path] = (), *, use_env: bool = True) -> Catalog:
    """The built-in catalog plus user catalogs (``extra_paths``, then ``$CPTRACE_CATALOG``).

    :raises CatalogError: naming the file and the entry that is wrong.
    """
    paths = [Path(p) for p in extra_paths]
    if use_env and os.environ.get(ENV_VAR):
        paths += [Path(p) for p in os.environ[ENV_VAR].split(os.pathsep) if p]
    return combine(builtin_catalog(), (_read(p) for p in paths))


__all__ = [
    "ENV_VAR",
    "Catalog",
    "CatalogError",
    "Helper",
    "builtin_catalog",
    "combine",
    "load_catalog",
    "parse_catalog",
]
