"""Sessions in, conformed tables out: discover -> read + scrub -> parse (quarantine) -> streams/states.

In:  :class:`SessionFiles` (or paths to discover) and an :class:`IngestRecipe`.
Out: per session, the per-file reports (the CLI's JSON lines), per-kind secret counts and stats;
the ``trace_states``/``trace_messages``/``quarantine`` rows as Arrow tables (tables.py contracts).

Two engines produce the rows, with identical output:

* ``native`` (native.py, C++ in csrc/): reads, validates and decodes each line once and writes
  Arrow buffers directly; used when the extension is built (``engine: auto``, the default).
* ``python`` (parser.py + states.py): the reference, readable rule by rule. It also takes every
  session the native code hands back (invalid UTF-8 to repair, a line only the Python reader can
  read, a value only Python can re-serialize); :attr:`SessionReport.fallback_reason` says why.

Both read and scrub the files here first, so secrets are scrubbed once, before either parses.
:class:`SessionIngester` accumulates rows over many sessions (the CLI writes a Parquet row group
per few thousand messages); :func:`ingest_session` is one session (the Dagster assets) and
:func:`ingest_paths` yields one :class:`IngestResult` per session, streaming: memory is bounded by
the largest session, not the corpus.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

import pyarrow as pa

from composer_pipeline import tables
from composer_pipeline.ingest import native
from composer_pipeline.ingest.config import ENGINES, SOURCES, IngestRecipe
from composer_pipeline.ingest.discover import SessionFiles, agent_stream_meta, discover_sessions
from composer_pipeline.ingest.files import detect_format, is_empty, read_session_file
from composer_pipeline.scrub import Scrubber, apply_splices

TABLES = ("trace_states", "trace_messages", "quarantine")


class _Readers(NamedTuple):
    codex: ModuleType
    parser: ModuleType
    states: ModuleType


def _readers() -> _Readers:
    """The Python engine (``parser``, ``states``) and the Codex reader (``codex``), imported at first use:
    sessions the compiled engine reads whole need neither, and they load msgspec (~0.007 CPU-s of every
    ingest process, bench/RESULTS.md)."""
    from composer_pipeline.ingest import codex, parser, states

    return _Readers(codex, parser, states)


@dataclass
class SessionReport:
    """What ingesting one session reported (its rows went to the ingester's pending tables)."""

    session_key: str
    file_reports: list[dict] = field(default_factory=list)
    secrets: dict[str, int] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=dict)
    # the engine that produced the rows: native | python
    engine: str = "python"
    # why the native engine handed this session to Python
    fallback_reason: str | None = None


@dataclass
class IngestResult(SessionReport):
    """One session's report and its three tables."""

    states: pa.Table = field(default=None, repr=False)
    messages: pa.Table = field(default=None, repr=False)
    quarantine: pa.Table = field(default=None, repr=False)


# columns that hold whole JSONL lines or JSON documents (mostly UTF-8 ``bytes``): converted as binary,
# then validated as UTF-8 in one vectorized cast (about twice as fast as a per-value string conversion)
_BULK_TEXT = ("raw", "action")


def to_table(name: str, columns: dict[str, list], source: str = native.SOURCE) -> pa.Table:
    """Column lists (as the Python engine builds them) -> an Arrow table with exactly the contract's schema
    (``source``, where the lists have none, is ``source`` on every row)."""
    schema = tables.SCHEMAS[name]
    if "source" not in columns:
        n = len(columns[schema.names[0]])
        columns = {**columns, "source": [source] * n}
    arrays = [
        pa.array(columns[f.name], pa.binary()).cast(pa.string())
        if f.name in _BULK_TEXT
        else pa.array(columns[f.name], f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(arrays, schema=schema)


@dataclass
class _File:
    rel: str
    # as read, scrubbed once ``splices`` are applied; None when unreadable
    data: bytes | None
    error: str | None  # why it could not be read
    # lines the scrubber changed, not yet put into ``data``: the native engine reads them in place
    # (no copy of a file that holds a key); everything else reads :meth:`scrubbed`
    splices: list[tuple[int, int, bytes]] = field(default_factory=list)
    # read, and 0 bytes or all whitespace (:func:`is_empty`; scrubbing keeps emptiness)
    empty: bool = False

    def scrubbed(self) -> bytes:
        if self.data is None:
            raise ValueError(f"{self.rel} was not read ({self.error}): it has no bytes to scrub")
        if self.splices:
            self.data, self.splices = apply_splices(self.data, self.splices), []
        return self.data


class SessionIngester:
    """Ingest sessions one after another; :meth:`take` hands over the rows gathered so far, in order.

    ``engine``: ``auto`` (native when built, else python), ``native`` (required), ``python``;
    default: the recipe's ``engine``. ``source``: ``auto`` (each session's format detected from its
    main file, :func:`files.detect_format`), ``claude`` or ``codex`` (every session read as that agent's);
    default: the recipe's ``source``. Codex rollouts are read by ``codex.py`` (Python only)."""

    def __init__(self, recipe: IngestRecipe | None = None, engine: str | None = None, source: str | None = None):
        self.recipe = recipe or IngestRecipe()
        self.source = source or self.recipe.source
        if self.source not in SOURCES:
            raise ValueError(f"ingest source must be one of {', '.join(SOURCES)}, not {self.source!r}")
        engine = engine or self.recipe.engine
        if engine not in ENGINES:
            raise ValueError(f"ingest engine must be one of {', '.join(ENGINES)}, not {engine!r}")
        if engine == "native" and not native.AVAILABLE:
            raise RuntimeError(
                f"ingest engine 'native' requested but the extension is not built ({native.IMPORT_ERROR})"
            )
        self.engine = "native" if engine != "python" and native.AVAILABLE else "python"
        self._native = native.Builder() if self.engine == "native" else None
        # rows added to the native builder since its last take
        self._native_pending = False
        self._codex_columns: dict[str, dict[str, list]] = {n: {} for n in TABLES}  # Codex rows not yet built
        self._pending: dict[str, list[pa.Table]] = {n: [] for n in TABLES}
        self._python_rows = 0
        self._python_bytes = 0
        # reason -> sessions the Python engine took over
        self.fallbacks: Counter[str] = Counter()
        # compiled once; counts reset per session
        self._scrubber = Scrubber(self.recipe.extra_secret_patterns)

    # ---- one session ------------------------------------------------------------------------------
    def add(self, sf: SessionFiles) -> SessionReport:
        scrubber = self._scrubber
        scrubber.counts = Counter()
        paths = sf.files
        # each file once: the format is told from the first's head
        read = [read_session_file(p) for p in paths]
        fmt = self._format_of(sf, read[0][0] if read else None)
        if fmt != "claude":
            return self._add_codex(sf, scrubber, fmt, read)
        in_place = self._native is not None and not scrubber.extra
        files = []
        for p, (data, error) in zip(paths, read):
            splices = []
            empty = data is not None and is_empty(data)
            if data is not None and not empty:
                if in_place:
                    splices = scrubber.line_splices(data)
                # extra recipe patterns run on the whole (scrubbed) buffer
                else:
                    data = scrubber.scrub_bytes(data)
            files.append(_File(sf.rel(p), data, error, splices, empty))
        reason = None
        if self._native is not None:
            rep = self._add_native(self._native, sf, files, scrubber)
            if isinstance(rep, SessionReport):
                return rep
            reason = rep
            self.fallbacks[reason] += 1
        rep = self._add_python(sf, files, scrubber)
        rep.fallback_reason = reason
        return rep

    def _add_native(
        self, builder: native.Builder, sf: SessionFiles, files: list[_File], scrubber: Scrubber
    ) -> SessionReport | str:
        # keep session order in the pending tables
        self._flush_codex()
        q = self.recipe.quarantine_text_chars
        specs = []
        for i, f in enumerate(files):
            is_main = i == 0 and sf.main_file is not None
            stream_id, kind, agent_id = (None, None, None) if is_main else agent_stream_meta(f.rel, sf.key)
            data = None if f.empty else f.data
            specs.append(
                (
                    f.rel,
                    data,
                    f.splices if data is not None else None,
                    is_main,
                    stream_id,
                    kind,
                    agent_id,
                    (0, f.error, "") if f.error is not None else None,
                )
            )

        def classify(i: int, line_no: int, line: bytes) -> tuple | None:
            return _readers().parser.classify_line(line, files[i].rel, sf.key, line_no, q)

        got = builder.add_session(
            sf.key,
            sf.key.rsplit("__", 1)[-1],
            specs,
            classify,
            self.recipe.render.compaction == "full",
            self.recipe.drop_warmup,
        )
        self._native_pending = True
        if not got[0]:
            return got[1]
        (streams, warmup_dropped, states, messages), per_file = got[1], got[2]
        reports = [
            _file_report(
                sf.key,
                f.rel,
                lines=lines,
                records=records,
                bad_lines=bad,
                no_uuid=dict(no_uuid),
                states=n_states,
                linked=linked,
                crossed=crossed,
                warmup=warmup,
                utf8_repaired=0,
                empty=f.empty,
                bridged=bridged,
            )
            for f, (lines, records, bad, no_uuid, n_states, linked, crossed, warmup, bridged) in zip(files, per_file)
        ]
        stats = _session_stats(reports, streams, warmup_dropped, states, messages)
        return SessionReport(sf.key, reports, dict(scrubber.counts), stats, engine="native")

    def _add_python(self, sf: SessionFiles, files: list[_File], scrubber: Scrubber) -> SessionReport:
        readers = _readers()
        parser, states = readers.parser, readers.states
        q = self.recipe.quarantine_text_chars
        parsed = []
        for f in files:
            if f.error is not None:
                pf = parser.ParsedFile(f.rel)
                parser._quarantine(pf, sf.key, 0, f.error, "", q)
            else:
                pf = parser.parse_buffer(f.scrubbed(), f.rel, sf.key, q)
            parsed.append(pf)
        main = parsed[0] if sf.main_file is not None else None
        agents = parsed[1:] if main is not None else parsed
        build = states.build_session(sf.key, main, agents, self.recipe.render, self.recipe.drop_warmup)
        quarantine = [row for pf in parsed for row in pf.quarantine]
        reports = []
        for pf in parsed:
            fc = build.file_counts.get(pf.path, Counter())
            reports.append(
                _file_report(
                    sf.key,
                    pf.path,
                    lines=pf.lines,
                    records=len(pf.records) - pf.bridged,
                    bad_lines=len(pf.quarantine),
                    no_uuid=dict(Counter(r.type for r in pf.records if not r.uuid)),
                    states=fc["states"],
                    linked=fc["subagents_linked"],
                    crossed=fc["compactions_crossed"],
                    warmup=fc["warmup_dropped"],
                    utf8_repaired=pf.utf8_repaired,
                    empty=pf.empty,
                    bridged=pf.bridged,
                )
            )
        stats = _session_stats(
            reports, build.streams, build.warmup_dropped, len(build.states["state_id"]), len(build.messages["uuid"])
        )
        qcols = {f.name: [row[f.name] for row in quarantine] for f in tables.QUARANTINE if f.name != "source"}
        # keep session order in the pending tables
        self._flush_codex()
        self._flush_native()
        for name, cols in (("trace_states", build.states), ("trace_messages", build.messages), ("quarantine", qcols)):
            t = to_table(name, cols)
            if t.num_rows:
                self._pending[name].append(t)
                self._python_bytes += t.nbytes
        self._python_rows += stats["messages"]
        return SessionReport(sf.key, reports, dict(scrubber.counts), stats, engine="python")

    def _format_of(self, sf: SessionFiles, data: bytes | None) -> str | None:
        """``claude``, ``codex`` or ``None`` (neither): forced by ``source``, else read from the head of
        ``data``, the session's first file as read (a Codex session is one file; agent files belong to
        Claude Code sessions)."""
        if self.source != "auto":
            return self.source
        if sf.main_file is None or sf.subagent_files:
            return "claude"
        # (None: an unreadable file, a link or a FIFO; the Claude Code reader quarantines it with its reason;
        # a head of whitespace only has no line to parse, which detect_format reads as claude too)
        return detect_format(data) if data else "claude"

    def _add_codex(
        self, sf: SessionFiles, scrubber: Scrubber, fmt: str | None, read: list[tuple[bytes, None] | tuple[None, str]]
    ) -> SessionReport:
        """A Codex rollout (``fmt`` ``codex``), or a file in neither format (``None``: one quarantine row);
        ``read``: each of ``sf.files`` as :func:`read_session_file` read it."""
        codex = _readers().codex
        q = self.recipe.quarantine_text_chars
        qrows, reports = [], []
        states = messages = None
        for p, got in zip(sf.files, read):
            rel = sf.rel(p)
            report = _empty_file_report(sf.key, rel)
            report["source"] = fmt
            # (not unpacked: a check of the data narrows the reason too)
            if got[0] is None:
                qrows.append(codex.not_a_session_row(sf.key, rel, b"", q, got[1]))
            else:
                data = codex.scrub_url_credentials(scrubber.scrub_bytes(got[0]), scrubber.counts)
                if fmt is None:
                    qrows.append(codex.not_a_session_row(sf.key, rel, data, q))
                else:
                    build = codex.read_rollout(data, rel, sf.key, q)
                    qrows += build.quarantine
                    states, messages = build.states, build.messages
                    report.update(
                        lines=build.lines,
                        records=len(messages["uuid"]),
                        states=len(states["state_id"]),
                        compactions_crossed=build.compactions,
                        generation=build.generation,
                        assistant_steps=build.assistant_steps,
                        reasoning_only_steps=build.reasoning_only_steps,
                    )
            report["bad_lines"] = sum(1 for r in qrows if r["source_file"] == rel)
            reports.append(report)
        # keep session order in the pending tables
        self._flush_native()
        n_states = len(states["state_id"]) if states else 0
        n_messages = len(messages["uuid"]) if messages else 0
        # column lists gathered over sessions, built into Arrow once per take (:meth:`_flush_codex`)
        if states:
            self._extend_codex("trace_states", states)
        if messages:
            self._extend_codex("trace_messages", messages)
            self._python_bytes += sum(map(len, messages["raw"]))
        if qrows:
            self._extend_codex("quarantine", {f.name: [r[f.name] for r in qrows] for f in tables.QUARANTINE})
        self._python_rows += n_messages
        stats = _session_stats(reports, 1 if messages else 0, 0, n_states, n_messages)
        return SessionReport(sf.key, reports, dict(scrubber.counts), stats, engine="python")

    # ---- pending rows -------------------------------------------------------------------------------
    def pending_rows(self) -> int:
        """trace_messages rows not yet taken."""
        return self._python_rows + (self._native.rows() if self._native is not None else 0)

    def pending_bytes(self) -> int:
        return self._python_bytes + (self._native.nbytes() if self._native is not None else 0)

    def _extend_codex(self, name: str, columns: dict[str, list]) -> None:
        pending = self._codex_columns[name]
        for column, values in columns.items():
            pending.setdefault(column, []).extend(values)

    def _flush_codex(self) -> None:
        for name in TABLES:
            columns = self._codex_columns[name]
            if columns:
                self._pending[name].append(_readers().codex.table_of(name, columns))
                self._codex_columns[name] = {}

    def _flush_native(self) -> None:
        if self._native is None or not self._native_pending:
            return
        self._native_pending = False
        for name, t in self._native.take().items():
            if t.num_rows:
                self._pending[name].append(t)

    def take(self) -> dict[str, pa.Table]:
        """The rows gathered since the last call, one table each (empty tables where none)."""
        self._flush_native()
        self._flush_codex()
        out = {}
        for name in TABLES:
            parts = self._pending[name]
            out[name] = (parts[0] if len(parts) == 1 else pa.concat_tables(parts)) if parts else tables.empty(name)
            self._pending[name] = []
        self._python_rows = self._python_bytes = 0
        return out


def _empty_file_report(session_key: str, rel: str) -> dict:
    """:func:`_file_report` with every count zero (a file whose counts are filled in afterwards)."""
    return _file_report(
        session_key,
        rel,
        lines=0,
        records=0,
        bad_lines=0,
        no_uuid={},
        states=0,
        linked=0,
        crossed=0,
        warmup=0,
        utf8_repaired=0,
        empty=False,
        bridged=0,
    )


def _file_report(
    session_key: str,
    rel: str,
    *,
    lines: int,
    records: int,
    bad_lines: int,
    no_uuid: dict,
    states: int,
    linked: int,
    crossed: int,
    warmup: int,
    utf8_repaired: int,
    empty: bool,
    bridged: int,
) -> dict:
    """One input file's line of the CLI report (keys in the order the CLI prints them)."""
    return {
        "file": rel,
        "session_key": session_key,
        "states": states,
        "bad_lines": bad_lines,
        "subagents_linked": linked,
        "compactions_crossed": crossed,
        "lines": lines,
        "records": records,
        # summary / snapshot / queue-operation: not chain links
        "no_uuid_records": no_uuid,
        "warmup_dropped": warmup,
        "utf8_repaired": utf8_repaired,
        "empty_file": empty,
        # records whose unknown parent was re-attached through a damaged line
        "damaged_bridged": bridged,
    }


def _session_stats(reports: list[dict], streams: int, warmup_dropped: int, states: int, messages: int) -> dict:
    # one pass over the file reports (five sums of generators cost ~1 µs per session, most of them one file)
    records = bad_lines = linked = crossed = bridged = 0
    for r in reports:
        records += r["records"]
        bad_lines += r["bad_lines"]
        linked += r["subagents_linked"]
        crossed += r["compactions_crossed"]
        bridged += r["damaged_bridged"]
    return {
        "records": records,
        "bad_lines": bad_lines,
        "streams": streams,
        "subagents_linked": linked,
        "compactions_crossed": crossed,
        "damaged_bridged": bridged,
        "warmup_dropped": warmup_dropped,
        "states": states,
        "messages": messages,
    }


def ingest_session(
    sf: SessionFiles, recipe: IngestRecipe | None = None, engine: str | None = None, source: str | None = None
) -> IngestResult:
    """One session -> its report and tables (what the Dagster ingest asset calls)."""
    ing = SessionIngester(recipe, engine, source)
    return _result(ing.add(sf), ing.take())


def _result(rep: SessionReport, t: dict[str, pa.Table]) -> IngestResult:
    return IngestResult(
        rep.session_key,
        rep.file_reports,
        rep.secrets,
        rep.stats,
        rep.engine,
        rep.fallback_reason,
        states=t["trace_states"],
        messages=t["trace_messages"],
        quarantine=t["quarantine"],
    )


def ingest_paths(
    paths: Iterable[str | Path],
    recipe: IngestRecipe | None = None,
    engine: str | None = None,
    source: str | None = None,
) -> Iterator[IngestResult]:
    """Discover sessions under each path (dir or file) and ingest them one at a time."""
    ing = SessionIngester(recipe, engine, source)
    for p in paths:
        for sf in discover_sessions(Path(p)):
            rep = ing.add(sf)
            yield _result(rep, ing.take())
