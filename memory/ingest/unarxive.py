"""unarXive full-text papers (one JSON object per line) as Papers with sectioned paragraphs.

Accepts the .jsonl itself, a gzipped .jsonl.gz, or the .tar.gz the sample ships in. A bad line
(not JSON, missing fields) is reported with its file and line number; the other lines go on.
"""

from __future__ import annotations

import gzip
import json
import re
import tarfile
from collections.abc import Callable, Iterator
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import IO, Any

from memory.ingest.clean import clean_extracted_text
from memory.ingest.errors import IngestError
from memory.stores.knowledge_base import Paper

Paragraphs = list[tuple[str, str]]
# {{formula:uuid}}, {{cite:hash}}, {{figure:uuid}}, {{table:uuid}}: placeholders, not text.
_PLACEHOLDER = re.compile(r"\{\{[a-z]+:[0-9a-fA-F\-]+\}\}")
_SPACES = re.compile(r"\s+")


def is_unarxive_path(path: str | Path) -> bool:
    name = str(path).lower()
    return name.endswith((".jsonl", ".jsonl.gz", ".tar.gz", ".tgz"))


def _text(value: Any) -> str:
    text = clean_extracted_text(value if isinstance(value, str) else "")
    return _SPACES.sub(" ", _PLACEHOLDER.sub("", text)).strip()


def _published(meta: dict[str, Any]) -> str:
    versions = meta.get("versions") or []
    created = versions[0].get("created") if versions and isinstance(versions[0], dict) else None
    if created:
        try:
            return parsedate_to_datetime(created).date().isoformat()
        except (TypeError, ValueError):
            pass
    update = meta.get("update_date")
    return update if isinstance(update, str) and re.match(r"^\d{4}-\d\d-\d\d$", update) else ""


def _authors(meta: dict[str, Any]) -> list[str]:
    parsed = meta.get("authors_parsed")
    if isinstance(parsed, list) and parsed:
        names = [" ".join(p for p in (row[1], row[0]) if p) for row in parsed if len(row) >= 2]
        return [_text(n) for n in names if n]
    raw = meta.get("authors")
    return (
        [_text(a) for a in re.split(r",|\band\b", raw) if a.strip()] if isinstance(raw, str) else []
    )


def parse_record(record: Any, where: str) -> tuple[Paper, Paragraphs]:
    """One unarXive object -> (Paper, [(section, text)]); IngestError if fields are missing."""
    if not isinstance(record, dict):
        raise IngestError(f"{where}: expected a JSON object, got {type(record).__name__}")
    paper_id, body = record.get("paper_id"), record.get("body_text")
    if not isinstance(paper_id, str) or not paper_id.strip():
        raise IngestError(f"{where}: missing field 'paper_id'")
    if not isinstance(body, list):
        raise IngestError(f"{where}: missing field 'body_text' (paper {paper_id})")
    meta = record.get("metadata") if isinstance(record.get("metadata"), dict) else {}
    abstract = record.get("abstract")
    abstract_text = _text(abstract.get("text") if isinstance(abstract, dict) else abstract)
    abstract_text = abstract_text or _text(meta.get("abstract"))
    paper = Paper(
        arxiv_id=clean_extracted_text(paper_id.strip()),
        title=_text(meta.get("title")) or paper_id,
        authors=_authors(meta),
        published=_published(meta),
        categories=(meta.get("categories") or "").split()
        if isinstance(meta.get("categories"), str)
        else [],
        abstract=abstract_text,
        url=f"https://arxiv.org/abs/{paper_id.strip()}",
        source="unarxive",
    )
    paragraphs: Paragraphs = [("Abstract", abstract_text)] if abstract_text else []
    for item in body:
        if isinstance(item, dict):
            text = _text(item.get("text"))
            if text:
                paragraphs.append((_text(item.get("section")), text))
    if not paragraphs:
        raise IngestError(f"{where}: paper {paper_id} has no text")
    return paper, paragraphs


def _open_lines(path: Path) -> Iterator[tuple[str, IO[bytes]]]:
    """(name, binary stream) of every JSONL inside `path`."""
    name = path.name.lower()
    if name.endswith((".tar.gz", ".tgz")):
        with tarfile.open(path, "r:gz") as tar:
            for member in tar:
                if member.isfile() and member.name.endswith((".jsonl", ".jsonl.gz")):
                    stream = tar.extractfile(member)
                    if stream is not None:
                        if member.name.endswith(".gz"):
                            stream = gzip.GzipFile(fileobj=stream)
                        yield f"{path}:{member.name}", stream
    elif name.endswith(".gz"):
        with gzip.open(path, "rb") as stream:
            yield str(path), stream
    else:
        with open(path, "rb") as stream:
            yield str(path), stream


def read_unarxive(
    path: str | Path, on_error: Callable[[IngestError], None] | None = None
) -> Iterator[tuple[Paper, Paragraphs]]:
    """Yield (Paper, paragraphs) per line of an unarXive file.

    A bad line raises IngestError naming file and line, unless `on_error` is given: then the
    error is passed to it and reading goes on with the next line.
    """
    path = Path(path)
    if not path.is_file():
        raise IngestError(f"{path}: no such file")
    try:
        for name, stream in _open_lines(path):
            for number, raw in enumerate(stream, start=1):
                if not raw.strip():
                    continue
                where = f"{name}, line {number}"
                try:
                    try:
                        record = json.loads(raw.decode("utf-8", "replace"))
                    except ValueError as exc:
                        raise IngestError(f"{where}: not valid JSON ({exc})") from None
                    item = parse_record(record, where)
                except IngestError as exc:
                    if on_error is None:
                        raise
                    on_error(exc)
                    continue
                yield item
    except (OSError, tarfile.TarError, EOFError) as exc:
        raise IngestError(f"{path}: cannot read the file ({exc})") from exc
